"""The transfer comparison: scratch vs linear_probe vs full on one task, as a table and curves.

Each (mode, labelled-set size) run is an ordinary fine-tuning workdir
`<root>/<mode>[_n<size>]` (rerunning resumes / reuses finished runs); wall time is measured
around each run.
"""
import time

import ml_collections

from pretrain_jax import paths
from pretrain_jax.finetune import run as run_lib


def run_name(mode: str, size: int) -> str:
  return f'{mode}_n{size}' if size else mode


def run_transfer(config, root: str, modes=(), sizes=(0,)) -> list:
  """One fine-tuning run per (size, mode); returns a row per run (see `table`). No `modes`:
  every mode the family has (T5, text to text, has no head to probe: scratch and full)."""
  rows, auto = [], not modes
  for size in sizes:
    for mode in (modes or ('scratch', 'linear_probe', 'full')):
      if auto and mode == 'linear_probe' and rows and rows[-1]['family'] == 't5':
        continue
      c = ml_collections.ConfigDict(config.to_dict())
      c.mode, c.task.max_train_examples = mode, int(size)
      workdir = paths.join(root, run_name(mode, size))
      start = time.perf_counter()
      result = run_lib.finetune(c, workdir)
      rows.append({'mode': mode, 'size': size or result['train_examples'],
                   'metric': result['metric'], 'final': result['final'], 'best': result['best'],
                   'steps': result['step'], 'wall_sec': time.perf_counter() - start,
                   'step_time_sec': result['step_time_sec'], 'workdir': workdir,
                   'family': result['family']})
  return rows


def table(rows: list) -> str:
  header = (f'{"mode":<13} {"examples":>8} {"metric":<15} {"final":>6} {"best":>6} '
            f'{"steps":>6} {"wall s":>7} {"step ms":>8}')
  lines = [header, '-' * len(header)]
  fmt = lambda v, spec: '-' if v is None else format(v, spec)
  for r in rows:
    lines.append(f'{r["mode"]:<13} {r["size"]:>8} {r["metric"]:<15} {fmt(r["final"], ".3f"):>6} '
                 f'{fmt(r["best"], ".3f"):>6} {r["steps"]:>6} {r["wall_sec"]:>7.1f} '
                 f'{fmt(r["step_time_sec"] and 1000 * r["step_time_sec"], ".1f"):>8}')
  return '\n'.join(lines)


def plot(rows: list, path: str, title: str = '') -> str:
  """Training loss (left) and the validation metric (right) against step, one line per run."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
  colors = {'scratch': 'tab:gray', 'linear_probe': 'tab:blue', 'full': 'tab:red'}
  sizes = sorted({r['size'] for r in rows})
  styles = dict(zip(sizes, ['-', '--', ':', '-.'] * 4))
  for r in rows:
    curves = run_lib.read_curves(r['workdir'])
    label = r['mode'] + (f' (n={r["size"]})' if len(sizes) > 1 else '')
    style = dict(color=colors.get(r['mode']), linestyle=styles[r['size']], label=label)
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
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
