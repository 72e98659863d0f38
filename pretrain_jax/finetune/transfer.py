"""The transfer comparison: scratch vs linear_probe vs full on one task, as a table and curves.

Each (mode, labelled-set size, seed) run is an ordinary fine-tuning workdir
`<root>/<mode>[_n<size>][_s<seed>]` (rerunning resumes / reuses finished runs); wall time is
measured around each run. Several seeds (`train.seed`: the head's init, scratch's whole init,
dropout; the task and its example order stay) give each (mode, size) a mean and a range: on a
validation set of a few hundred examples one seed's margin can be noise.
"""
import json
import statistics
import sys
import time

import ml_collections

from pretrain_jax import paths
from pretrain_jax.finetune import run as run_lib
from pretrain_jax.finetune.config import FinetuneConfig
from pretrain_jax.models import family_of


def run_name(mode: str, size: int, seed=None) -> str:
  return mode + (f'_n{size}' if size else '') + ('' if seed is None else f'_s{seed}')


def run_transfer(config, root: str, modes=(), sizes=(0,), seeds=()) -> list:
  """One fine-tuning run per (size, mode, seed); returns a row per run (see `table`). No
  `modes`: every mode the family has (T5, text to text, has no head to probe: scratch and
  full). No `seeds`: the config's train.seed, in a workdir without the seed suffix.
  A run stopped by SIGTERM (preemption) or Ctrl-C is the last (its row has `preempted` True
  unless it had reached its last step), and rerunning the same command resumes it and runs the
  rest."""
  for size in sizes:   # before the first run: a bad size or config fails at once
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
      raise ValueError(f'sizes {list(sizes)}: {size!r}; expected 0 (all examples) or a '
                       'positive count of training examples')
  for name, values in (('sizes', sizes), ('modes', modes), ('seeds', seeds)):
    if len(set(values)) != len(values):   # one run would count twice
      raise ValueError(f'{name} {list(values)}: expected distinct values')
  for mode in modes or ('full',):
    c = ml_collections.ConfigDict(config.to_dict())
    c.mode = mode
    ft = FinetuneConfig.from_config(c)
  init, task = run_lib.load_init(ft.init), run_lib.load_task(ft)
  if not modes:   # a family without a classification head has none to probe
    modes = (('scratch', 'linear_probe', 'full') if family_of(init.model_config).classifier
             else ('scratch', 'full'))
  for mode in modes:   # what the checkpoint and the task refuse, also before the first run
    c = ml_collections.ConfigDict(config.to_dict())
    c.mode = mode
    run_lib.build_config(c, init, task)
  rows = []
  for size in sizes:
    for mode in modes:
      for seed in (seeds or (None,)):
        c = ml_collections.ConfigDict(config.to_dict())
        c.mode, c.task.max_train_examples = mode, int(size)
        if seed is not None:
          c.train.seed = int(seed)
        workdir = paths.join(root, run_name(mode, size, seed))
        start = time.perf_counter()
        result = run_lib.finetune(c, workdir, init, task)
        if size > result['train_examples']:
          print(f'warning: size {size} is more than the task\'s {result["train_examples"]} '
                f'training examples; {workdir} trained on all of them', file=sys.stderr)
        rows.append({'mode': mode, 'size': result['train_examples'], 'requested_size': size,
                     'seed': c.train.seed, 'metric': result['metric'], 'final': result['final'],
                     'best': result['best'], 'steps': result['step'],
                     'wall_sec': time.perf_counter() - start,
                     'step_time_sec': result['step_time_sec'], 'workdir': workdir,
                     'family': result['family'], 'preempted': bool(result.get('preempted'))})
        if result.get('stop_requested'):   # SIGTERM or Ctrl-C, also in a run's last step
          print(f'stopped after {workdir} saved step {result["step"]}; the same command '
                'resumes it and runs the rest', file=sys.stderr, flush=True)
          return rows
  return rows


def summarize(rows: list) -> list:
  """One row per (mode, size asked for) over its seeds: the mean, min and max of `final` and
  `best`, and the seeds' count, in the order the runs came. `size` is the examples trained on.
  A preempted run (cut short by SIGTERM) counts in none."""
  groups = {}
  for r in rows:
    if r.get('preempted'):   # cut short: its numbers are no result
      continue
    groups.setdefault((r['mode'], r.get('requested_size', r['size'])), []).append(r)
  out = []
  for (mode, requested), runs in groups.items():
    row = {'mode': mode, 'size': runs[0]['size'], 'requested_size': requested,
           'metric': runs[0]['metric'], 'seeds': len(runs)}
    for key in ('final', 'best'):
      values = [r[key] for r in runs if r[key] is not None]
      row[key] = statistics.fmean(values) if values else None
      row[key + '_range'] = (min(values), max(values)) if values else None
    out.append(row)
  return out


