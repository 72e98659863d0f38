"""Progress lines, TensorBoard scalars and a JSON-lines log; throughput and MFU estimates.

TensorBoard goes through tensorboardX: a pure-Python event writer, so the training process
does not start TensorFlow's runtime (threads, device discovery) just to write scalars, and the
files are the same TensorBoard reads. Only process 0 writes anything.

On gs:// (object stores cannot append; gcsfs's append silently rewrites), metrics.jsonl is kept
in memory (the lines already there are read first) and the whole object is rewritten at most
every `flush_sec` and at close. TensorBoard events are written to a local temporary folder and
copied whole to `<workdir>/tensorboard/` at the same times (not tensorboardX's own gs:// writer:
its background uploads retry for 120 s after a failure, and it would be a second GCS client).
A crash loses at most `flush_sec` of log lines and scalars, never a checkpoint.
A local workdir appends and flushes each line, as before.
"""
import json
import math
import os
import sys
import tempfile
import time

import jax
import numpy as np

from pretrain_jax import paths
from pretrain_jax.models import family_of, flops
from pretrain_jax.training import task

# Dense bf16 peak FLOP/s per device, for the MFU estimate (config.train.peak_tflops overrides).
PEAK_TFLOPS = {'tpu v2': 45.0, 'tpu v3': 123.0, 'tpu v4': 275.0, 'tpu v5 lite': 197.0,
               'tpu v5e': 197.0, 'tpu v5p': 459.0, 'tpu v6 lite': 918.0, 'tpu v6e': 918.0,
               'h100': 989.0, 'h200': 989.0, 'a100': 312.0, 'v100': 125.0, 'l4': 121.0}


def peak_flops_per_device(configured_tflops: float = 0.0) -> float:
  """Configured value, else a table lookup by device kind. CPUs: cores * 3 GHz * fp32
  FLOP/cycle of two FMA units (32 with AVX2, 64 with AVX-512), shared by simulated devices."""
  if configured_tflops > 0:
    return configured_tflops * 1e12
  device = jax.devices()[0]
  kind = device.device_kind.lower()
  for name, tflops in PEAK_TFLOPS.items():
    if name in kind:
      return tflops * 1e12
  if device.platform == 'cpu':
    return (os.cpu_count() or 1) * 3e9 * _cpu_flops_per_cycle() / jax.local_device_count()
  return float('nan')


def _cpu_flops_per_cycle() -> int:
  try:
    with open('/proc/cpuinfo') as f:
      return 64 if 'avx512f' in f.read() else 32
  except OSError:
    return 32


def batch_cost(model_cfg, batch: dict, max_predictions: int = 0,
               frozen_backbone: bool = False) -> tuple:
  """(tokens, model FLOPs) of one train step on `batch`. Tokens are input positions (T5:
  encoder + decoder); FLOPs are pretrain_jax.models.flops' analytic matmul count (PaLM-style
  MFU) of what the step runs: the LM head on `max_predictions` positions per row when that is
  set, and not at all for a batch without LM targets (classification); a frozen backbone (a
  linear probe) forward only."""
  family = family_of(model_cfg)
  batch_size, length, target_len = family.lengths(batch)
  return (batch_size * (length + target_len),
          flops.train_flops(model_cfg, batch_size, length, target_len, max_predictions,
                            lm_head=family.target_key in batch,
                            frozen_backbone=frozen_backbone))


class StepClock:
  """Training throughput: wall time of train steps only, the first (compiling) step excluded.

  `stepped(metrics)` after each step (the first one blocks, then starts the clock); `lap()` at
  a log point returns the mean step time since the last lap (None if no step was timed);
  `pause()` after evaluation or a save so their time is not counted; `mean_step_time()` over
  the whole run. `eta(remaining)` is wall time: the run's pace since its first step, so
  evaluations and saves are in it.
  """

  def __init__(self, clock=time.perf_counter):
    self.start, self.steps, self.total_time, self.total_steps = None, 0, 0.0, 0
    self.clock, self.origin, self.since_origin = clock, None, 0

  def stepped(self, metrics) -> None:
    if self.start is None:
      jax.block_until_ready(metrics)
      self.start = self.origin = self.clock()
    else:
      self.steps += 1
      self.since_origin += 1

  def eta(self, remaining: int):
    if not self.since_origin:
      return None
    return remaining * (self.clock() - self.origin) / self.since_origin

  def lap(self):
    if not self.steps:
      self.pause()
      return None
    elapsed = self.clock() - self.start
    step_time = elapsed / self.steps
    self.total_time, self.total_steps = self.total_time + elapsed, self.total_steps + self.steps
    self.pause()
    return step_time

  def pause(self) -> None:
    if self.start is not None:
      self.start, self.steps = self.clock(), 0

  def mean_step_time(self):
    return self.total_time / self.total_steps if self.total_steps else None


