"""The transfer comparison: scratch vs linear_probe vs full vs lora on one task, as a table and
curves.

Each (mode, format, labelled-set size, seed) run is an ordinary fine-tuning workdir
`<root>/<mode>[_gen][_n<size>][_s<seed>]` (rerunning resumes / reuses finished runs; `_gen`:
task.format='generation'); wall time is measured around each run. Several seeds (`train.seed`:
the head's init, scratch's whole init, dropout; the task and its example order stay) give each
(mode, size) a mean, its standard error and a range: on a validation set of a few hundred
examples one seed's margin can be noise. Each row has its trainable and total parameters and its
mean step time. `run_comparison` does this for several checkpoints, each in
`<root>/<name>`, for one table and one figure (figures.py).
"""
import io
import json
import statistics
import sys
import time

import ml_collections
from etils import epath

from pretrain_jax import paths
from pretrain_jax.finetune import figures
from pretrain_jax.finetune import run as run_lib
from pretrain_jax.finetune.config import FinetuneConfig
from pretrain_jax.inference import scoring
from pretrain_jax.models import family_of


def run_name(mode: str, size: int, seed=None, fmt: str = 'head') -> str:
  return (mode + ('_gen' if fmt == 'generation' else '') + (f'_n{size}' if size else '')
          + ('' if seed is None else f'_s{seed}'))


def label(row: dict) -> str:
  """A run's mode, and its format where that is not the head: 'full', 'full (gen)'."""
  return row['mode'] + (' (gen)' if row.get('format', 'head') == 'generation' else '')


