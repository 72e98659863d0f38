"""The one evaluator: metric sums over a stream of batches, for the train loop and any checkpoint.

Training-time validation and pretrain-jax evaluate run the same jitted eval step through
`evaluate`, so a checkpoint and batches give the same numbers under the names of
training/task.metrics_from_sums, each a ratio of sums over all batches (no average of averages).
"""
import itertools

import flax.linen as nn
import jax
import numpy as np

from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.training import state as state_lib
from pretrain_jax.training import task


def evaluate(eval_step, params, batches, max_batches: int = 0, progress=None) -> dict:
  """Metrics (floats) over `batches` (max_batches 0: all), plus `batches` and `target_tokens`
  (the LM loss's denominator). `eval_step(params, batch) -> (sums, denominators)`;
  `progress(count, totals)` (e.g. run/metrics.Progress) is called after each batch with the
  sums so far.
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


def random_init_params(cfg: ModelConfig, seed: int = 0):
  """Fresh parameters of the same architecture (the 'before pre-training' baseline)."""
  model = build(cfg.replace(deterministic=True, decode=False))
  init = state_lib.init_params_fn(model, family_of(cfg).init_batch(8, cfg.nsp))
  return nn.unbox(state_lib.run_once(init, jax.random.key(seed)))
