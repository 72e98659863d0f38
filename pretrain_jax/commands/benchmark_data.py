"""Throughput of the input pipeline alone (no model), one JSON line per objective.

  pretrain-jax benchmark_data [--seq_len 128 --batch_size 16 --batches 1000]
      [--files 'data/*.jsonl' | --tfds_name c4/en:3.1.0 --tfds_data_dir gs://...]
      [--tokenizer path.model] [--objectives clm,mlm,nsp,span_corruption]

Each line: objective, tokens_per_s (positions of the encoder/input rows per second, this host),
real_tokens_per_s (non-padding ones), real_fraction, batches, seconds, warmup_s (start-up:
opening the source, the first sentencepiece calls). Warm-up batches are not timed.
"""
import os
import sys
import time

from pretrain_jax import cli, data
from pretrain_jax.cli import terminal
from pretrain_jax.data.config import OBJECTIVES, DataConfig


def _run(argv=None):
  p = cli.argument_parser(__doc__.split('\n')[0])
  p.add_argument('--seq_len', type=int, default=128)
  p.add_argument('--batch_size', type=int, default=16, help='rows per host')
  p.add_argument('--batches', type=int, default=1000, help='timed batches per objective')
  p.add_argument('--warmup', type=int, default=20)
  p.add_argument('--objectives', default='clm,mlm,nsp,span_corruption')
  p.add_argument('--files', default='')
  p.add_argument('--tfds_name', default='')
  p.add_argument('--tfds_data_dir', default='')
  p.add_argument('--tokenizer', default='')
  p.add_argument('--split', default='train')
  p.add_argument('--verbose', action='store_true', help='library logs and full tracebacks')
  args = p.parse_args(None if argv is None else argv[1:])
  for name, least in (('seq_len', 2), ('batch_size', 1), ('batches', 1), ('warmup', 0)):
    if getattr(args, name) < least:
      p.error(f'--{name}={getattr(args, name)}; expected an integer >= {least}')

  from pretrain_jax.data import local_builder  # noqa: PLC0415 (TensorFlow)
  if args.files:
    local_builder.expand_files(args.files, name='--files')   # errors name the flag
  known = sorted(OBJECTIVES + ('nsp',))   # nsp: mlm with next-sentence pairs
  unknown = [name for name in args.objectives.split(',') if name not in known]
  if unknown:
    p.error(f'--objectives={args.objectives}: {", ".join(map(repr, unknown))}; expected a '
            f'comma-separated list of {", ".join(known)}')
  for name in args.objectives.split(','):
    objective = 'mlm' if name == 'nsp' else name
    dc = DataConfig(objective=objective, seq_len=args.seq_len, nsp=name == 'nsp',
                    files=args.files, tfds_name=args.tfds_name,
                    tfds_data_dir=args.tfds_data_dir, tokenizer=args.tokenizer)
    tok = data.load_tokenizer(dc)
    start = time.time()
    it = data.make_dataset(dc, tok, split=args.split, batch_size=args.batch_size)
    for _ in range(args.warmup):
      next(it)
    first = time.time() - start
    positions = real = 0
    start = time.time()
    for _ in range(args.batches):
      batch = next(it)
      seg = batch.get('segment_ids', batch.get('encoder_segment_ids'))
      positions += seg.size
      real += int((seg > 0).sum())
    seconds = time.time() - start
    it.close()
    print(terminal.dumps({'objective': name, 'seq_len': args.seq_len,
                      'batch_size': args.batch_size, 'tokens_per_s': round(positions / seconds),
                      'real_tokens_per_s': round(real / seconds),
                      'real_fraction': round(real / positions, 4), 'batches': args.batches,
                      'seconds': round(seconds, 3), 'warmup_s': round(first, 3),
                      'cpus': os.cpu_count()}), flush=True)


def main(argv=None) -> None:
  argv = sys.argv if argv is None else argv
  cli.call(_run, argv, verbose='--verbose' in argv)


if __name__ == '__main__':
  main()