class MetricWriter:
  """Writes scalars to stdout (one line), TensorBoard and `<workdir>/metrics.jsonl`."""

  def __init__(self, workdir: str, *, enabled: bool = True, flush_sec: float = 30.0,
               resume_step: int | None = None):
    """`resume_step`: the step a resumed run restarts from. Records past it (written after that
    checkpoint by the run that stopped) are dropped from metrics.jsonl, and TensorBoard purges
    its events past it (tensorboardX purge_step), so each step is logged once."""
    self.enabled = enabled and jax.process_index() == 0
    self.tb = self.jsonl = None
    self.path = paths.join(paths.absolute(workdir), 'metrics.jsonl')
    self.remote, self.flush_sec, self.flushed = paths.is_remote(workdir), flush_sec, 0.0
    if self.enabled:
      paths.makedirs(workdir)
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self.tb_dir = paths.join(paths.absolute(workdir), 'tensorboard')
      self.tb_local = tempfile.mkdtemp(prefix='pretrain_jax-tb-') if self.remote else None
      purge = None if resume_step is None else resume_step + 1
      self.tb = SummaryWriter(self.tb_local or self.tb_dir, purge_step=purge)
      kept = (_records_up_to(self.path, resume_step)
              if self.remote or resume_step is not None else None)
      if self.remote:
        self.lines = kept
      else:
        if resume_step is not None:
          paths.write_text(self.path, ''.join(kept))
        self.jsonl = open(self.path, 'a')

  def write(self, step: int, scalars: dict, prefix: str = 'train') -> None:
    if not self.enabled:
      return
    for key, value in scalars.items():
      self.tb.add_scalar(f'{prefix}/{key}', value, step)
    record = {'step': int(step), 'split': prefix, 'time': time.time()}
    record.update({k: _json_number(v) for k, v in scalars.items()})
    if self.remote:
      self.lines.append(json.dumps(record) + '\n')
      if time.time() - self.flushed >= self.flush_sec:
        self.flush()
    else:
      self.jsonl.write(json.dumps(record) + '\n')
      self.jsonl.flush()
      self.tb.flush()

  def flush(self) -> None:
    """Writes what is buffered (gs://: rewrites metrics.jsonl and the event file whole)."""
    if self.enabled:
      self.tb.flush()
      if self.remote:
        paths.write_text(self.path, ''.join(self.lines))
        for name in paths.listdir(self.tb_local):
          paths.copy(paths.join(self.tb_local, name), paths.join(self.tb_dir, name))
      else:
        self.jsonl.flush()
      self.flushed = time.time()

  def line(self, text: str) -> None:
    if self.enabled:
      print(text, file=sys.stderr, flush=True)

  def close(self) -> None:
    if self.enabled:
      self.tb.close()
      self.flush()
      if self.jsonl is not None:
        self.jsonl.close()
      if self.tb_local:
        paths.rmtree(self.tb_local)


def _records_up_to(path: str, step: int | None) -> list:
  """metrics.jsonl's lines (each ending in a newline); with `step`, those of steps <= step.
  A torn last line (a crash mid-write) is dropped with them."""
  if not paths.isfile(path):
    return []
  lines = [l + '\n' for l in paths.read_text(path).splitlines() if l.strip()]
  if step is None:
    return lines
  kept = []
  for l in lines:
    try:
      if json.loads(l).get('step', 0) <= step:
        kept.append(l)
    except ValueError:
      continue
  return kept


def _json_number(value):
  value = float(value)
  return value if math.isfinite(value) else str(value)


def interval_mean(rows: list) -> dict:
  """The train metrics of the steps since the previous train row -> one row, as t5x's
  AveragePerStep and the HF Trainer log them: each metric's mean over the steps (one batch's
  loss is noisy), except `learning_rate` (the schedule at the logged step), `state_finite`
  (the worst), `lm_perplexity` (exp of the mean lm_loss, not a mean of exps) and a head's
  `{head}_mcc` / `{head}_f1`: of the interval's summed `{head}_confusion` counts (which the
  row leaves out), as evaluation computes them (a batch's MCC is often 0: one class only)."""
  if not rows:
    raise ValueError('interval_mean needs at least one step\'s metrics')
  confusions = [k for k in rows[-1] if k.endswith('_confusion')]
  out = {k: math.fsum(float(r[k]) for r in rows) / len(rows) for k in rows[-1]
         if k not in confusions}
  for key in confusions:
    counts = np.sum([np.asarray(r[key], np.float64) for r in rows], axis=0)
    out.update({f'{key[:-len("confusion")]}{name}': float(value) for name, value in
                task.confusion_metrics(counts).items()})
  out['learning_rate'] = float(rows[-1]['learning_rate'])
  if 'state_finite' in out:
    out['state_finite'] = min(float(r['state_finite']) for r in rows)
  if 'lm_perplexity' in out:
    loss = out['lm_loss']
    out['lm_perplexity'] = math.exp(loss) if loss < 709.0 else math.inf   # (as jnp.exp)
  return out


def format_eta(seconds: float) -> str:
  if not math.isfinite(seconds):
    return '?'
  seconds = int(seconds)
  return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'


def progress_line(step: int, total: int, scalars: dict) -> str:
  parts = [f'step {step}/{total}', f'loss {scalars["loss"]:.4f}']
  if 'nsp_loss' in scalars:
    parts.append(f'nsp {scalars["nsp_loss"]:.3f}')
  parts += [f'lr {scalars["learning_rate"]:.2e}', f'gnorm {scalars["grad_norm"]:.2f}']
  if 'tokens_per_sec' in scalars:
    tokens = f'{scalars["tokens_per_sec"]:,.0f} tok/s'
    real = scalars.get('non_padding_fraction', 1.0)
    if real < 0.995:   # (packed pre-training rows are ~all text: no note)
      tokens += f' ({100 * real:.0f}% not padding)'
    parts += [tokens, f'mfu {100 * scalars["mfu"]:.1f}%', f'eta {format_eta(scalars["eta_sec"])}']
  return ' | '.join(parts)