def _examples(row: dict) -> str:
  """The examples trained on, and the size asked for when it was more ('300 (asked 1000)')."""
  asked = row.get('requested_size') or 0
  return f'{row["size"]}' + (f' (asked {asked})' if asked > row['size'] else '')


def table(rows: list) -> str:
  """A line per run; with several seeds, then a line per (mode, size): mean [min, max]."""
  header = (f'{"mode":<13} {"examples":>8} {"seed":>4} {"metric":<15} {"final":>6} {"best":>6} '
            f'{"steps":>6} {"wall s":>7} {"step ms":>8}')
  lines = [header, '-' * len(header)]
  fmt = lambda v, spec: '-' if v is None else format(v, spec)
  for r in rows:
    lines.append(f'{r["mode"]:<13} {_examples(r):>8} {r["seed"]:>4} {r["metric"]:<15} '
                 f'{fmt(r["final"], ".3f"):>6} {fmt(r["best"], ".3f"):>6} '
                 f'{str(r["steps"]) + ("*" if r.get("preempted") else ""):>6} '
                 f'{r["wall_sec"]:>7.1f} '
                 f'{fmt(r["step_time_sec"] and 1000 * r["step_time_sec"], ".1f"):>8}')
  if any(r.get('preempted') for r in rows):
    lines.append('* stopped (SIGTERM or Ctrl-C) before its last step: no result yet (rerun the '
                 'command)')
  summary = summarize(rows)
  if any(s['seeds'] > 1 for s in summary):
    span = lambda s, k: ('-' if s[k] is None else
                         f'{s[k]:.3f} [{s[k + "_range"][0]:.3f}, {s[k + "_range"][1]:.3f}]')
    lines += ['', f'{"mode":<13} {"examples":>8} {"seeds":>5}  {"final: mean [min, max]":<24} '
              'best: mean [min, max]']
    for s in summary:
      lines.append(f'{s["mode"]:<13} {_examples(s):>8} {s["seeds"]:>5}  {span(s, "final"):<24} '
                   f'{span(s, "best")}')
  return '\n'.join(lines)


def plot(rows: list, path: str, title: str = '') -> str:
  """Training loss (left) and the validation metric (right) against step, one line per run,
  as a PNG at `path` (local or gs://: written through the path layer); returns `path`."""
  import io  # pylint: disable=g-import-not-at-top
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
  colors = {'scratch': 'tab:gray', 'linear_probe': 'tab:blue', 'full': 'tab:red'}
  sizes = sorted({r['size'] for r in rows})
  styles = dict(zip(sizes, ['-', '--', ':', '-.'] * 4))
  labelled = set()
  for r in rows:
    curves = run_lib.read_curves(r['workdir'])
    label = r['mode'] + (f' (n={r["size"]})' if len(sizes) > 1 else '')
    style = dict(color=colors.get(r['mode']), linestyle=styles[r['size']],
                 label=None if label in labelled else label)   # one legend entry for all seeds
    labelled.add(label)
    train = [(x['step'], x['loss']) for x in curves['train'] if x.get('loss') is not None]
    val = [(x['step'], x[r['metric']]) for x in curves['eval'] if r['metric'] in x]
    if train:
      left.plot(*zip(*train), **style)
    if val:
      right.plot(*zip(*val), marker='o', markersize=3, **style)
  left.set(title='training loss', xlabel='step', ylabel='loss')
  metric = rows[0]['metric'] if rows else ''
  right.set(title=f'validation {metric}', xlabel='step', ylabel=metric)
  if metric.endswith('accuracy'):
    right.axhline(0.5, color='black', linewidth=0.5, linestyle=':')
  for ax in (left, right):
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=100)   # matplotlib opens local files only
  plt.close(fig)
  paths.write_bytes(path, png.getvalue())
  return str(path)


def report(rows: list, root: str, title: str = '', **fields) -> dict:
  """After the runs: the table on stderr, then <root>/transfer.png, then one JSON line on
  stdout ({**fields, png, runs, summary}; png None if the plot failed). A failed plot is raised
  after the JSON line: it never costs the summary of runs already done."""
  print(table(rows), file=sys.stderr, flush=True)
  png, failed = paths.join(root, 'transfer.png'), None
  try:
    plot(rows, png, title)
  except Exception as e:  # pylint: disable=broad-except  (raised once the summary is out)
    png, failed = None, e
  result = dict(fields, png=png, runs=rows, summary=summarize(rows))
  print(json.dumps(result), flush=True)
  if failed is not None:
    raise failed
  return result
