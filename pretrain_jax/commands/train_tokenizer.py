r"""Train a SentencePiece tokenizer (T5 sentinels last, BERT specials, size a multiple of 128).

  pretrain-jax train_tokenizer --output /tmp/pydoc.model               # embedded corpus
  pretrain-jax train_tokenizer --output c4.model --vocab_size 32000 \
      --tfds_name c4/en:3.1.0 --tfds_data_dir gs://my-bucket/tensorflow_datasets
  pretrain-jax train_tokenizer --output mine.model --files 'data/*.jsonl.gz' --type bpe

Layout: 0 <pad>, 1 </s>, 2 <unk>, 3 [CLS], 4 [SEP], 5 [MASK], learned pieces, filler, then
▁<extra_id_99> ... ▁<extra_id_0> (the last id). Point config.data.tokenizer at the output.
Prints a summary (stderr), then one JSON line: path, vocab_size, pieces learned, characters
read, seconds.
"""
import sys
import time

from pretrain_jax import cli
from pretrain_jax.cli import terminal
from pretrain_jax.data import tokenizer
from pretrain_jax.data.config import DataConfig


def _run(argv=None):
  p = cli.argument_parser(__doc__.split('\n')[0])
  p.add_argument('--output', required=True, help='path of the .model file to write')
  p.add_argument('--type', default='unigram', choices=['unigram', 'bpe', 'char'])
  p.add_argument('--vocab_size', type=int, default=2048,
                 help='total size incl. specials and 100 sentinels; rounded up to 128s')
  p.add_argument('--files', default='', help='glob of C4-format .json/.jsonl/.json.gz/.txt')
  p.add_argument('--tfds_name', default='', help='named tfds dataset, e.g. c4/en:3.1.0')
  p.add_argument('--tfds_data_dir', default='', help='its data_dir (may be gs://...)')
  p.add_argument('--text_key', default='text', help='name of the text feature / JSON field')
  p.add_argument('--split', default='train')
  p.add_argument('--max_chars', type=int, default=20_000_000,
                 help='characters of text read at most (sentencepiece holds them in memory)')
  p.add_argument('--verbose', action='store_true', help='library logs and full tracebacks')
  args = p.parse_args(None if argv is None else argv[1:])

  from pretrain_jax.data import local_builder, sources  # noqa: PLC0415 (TensorFlow)
  if args.files:
    local_builder.expand_files(args.files, name='--files')   # errors name the flag
  dc = DataConfig(objective='clm', seq_len=128, files=args.files, tfds_name=args.tfds_name,
                  tfds_data_dir=args.tfds_data_dir, text_key=args.text_key)
  start, chars = time.time(), [0]

  def texts():
    for t in sources.iter_texts(dc, args.split, args.max_chars):
      chars[0] += len(t)
      yield t

  path = tokenizer.train_sentencepiece(texts(), args.output, vocab_size=args.vocab_size,
                                       model_type=args.type)
  tok = tokenizer.Tokenizer(path)
  learned, seconds = int((~tok.special).sum()), round(time.time() - start, 2)
  terminal.finish({'path': path, 'vocab_size': tok.vocab_size, 'type': args.type,
                   'learned_pieces': learned, 'chars': chars[0], 'seconds': seconds},
                  summary=[f'{path}: a {args.type} tokenizer of {tok.vocab_size:,} pieces '
                           f'({learned:,} learned) from {chars[0]:,} characters in {seconds:g} s'])


def main(argv=None) -> None:
  argv = sys.argv if argv is None else argv
  cli.call(_run, argv, verbose='--verbose' in argv)


if __name__ == '__main__':
  main()
