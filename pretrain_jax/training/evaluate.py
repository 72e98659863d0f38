"""The one evaluator: metric sums over a stream of batches, for the train loop and any checkpoint.

Training-time validation and pretrain-jax evaluate run the same jitted eval step through
`evaluate`, so a checkpoint and batches give the same numbers under the names of
training/task.metrics_from_sums, each a ratio of sums over all batches (no average of averages).
"""
import itertools
import math
import sys
import time

import flax.linen as nn
import jax
import numpy as np

from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.training import state as state_lib
from pretrain_jax.training import task


def evaluate(eval_step, params, batches, max_batches: int = 0, progress=None) -> dict:
  """Metrics (floats) over `batches` (max_batches 0: all), plus `batches` and `target_tokens`
  (the LM loss's denominator). `eval_step(params, batch) -> (sums, denominators)`;
  `progress(count, totals)` (e.g. a `Progress`) is called after each batch with the sums so far.
  """
  totals, count = None, 0
  for batch in itertools.islice(batches, max_batches or None):
    sums = jax.device_get(eval_step(params, batch))
    totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
    count += 1
    if progress is not None:
      progress(count, totals)
  if not count or not any(float(v) for v in totals[1].values()):
    raise ValueError('evaluation saw no target tokens or labels; is the split empty?')
  metrics = {k: float(v) for k, v in task.metrics_from_sums(*totals).items()}
  return {'batches': count, 'target_tokens': int(totals[1].get('lm', 0)), **metrics}


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


def random_init_params(cfg: ModelConfig, seed: int = 0):
  """Fresh parameters of the same architecture (the 'before pre-training' baseline)."""
  model = build(cfg.replace(deterministic=True, decode=False))
  args, kwargs = family_of(cfg).model_inputs(family_of(cfg).init_batch(8, cfg.nsp))
  def init(key):
    return model.init(key, *args, **kwargs)['params']
  return nn.unbox(state_lib.run_once(init, jax.random.key(seed)))


def format_eta(seconds: float) -> str:
  if not math.isfinite(seconds):
    return '?'
  seconds = int(seconds)
  return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'
