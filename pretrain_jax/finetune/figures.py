"""The chapter's comparison in one picture: fine-tuning curves of several checkpoints.

`comparison_figure(rows)` takes transfer's rows (transfer.run_comparison: BERT, GPT, T5, a
prefix LM ... on one task, each in its modes and labelled-set sizes) and draws two panels:

  left   the validation metric against the fine-tuning step, at the largest labelled set
  right  the final validation metric against the number of labelled examples trained on

with ONE line per (checkpoint, mode, format), the mean over its seeds: a colour per
checkpoint, full fine-tuning solid, a linear probe dotted, the from-scratch baseline dashed,
and a triangle marker for GPT's generation format (a circle for the head / text to text).
"""
import io
import statistics

from pretrain_jax import paths
from pretrain_jax.finetune import run as run_lib

STYLES = {'full': '-', 'linear_probe': ':', 'scratch': '--'}
MARKERS = {'head': 'o', 'generation': '^'}


def _key(row: dict) -> tuple:
  return row.get('checkpoint', ''), row['mode'], row.get('format', 'head')


def line_name(key: tuple) -> str:
  """'gpt full', 'gpt full (gen)', 'scratch' for rows without a checkpoint name."""
  checkpoint, mode, fmt = key
  return ' '.join(p for p in (checkpoint, mode) if p) + (' (gen)' if fmt == 'generation' else '')


def _mean_curve(rows: list) -> list:
  """[(step, mean metric over the runs that evaluated at that step)] of `rows` (seeds)."""
  by_step = {}
  for r in rows:
    for record in run_lib.read_curves(r['workdir'])['eval']:
      if record.get(r['metric']) is not None:
        by_step.setdefault(record['step'], []).append(record[r['metric']])
  return [(step, statistics.fmean(v)) for step, v in sorted(by_step.items())]


def comparison_figure(rows: list, title: str = ''):
  """The matplotlib Figure (Agg) of `rows`; its two axes hold one line per (checkpoint, mode,
  format) each, labelled line_name(key)."""
  import matplotlib  # noqa: PLC0415 (matplotlib: plots only)
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # noqa: PLC0415 (matplotlib: plots only)
  rows = [r for r in rows if not r.get('preempted')]
  fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
  checkpoints = list(dict.fromkeys(r.get('checkpoint', '') for r in rows))
  colors = {c: f'C{i % 10}' for i, c in enumerate(checkpoints)}
  keys = list(dict.fromkeys(_key(r) for r in rows))
  for key in keys:
    runs = [r for r in rows if _key(r) == key]
    style = dict(color=colors[key[0]], linestyle=STYLES.get(key[1], '-.'),
                 marker=MARKERS.get(key[2], 's'), markersize=4, label=line_name(key))
    largest = max(r['size'] for r in runs)
    curve = _mean_curve([r for r in runs if r['size'] == largest])
    left.plot([s for s, _ in curve], [v for _, v in curve], **style)
    sizes = sorted({r['size'] for r in runs})
    finals = [statistics.fmean(v) if v else float('nan') for v in (
        [r['final'] for r in runs if r['size'] == n and r['final'] is not None] for n in sizes)]
    right.plot(sizes, finals, **style)
  metric = ', '.join(dict.fromkeys(r['metric'] for r in rows))
  left.set(title=f'validation {metric} against step (largest labelled set)', xlabel='step',
           ylabel=metric)
  right.set(title=f'final validation {metric} against labelled examples',
            xlabel='labelled training examples', ylabel=metric)
  sizes = [r['size'] for r in rows]
  if sizes and max(sizes) > 10 * max(min(sizes), 1):
    right.set_xscale('log')
  for ax in (left, right):
    if metric.endswith('accuracy'):
      ax.axhline(0.5, color='black', linewidth=0.5, linestyle=':')
    ax.grid(alpha=0.3)
  right.legend(fontsize=8, loc='upper left', bbox_to_anchor=(1.02, 1.0))   # beside the axes
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  return fig


def plot_comparison(rows: list, path: str, title: str = '') -> str:
  """comparison_figure(rows) as a PNG at `path` (local or gs://); returns `path`."""
  import matplotlib.pyplot as plt  # noqa: PLC0415 (matplotlib: plots only)
  fig = comparison_figure(rows, title)
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=90)   # matplotlib opens local files only
  plt.close(fig)
  paths.write_atomic(path, png.getvalue())
  return str(path)