def run_transfer(config, root: str, modes=(), sizes=(0,), seeds=(), formats=(), task=None,
                 checkpoint: str = '') -> list:
  """One fine-tuning run per (size, format, mode, seed); returns a row per run (see `table`).
  No `modes`: every mode the family has (T5, text to text, has no head to probe: scratch,
  full and lora; neither has the generation format). No `seeds`: the config's train.seed, in
  a workdir without the seed suffix. No `formats`: the config's task.format. `task`: already loaded;
  `checkpoint`: the checkpoint's name in the rows (run_comparison).
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
  formats = tuple(formats) or (config.task.format,)
  if len(set(formats)) != len(formats):
    raise ValueError(f'formats {list(formats)}: expected distinct values')

  def variant(mode, fmt):
    c = ml_collections.ConfigDict(config.to_dict())
    c.mode, c.task.format = mode, fmt
    return c
  for mode in modes or ('full',):
    for fmt in formats:
      ft = FinetuneConfig.from_config(variant(mode, fmt))
  init, task = run_lib.load_init(ft.init), task or run_lib.load_task(ft)
  family = family_of(init.model_config)
  plan = [(fmt, mode) for fmt in formats for mode in modes or (
      ('scratch', 'linear_probe', 'full', 'lora') if family.classifier and fmt == 'head'
      else ('scratch', 'full', 'lora'))]   # a text-to-text family or format has no head to probe
  for fmt, mode in plan:   # what the checkpoint and the task refuse, also before the first run
    run_lib.build_config(variant(mode, fmt), init, task)
  rows = []
  for size in sizes:
    for fmt, mode in plan:
      for seed in (seeds or (None,)):
        c = variant(mode, fmt)
        c.task.max_train_examples = int(size)
        if seed is not None:
          c.train.seed = int(seed)
        workdir = str(epath.Path(root) / run_name(mode, size, seed, fmt))
        start = time.perf_counter()
        result = run_lib.finetune(c, workdir, init, task)
        if size > result['train_examples']:
          print(f'warning: size {size} is more than the task\'s {result["train_examples"]} '
                f'training examples; {workdir} trained on all of them', file=sys.stderr)
        rows.append({'checkpoint': checkpoint, 'mode': mode, 'format': fmt,
                     'size': result['train_examples'], 'requested_size': size,
                     'seed': c.train.seed, 'metric': result['metric'], 'final': result['final'],
                     'best': result['best'], 'steps': result['step'],
                     'wall_sec': time.perf_counter() - start,
                     'step_time_sec': result['step_time_sec'] or recorded_step_time(workdir),
                     'workdir': workdir,
                     'trainable_params': result.get('trainable_params'),
                     'total_params': result.get('total_params'),
                     'family': result['family'], 'preempted': bool(result.get('preempted'))})
        if result.get('stop_requested'):   # SIGTERM or Ctrl-C, also in a run's last step
          rows[-1]['stopped'] = True
          print(f'stopped after {workdir} saved step {result["step"]}; the same command '
                'resumes it and runs the rest', file=sys.stderr, flush=True)
          return rows
  return rows


def summarize(rows: list) -> list:
  """One row per (checkpoint, mode, format, size asked for) over its seeds: the mean, standard
  error of the mean (`_se`), min and max of `final` and `best`, the seeds' count, and the mean
  step time and trainable parameters, in the order the runs came. `size` is the examples
  trained on. A preempted run (cut short by SIGTERM) counts in none."""
  groups = {}
  for r in rows:
    if r.get('preempted'):   # cut short: its numbers are no result
      continue
    key = (r.get('checkpoint', ''), r['mode'], r.get('format', 'head'),
           r.get('requested_size', r['size']))
    groups.setdefault(key, []).append(r)
  out = []
  for (checkpoint, mode, fmt, requested), runs in groups.items():
    row = {'checkpoint': checkpoint, 'mode': mode, 'format': fmt, 'size': runs[0]['size'],
           'requested_size': requested, 'metric': runs[0]['metric'], 'seeds': len(runs)}
    for key in ('final', 'best'):
      values = [r[key] for r in runs if r[key] is not None]
      row[key] = statistics.fmean(values) if values else None
      row[key + '_se'] = (statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1
                          else 0.0 if values else None)
      row[key + '_range'] = (min(values), max(values)) if values else None
    for key in ('step_time_sec', 'trainable_params', 'total_params'):
      values = [r[key] for r in runs if r.get(key) is not None]
      row[key] = statistics.fmean(values) if values else None
    out.append(row)
  return out


def _examples(row: dict) -> str:
  """The examples trained on, and the size asked for when it was more ('300 (asked 1000)')."""
  asked = row.get('requested_size') or 0
  return f'{row["size"]}' + (f' (asked {asked})' if asked > row['size'] else '')


def recorded_step_time(workdir: str):
  """The step time (seconds) a finished run logged last, which is what its summary reported:
  a rerun that reuses it trains no step and measures none. None if it logged none."""
  times = [r['step_time_sec'] for r in run_lib.read_curves(workdir)['train']
           if r.get('step_time_sec')]
  return times[-1] if times else None


def table(rows: list) -> str:
  """A line per run (with its trainable parameters); with several seeds, then a line per (mode,
  size): mean +- standard error [min, max]. Runs of several checkpoints (run_comparison) get a
  first column naming theirs."""
  names = any(r.get('checkpoint') for r in rows)
  width = max([len(r.get('checkpoint', '')) for r in rows] + [10]) if names else 0
  def first(r):
    return f'{r.get("checkpoint", ""):<{width}} ' if names else ''
  header = (f'{"checkpoint":<{width}} ' if names else '') + (
      f'{"mode":<13} {"examples":>8} {"seed":>4} {"metric":<15} {"final":>6} {"best":>6} '
      f'{"steps":>6} {"wall s":>7} {"step ms":>8} {"trainable":>10}')
  lines = [header, '-' * len(header)]
  def fmt(v, spec):
    return '-' if v is None else format(v, spec)
  for r in rows:
    lines.append(f'{first(r)}{label(r):<13} {_examples(r):>8} {r["seed"]:>4} '
                 f'{r["metric"]:<15} {fmt(r["final"], ".3f"):>6} {fmt(r["best"], ".3f"):>6} '
                 f'{str(r["steps"]) + ("*" if r.get("preempted") else ""):>6} '
                 f'{r["wall_sec"]:>7.1f} '
                 f'{fmt(r["step_time_sec"] and 1000 * r["step_time_sec"], ".1f"):>8} '
                 f'{fmt(r.get("trainable_params"), ",d"):>10}')
  if any(r.get('preempted') for r in rows):
    lines.append('* stopped (SIGTERM or Ctrl-C) before its last step: no result yet (rerun the '
                 'command)')
  summary = summarize(rows)
  if any(s['seeds'] > 1 for s in summary):
    def span(s, k):
      return '-' if s[k] is None else (f'{s[k]:.3f} +- {s[k + "_se"]:.3f} '
                                       f'[{s[k + "_range"][0]:.3f}, {s[k + "_range"][1]:.3f}]')
    lines += ['', (f'{"checkpoint":<{width}} ' if names else '') +
              f'{"mode":<13} {"examples":>8} {"seeds":>5}  {"final: mean +- se [min, max]":<32} '
              'best: mean +- se [min, max]']
    for s in summary:
      lines.append(f'{first(s)}{label(s):<13} {_examples(s):>8} {s["seeds"]:>5}  '
                   f'{span(s, "final"):<32} {span(s, "best")}')
  return '\n'.join(lines)


def checkpoint_names(inits: list) -> list:
  """A name per checkpoint path for run_comparison: its directory's name ('runs/tiny/gpt' ->
  'gpt'; 'W/checkpoints/300' -> 'W-300'); names must differ."""
  names = []
  for path in inits:
    parts = [p for p in str(path).rstrip('/').split('/') if p]
    name = (f'{parts[-3]}-{parts[-1]}' if len(parts) >= 3 and parts[-2] == 'checkpoints'
            else parts[-1] if parts else str(path))
    names.append(name)
  if len(set(names)) != len(names):
    raise ValueError(f'--init {",".join(inits)}: the checkpoints are named {names}; expected '
                     'directories with different names (each gets <workdir>/<name>)')
  return names


def run_comparison(config, root: str, inits: list, modes=(), sizes=(0,), seeds=(),
                   formats=()) -> list:
  """run_transfer for each checkpoint of `inits` on config.task, in <root>/<name>
  (checkpoint_names); returns every row. A format that a checkpoint's family cannot fine-tune
  with (the generation format on BERT or T5) is left out for it, with a note on stderr; a
  format no checkpoint can use is refused."""
  names = checkpoint_names(inits)
  loaded = [run_lib.load_init(path) for path in inits]
  formats = tuple(formats) or (config.task.format,)
  usable = [tuple(f for f in formats if f == 'head' or scoring.continues_text(m.model_config))
            for m in loaded]
  for fmt in formats:
    if not any(fmt in u for u in usable):
      scoring.check_scores(loaded[0].model_config, f"task.format={fmt!r}", f'--init {inits[0]}')
  task = run_lib.load_task(FinetuneConfig.from_config(config))
  rows = []
  for name, path, fmts in zip(names, inits, usable, strict=True):
    skipped = [f for f in formats if f not in fmts]
    if skipped:
      print(f'{name}: no {", ".join(skipped)} format for its family; its other runs go on',
            file=sys.stderr, flush=True)
    c = ml_collections.ConfigDict(config.to_dict())
    c.init = path
    done = run_transfer(c, str(epath.Path(root) / name), modes, sizes, seeds, fmts, task, name)
    rows += done
    if done and done[-1].get('stopped'):   # SIGTERM or Ctrl-C: the same command resumes
      break
  return rows


def plot(rows: list, path: str, title: str = '') -> str:
  """Training loss (left) and the validation metric (right) against step, one line per run,
  as a PNG at `path` (local or gs://: written through the path layer); returns `path`."""

  import matplotlib  # noqa: PLC0415 (matplotlib: plots only)
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # noqa: PLC0415 (matplotlib: plots only)
  fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
  colors = {'scratch': 'tab:gray', 'linear_probe': 'tab:blue', 'full': 'tab:red',
            'lora': 'tab:green', 'scratch (gen)': 'tab:brown', 'full (gen)': 'tab:orange',
            'lora (gen)': 'tab:olive'}
  sizes = sorted({r['size'] for r in rows})
  styles = dict(zip(sizes, ['-', '--', ':', '-.'] * 4, strict=False))
  labelled = set()
  for r in rows:
    curves = run_lib.read_curves(r['workdir'])
    name = label(r) + (f' (n={r["size"]})' if len(sizes) > 1 else '')
    style = dict(color=colors.get(label(r)), linestyle=styles[r['size']],
                 label=None if name in labelled else name)   # one legend entry for all seeds
    labelled.add(name)
    train = [(x['step'], x['loss']) for x in curves['train'] if x.get('loss') is not None]
    val = [(x['step'], x[r['metric']]) for x in curves['eval'] if r['metric'] in x]
    if train:
      left.plot(*zip(*train, strict=True), **style)
    if val:
      right.plot(*zip(*val, strict=True), marker='o', markersize=3, **style)
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
  paths.write_atomic(path, png.getvalue())
  return str(path)


def report(rows: list, root: str, title: str = '', **fields) -> dict:
  """After the runs: the table on stderr, then the figures, then one JSON line on stdout
  ({**fields, png, comparison_png, comparison_json, runs, summary}; a figure that failed is
  None). <root>/transfer.png (plot) shows one checkpoint's runs; <root>/comparison.png
  (figures.comparison_figure) several checkpoints' or labelled-set sizes', with its numbers in
  <root>/comparison.json. A failed plot is raised after the JSON line: it never costs the
  summary of runs already done."""
  print(table(rows), file=sys.stderr, flush=True)
  several = len({r.get('checkpoint', '') for r in rows}) > 1
  figures_asked = {}
  if not several:
    figures_asked['png'] = ('transfer.png', plot)
  if several or len({r['size'] for r in rows}) > 1:
    figures_asked['comparison_png'] = ('comparison.png', figures.plot_comparison)
  written, failed = {}, None
  for key, (name, draw) in figures_asked.items():
    written[key] = str(epath.Path(root) / name)
    try:
      draw(rows, written[key], title)
    except Exception as e:  # raised once the summary is out
      written[key], failed = None, failed or e
  comparison = written.get('comparison_png')
  result = dict(fields, png=written.get('png', comparison), comparison_png=comparison,
                comparison_json=comparison and figures.data_path(comparison), runs=rows,
                summary=summarize(rows))
  print(json.dumps(result), flush=True)
  if failed is not None:
    raise failed
  return result
