"""The transfer figure of docs/finetuning.md, end to end: pre-train the four tiny models until
their held-out loss is flat, then fine-tune each in every mode, labelled-set size and seed.

    python scripts/transfer_figure.py --workdir runs/figure   # its time: docs/finetuning.md
    python scripts/transfer_figure.py --workdir runs/figure --seeds 0,1 --sizes 100,0

Per model (configs/tiny_<name>.py): `pretrain-jax train` for its --pretrain_steps (held-out loss
every 200 steps, so the JSON shows where it flattens), then `pretrain-jax transfer --init` it on
word_order in modes scratch / linear_probe / full / lora (T5: no probe) for every --sizes and
--seeds, with the recipe of FINETUNE (flags after the script's own go to every transfer call,
e.g. --config.train.steps=200). `--parallel` models run at once, one process each (a tiny
model's step keeps about two cores busy, so two at once gain little on 2 cores: while one
compiles, reads data or evaluates, the other's steps use the cores). Rerunning resumes and
reuses finished runs. Writes <workdir>/compare/comparison.png and comparison.json (every
number drawn, the pre-training curves, wall and CPU times) and prints one JSON line.
"""
import argparse
import concurrent.futures
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pretrain_jax.finetune import figures, transfer  # noqa: E402

MODELS = ('t5', 'gpt', 'prefix_lm', 'bert')   # the longest first, for --parallel
# Steps where each model's held-out loss has flattened on the embedded corpus (docs/finetuning.md:
# BERT's MLM loss still falls slowly to 1,600; GPT's is lowest near 1,200, then rises).
PRETRAIN_STEPS = {'bert': 1600, 'gpt': 1200, 'prefix_lm': 1200, 't5': 1200}
FINETUNE = ['--task', 'word_order', '--config.data.seq_len=64', '--config.train.steps=100',
            '--config.train.warmup_steps=10', '--config.train.eval_every=25',
            '--config.train.learning_rate=1e-3',
            '--config.probe_learning_rate=3e-3', '--config.lora.learning_rate=3e-3',
            '--config.model.dropout_rate=0.1']
NAMES = {'bert': 'BERT', 'gpt': 'GPT', 'prefix_lm': 'prefix LM', 't5': 'T5'}


def say(text: str) -> None:
  print(text, file=sys.stderr, flush=True)


def command(name: str, *args) -> list:
  return [sys.executable, '-m', 'pretrain_jax', name, *map(str, args)]


def run(argv: list, log: str) -> tuple:
  """Runs `argv`, its stderr into `log`; returns (its last stdout line: the command's JSON, its
  CPU seconds, user + system)."""
  with open(log, 'a', encoding='utf-8') as err, \
      subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True) as proc:
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
  if proc.returncode:
    raise RuntimeError(f'{" ".join(argv[2:])} exited with {proc.returncode}; see {log}')
  return out.strip().splitlines()[-1], usage.ru_utime + usage.ru_stime


def eval_curve(workdir: str) -> list:
  """[(step, held-out loss)] of a pre-training workdir's metrics.jsonl."""
  out = {}
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    for record in map(json.loads, f):
      if record.get('split') == 'eval':
        out[record['step']] = record['loss']
  return sorted(out.items())


def chain(model: str, steps: int, args, extra: list) -> dict:
  """Pre-train `model`, then its transfer runs; returns their rows, curve and wall times."""
  root = os.path.abspath(args.workdir)
  pretrained = os.path.join(root, 'pretrain', model)
  log = os.path.join(root, 'logs', f'{model}.log')
  start = time.perf_counter()
  say(f'{model}: pre-training {steps} steps ({log})')
  _, pretrain_cpu = run(command('train', '--config', f'tiny_{model}', '--workdir', pretrained,
              f'--config.train.steps={steps}', '--config.train.eval_every=200',
              '--config.train.eval_batches=0', f'--config.train.checkpoint_every={steps}',
              '--config.train.keep_checkpoints=1'), log)
  middle = time.perf_counter()
  say(f'{model}: pre-trained in {middle - start:.0f} s; fine-tuning')
  line, finetune_cpu = run(command('transfer', '--init', pretrained, '--workdir',
                     os.path.join(root, 'compare', model), '--sizes', args.sizes, '--seeds',
                     args.seeds, *FINETUNE, *extra), log)
  rows = json.loads(line)['runs']
  for row in rows:
    row['checkpoint'] = NAMES[model]
  say(f'{model}: {len(rows)} fine-tuning runs in {time.perf_counter() - middle:.0f} s')
  return {'model': model, 'rows': rows, 'pretrain_steps': steps,
          'pretrain_curve': eval_curve(pretrained), 'pretrain_sec': middle - start,
          'finetune_sec': time.perf_counter() - middle, 'pretrain_cpu_sec': pretrain_cpu,
          'finetune_cpu_sec': finetune_cpu}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--workdir', default='runs/figure')
  parser.add_argument('--models', default=','.join(MODELS))
  parser.add_argument('--pretrain_steps', default='',
                      help='name=steps,... overriding ' + str(PRETRAIN_STEPS))
  parser.add_argument('--sizes', default='100,300,0')
  parser.add_argument('--seeds', default='0,1,2')
  parser.add_argument('--parallel', type=int, default=2)
  args, extra = parser.parse_known_args()
  models = [m for m in args.models.split(',') if m]
  unknown = [m for m in models if m not in MODELS]
  if unknown:
    parser.error(f'--models {unknown}; expected names of {MODELS}')
  steps = dict(PRETRAIN_STEPS, **{k: int(v) for k, v in (
      pair.split('=') for pair in args.pretrain_steps.split(',') if pair)})
  os.makedirs(os.path.join(args.workdir, 'logs'), exist_ok=True)
  start = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(max(args.parallel, 1)) as pool:
    done = list(pool.map(lambda m: chain(m, steps[m], args, extra), models))
  wall = time.perf_counter() - start
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  rows = [row for d in done for row in d['rows']]
  order = {NAMES[m]: i for i, m in enumerate(('bert', 'gpt', 'prefix_lm', 't5'))}
  rows.sort(key=lambda r: order[r['checkpoint']])
  compare = os.path.join(args.workdir, 'compare')
  seeds = len(args.seeds.split(','))
  title = (f'tiny {", ".join(NAMES[m] for m in sorted(models, key=lambda m: order[NAMES[m]]))}'
           f' on word_order: mean +- standard error over {seeds} seeds')
  with contextlib.redirect_stdout(io.StringIO()):   # (its JSON line: this script's is below)
    result = transfer.report(rows, compare, title, init=','.join(models), task='word_order')
  protocol = {'wall_sec': wall, 'cpu_sec': usage.ru_utime + usage.ru_stime,
              'parallel': args.parallel, 'finetune_flags': FINETUNE + extra,
              'models': {d['model']: {k: v for k, v in d.items() if k not in ('model', 'rows')}
                         for d in done}}
  path = figures.data_path(result['comparison_png'])
  with open(path, encoding='utf-8') as f:
    data = json.load(f)
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(dict(data, protocol=protocol), f, indent=1)
  say(f'done in {wall / 60:.1f} min ({protocol["cpu_sec"] / 60:.1f} CPU min): '
      f'{result["comparison_png"]}, {path}')
  print(json.dumps({'png': result['comparison_png'], 'json': path, 'wall_sec': round(wall, 1),
                    'cpu_sec': round(protocol['cpu_sec'], 1)}))


if __name__ == '__main__':
  main()
