"""The one evaluator: metric sums over a stream of batches, for the train loop and any checkpoint.

Training-time validation (training/loop.py) and scripts/evaluate.py call `evaluate` with the
same jitted eval step (training/step.make_eval_step), so the same checkpoint and batches give
the same numbers under the same names (training/task.metrics_from_sums): `loss` is the
training objective (LM + z-loss + NSP), `lm_loss`, `lm_perplexity`, `lm_accuracy`,
`lm_top5_accuracy`, `z_loss`, `nsp_loss`, `nsp_accuracy`. Every number is a ratio of sums
accumulated over all batches (no average of averages).
"""
import itertools

import flax.linen as nn
import jax
import numpy as np

from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.training import state as state_lib, task


def evaluate(eval_step, params, batches, max_batches: int = 0) -> dict:
  """Metrics over `batches` (an iterable of batch dicts); max_batches 0 = all of them.

  `eval_step(params, batch) -> (sums, denominators)`; returns the metrics as floats plus
  `batches` and `target_tokens` (the LM loss's denominator).
  """
  totals, count = None, 0
  for batch in itertools.islice(batches, max_batches or None):
    sums = jax.device_get(eval_step(params, batch))
    totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
    count += 1
  if not count or not any(float(v) for v in totals[1].values()):
    raise ValueError('evaluation saw no target tokens or labels; is the split empty?')
  metrics = {k: float(v) for k, v in task.metrics_from_sums(*totals).items()}
  return {'batches': count, 'target_tokens': int(totals[1].get('lm', 0)), **metrics}


def batch_filter(cfg: ModelConfig):
  """Keeps the keys of a batch that the family's model and losses read (drops e.g. ids)."""
  keys = set(family_of(cfg).batch_keys)
  return lambda batch: {k: v for k, v in batch.items() if k in keys}


def random_init_params(cfg: ModelConfig, seed: int = 0):
  """Fresh parameters of the same architecture (the 'before pre-training' baseline)."""
  model = build(cfg.replace(deterministic=True, decode=False))
  args, kwargs = family_of(cfg).model_inputs(family_of(cfg).init_batch(8, cfg.nsp))
  init = lambda key: model.init(key, *args, **kwargs)['params']
  return nn.unbox(state_lib.run_once(init, jax.random.key(seed)))
