"""Progress lines, TensorBoard scalars (tensorboardX: no TensorFlow runtime) and metrics.jsonl;
throughput and MFU. Only process 0 writes. gs:// cannot append: there the event files (written
locally) and metrics.jsonl are rewritten whole at most every `flush_sec` (docs/cloud_tpu.md)."""
import contextlib
import json
import math
import os
import sys
import tempfile
import time

import jax
import numpy as np
from etils import epath

from pretrain_jax import chips, paths
from pretrain_jax.training import task


def peak_flops_per_device(configured_tflops: float = 0.0) -> float:
  """Configured value (config.train.peak_tflops), else the dense bf16 peak of the device's kind
  in pretrain_jax/chips.py. CPUs: cores * 3 GHz * fp32 FLOP/cycle of two FMA units (32 with
  AVX2, 64 with AVX-512), shared by simulated devices."""
  if configured_tflops > 0:
    return configured_tflops * 1e12
  device = jax.devices()[0]
  peak = chips.peak_flops_per_device(device.device_kind)
  if peak is not None:
    return peak
  if device.platform != 'cpu':
    return float('nan')
  try:
    per_cycle = 64 if 'avx512f' in epath.Path('/proc/cpuinfo').read_text() else 32
  except OSError:
    per_cycle = 32
  return (os.cpu_count() or 1) * 3e9 * per_cycle / jax.local_device_count()


class StepClock:
  """Wall time of train steps, the first (compiling) one excluded: `lap()` is the mean step time
  since the last lap or `pause()` (after evaluations, saves, traced steps; None if none was
  timed); `eta(remaining)` is at the run's wall pace since its first step, pauses included."""

  def __init__(self, clock=time.perf_counter):
    self.clock, self.origin, self.start = clock, None, None
    self.steps = self.since_origin = self.total_steps = 0
    self.total_time = 0.0

  def stepped(self, metrics) -> None:
    if self.origin is None:
      jax.block_until_ready(metrics)
      self.start = self.origin = self.clock()
    else:
      self.steps, self.since_origin = self.steps + 1, self.since_origin + 1

  def eta(self, remaining: int):
    if self.since_origin:
      return remaining * (self.clock() - self.origin) / self.since_origin
    return None

  def lap(self):
    steps, elapsed = self.steps, (self.clock() - self.start if self.steps else 0.0)
    self.total_time, self.total_steps = self.total_time + elapsed, self.total_steps + steps
    self.pause()
    return elapsed / steps if steps else None

  def pause(self) -> None:
    if self.origin is not None:
      self.start, self.steps = self.clock(), 0

  def mean_step_time(self):
    return self.total_time / self.total_steps if self.total_steps else None


class MetricWriter:
  """Scalars to TensorBoard and `<workdir>/metrics.jsonl`; `line` to stderr. Records past
  `resume_step` (a resumed run's restored step) are dropped and purged from TensorBoard
  (purge_step), so each step is logged once."""

  def __init__(self, workdir: str, *, flush_sec: float = 30.0, resume_step: int = 0):
    self.enabled = jax.process_index() == 0
    self.remote, self.flush_sec, self.flushed = paths.is_remote(workdir), flush_sec, 0.0
    if not self.enabled:
      return
    workdir = paths.makedirs(workdir)
    from tensorboardX import SummaryWriter  # noqa: PLC0415 (tensorboardX: slow, it loads torch)
    self.path, self.tb_dir = workdir / 'metrics.jsonl', workdir / 'tensorboard'
    # gs://: not tensorboardX's own writer, whose background uploads retry 120 s on a failure
    self.tb_local = (epath.Path(tempfile.mkdtemp(prefix='pretrain_jax-tb-')) if self.remote
                     else self.tb_dir)
    self.tb = SummaryWriter(str(self.tb_local), purge_step=resume_step + 1)
    self.lines = _records_up_to(self.path, resume_step)
    if not self.remote:   # a local file is appended to and flushed line by line
      paths.write_atomic(self.path, ''.join(self.lines))
      self.jsonl = self.path.open('a')

  def write(self, step: int, scalars: dict, prefix: str = 'train') -> None:
    if not self.enabled:
      return
    for key, value in scalars.items():
      self.tb.add_scalar(f'{prefix}/{key}', value, step)
    record = {'step': int(step), 'split': prefix, 'time': time.time()}
    record.update({k: float(v) if math.isfinite(v) else str(float(v)) for k, v in scalars.items()})
    if self.remote:
      self.lines.append(json.dumps(record) + '\n')
      if time.time() - self.flushed >= self.flush_sec:
        self.flush()
    else:
      self.jsonl.write(json.dumps(record) + '\n')
      self.jsonl.flush()
      self.tb.flush()

  def flush(self) -> None:
    """Writes what is buffered (gs://: rewrites metrics.jsonl and the event files whole)."""
    if not self.enabled:
      return
    self.tb.flush()
    if self.remote:
      paths.write_atomic(self.path, ''.join(self.lines))
      for events in self.tb_local.iterdir():
        paths.copy(events, self.tb_dir / events.name)
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
      if self.remote:
        self.tb_local.rmtree()
      else:
        self.jsonl.close()


def _records_up_to(path: epath.Path, step: int) -> list:
  """metrics.jsonl's lines of steps <= step, each ending in a newline (not a torn last line)."""
  kept = []
  for line in path.read_text().splitlines() if path.is_file() else []:
    with contextlib.suppress(ValueError):
      if line.strip() and json.loads(line).get('step', 0) <= step:
        kept.append(line + '\n')
  return kept


def interval_mean(rows: list) -> dict:
  """The train metrics of the steps since the previous train row -> one row (t5x's
  AveragePerStep): each metric's mean, except `learning_rate` (the logged step's),
  `state_finite` (the worst), `lm_perplexity` (exp of the mean lm_loss) and a head's `_mcc` /
  `_f1`, of the summed `{head}_confusion` counts (left out of the row), as evaluation computes
  them (docs/training.md#what-a-run-logs)."""
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


class Progress:
  """`eval 40/200 batches | loss 2.3456 | 3.1 batches/s | eta 0:00:51` on stderr, at most every
  `every_s` seconds (the loss is the running one, over the batches so far); `total` 0 = the
  whole split, of unknown length: no eta."""

  def __init__(self, total: int = 0, every_s: float = 10.0, out=None, clock=time.monotonic):
    self.total, self.every_s, self._out, self._clock = total, every_s, out, clock
    self._start = self._last = clock()

  def __call__(self, count: int, totals) -> None:
    now = self._clock()
    if now - self._last < self.every_s:
      return
    self._last = now
    rate = count / max(now - self._start, 1e-9)
    parts = [f'eval {count}/{self.total} batches' if self.total else f'eval {count} batches',
             f'loss {float(task.total_loss(*totals)):.4f}', f'{rate:.1f} batches/s']
    if self.total:
      parts.append(f'eta {format_eta((self.total - count) / rate)}')
    print(' | '.join(parts), file=self._out or sys.stderr, flush=True)


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
