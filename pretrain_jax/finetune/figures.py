"""The chapter's comparison in one picture: fine-tuning curves of several checkpoints.

`comparison_figure(rows)` takes transfer's rows (transfer.run_comparison: BERT, GPT, T5, a
prefix LM ... on one task, each in its modes and labelled-set sizes) and draws two panels:

  left   the validation metric against the fine-tuning step, at the largest labelled set
  right  the final validation metric against the number of labelled examples trained on

with ONE line per (checkpoint, mode, format), the mean over its seeds, in a band of one
standard error of that mean (seeds >= 2): a colour per checkpoint, full fine-tuning solid, a
linear probe dotted, LoRA dash-dotted, the from-scratch baseline dashed, and a triangle marker
for GPT's generation format (a circle for the head / text to text). `figure_data(rows)` is
every number drawn (transfer.report writes it as JSON beside the PNG).
"""
import io
import json
import statistics

from pretrain_jax import paths
from pretrain_jax.finetune import run as run_lib

STYLES = {'full': '-', 'linear_probe': ':', 'scratch': '--', 'lora': '-.'}
MARKERS = {'head': 'o', 'generation': '^'}


def _key(row: dict) -> tuple:
  return row.get('checkpoint', ''), row['mode'], row.get('format', 'head')


def line_name(key: tuple) -> str:
  """'gpt full', 'gpt full (gen)', 'scratch' for rows without a checkpoint name."""
  checkpoint, mode, fmt = key
  return ' '.join(p for p in (checkpoint, mode) if p) + (' (gen)' if fmt == 'generation' else '')


def legend_label(line: dict) -> str:
  """A line's name, with its trainable parameters and mean step time where the runs have
  them: 'BERT lora (54k trained, 160 ms/step)'."""
  parts = []
  count = line.get('trainable_params')
  if count:
    # (a line's count is the mean over its runs: a float)
    parts.append(f'{count / 1000:,.0f}k trained' if count >= 10_000 else f'{count:,.0f} trained')
  if line.get('step_time_sec'):
    parts.append(f'{1000 * line["step_time_sec"]:.0f} ms/step')
  return line['label'] + (f' ({", ".join(parts)})' if parts else '')


def mean_se(values: list) -> tuple:
  """(mean, standard error of the mean: stdev / sqrt(n), 0 for one value) of `values`."""
  if not values:
    return float('nan'), float('nan')
  se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
  return statistics.fmean(values), se


def _mean_curve(rows: list) -> list:
  """[(step, mean, standard error, runs)] over the runs of `rows` (seeds) that evaluated at
  each step."""
  by_step = {}
  for r in rows:
    for record in run_lib.read_curves(r['workdir'])['eval']:
      if record.get(r['metric']) is not None:
        by_step.setdefault(record['step'], []).append(record[r['metric']])
  return [(step, *mean_se(v), len(v)) for step, v in sorted(by_step.items())]


def _mean_of(runs: list, key: str):
  values = [r[key] for r in runs if r.get(key) is not None]
  return statistics.fmean(values) if values else None


def figure_data(rows: list) -> dict:
  """Every number comparison_figure draws: per (checkpoint, mode, format) line, its final
  metric per labelled-set size (each seed's, their mean and standard error) and its curve at
  the largest size (mean and standard error per step), with its trainable and total
  parameters and mean step time."""
  rows = [r for r in rows if not r.get('preempted')]
  lines = []
  for key in dict.fromkeys(_key(r) for r in rows):
    runs = [r for r in rows if _key(r) == key]
    by_size = []
    for size in sorted({r['size'] for r in runs}):
      finals = [r['final'] for r in runs if r['size'] == size and r['final'] is not None]
      seeds = [r['seed'] for r in runs if r['size'] == size and r['final'] is not None]
      mean, se = mean_se(finals)
      by_size.append({'size': size, 'seeds': seeds, 'finals': finals, 'mean': mean, 'se': se})
    largest = max(r['size'] for r in runs)
    curve = _mean_curve([r for r in runs if r['size'] == largest])
    lines.append({'checkpoint': key[0], 'mode': key[1], 'format': key[2],
                  'label': line_name(key), 'by_size': by_size,
                  'curve': {'size': largest, 'step': [c[0] for c in curve],
                            'mean': [c[1] for c in curve], 'se': [c[2] for c in curve],
                            'runs': [c[3] for c in curve]},
                  'trainable_params': _mean_of(runs, 'trainable_params'),
                  'total_params': _mean_of(runs, 'total_params'),
                  'step_time_sec': _mean_of(runs, 'step_time_sec')})
  return {'metric': ', '.join(dict.fromkeys(r['metric'] for r in rows)), 'lines': lines}


def _band(ax, xs, means, ses, style):
  """The mean's line, and a band of one standard error where there is one."""
  ax.plot(xs, means, **style)
  if any(se > 0 for se in ses):
    ax.fill_between(xs, [m - s for m, s in zip(means, ses, strict=True)],
                    [m + s for m, s in zip(means, ses, strict=True)], color=style['color'],
                    alpha=0.15, linewidth=0)


def comparison_figure(rows: list, title: str = ''):
  """The matplotlib Figure (Agg) of `rows`; its two axes hold one line per (checkpoint, mode,
  format) each, labelled line_name(key) (plus its trainable parameters and step time:
  legend_label), in a band of +- one standard error over the seeds."""
  import matplotlib  # noqa: PLC0415 (matplotlib: plots only)
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # noqa: PLC0415 (matplotlib: plots only)
  data = figure_data(rows)
  fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
  checkpoints = list(dict.fromkeys(line['checkpoint'] for line in data['lines']))
  colors = {c: f'C{i % 10}' for i, c in enumerate(checkpoints)}
  for line in data['lines']:
    style = dict(color=colors[line['checkpoint']], linestyle=STYLES.get(line['mode'], '-.'),
                 marker=MARKERS.get(line['format'], 's'), markersize=4,
                 label=legend_label(line))
    curve = line['curve']
    _band(left, curve['step'], curve['mean'], curve['se'], style)
    sizes = line['by_size']
    _band(right, [s['size'] for s in sizes], [s['mean'] for s in sizes],
          [s['se'] for s in sizes], style)
  metric = data['metric']
  seeds = sorted({len(s['finals']) for line in data['lines'] for s in line['by_size']})
  band = '\nmean +- standard error over seeds' if seeds and seeds[-1] > 1 else ''
  # two short lines each: the panels sit side by side and longer titles run into each other
  left.set_title(f'validation {metric} against step (largest labelled set){band}', fontsize=10)
  left.set(xlabel='step', ylabel=metric)
  right.set_title(f'final validation {metric} against labelled examples{band}', fontsize=10)
  right.set(xlabel='labelled training examples', ylabel=metric)
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
  """comparison_figure(rows) as a PNG at `path` (local or gs://), and figure_data(rows) as JSON
  beside it (`path` with .json for .png); returns `path`."""
  import matplotlib.pyplot as plt  # noqa: PLC0415 (matplotlib: plots only)
  fig = comparison_figure(rows, title)
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=90)   # matplotlib opens local files only
  plt.close(fig)
  paths.write_atomic(path, png.getvalue())
  paths.write_atomic(data_path(path), json.dumps(dict(figure_data(rows), title=title), indent=1))
  return str(path)


def data_path(png: str) -> str:
  """Where plot_comparison writes the figure's numbers: <name>.json beside <name>.png."""
  png = str(png)
  return (png[:-4] if png.endswith('.png') else png) + '.json'
