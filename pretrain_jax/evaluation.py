"""Evaluation metrics of any checkpoint over a stream of batches (deterministic).

GPT: loss, perplexity, next-token accuracy. BERT: MLM loss, top-1 / top-5 accuracy on masked
positions (+ NSP accuracy). T5: span-corruption loss and token accuracy. Every number is a
ratio of sums accumulated over all batches (no average of averages).
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from pretrain_jax import task
from pretrain_jax.models import ModelConfig, build


def _sums_fn(cfg: ModelConfig):
  model = build(cfg.replace(deterministic=True, decode=False))
  target_key, weight_key = task.TARGET_KEYS[cfg.family]

  @jax.jit
  def sums(params, batch):
    args, kwargs = task.model_inputs(cfg.family, batch)
    out = model.apply({'params': params}, *args, **kwargs)
    logits, nsp_logits = out if cfg.family == 'bert' else (out, None)
    targets, weights = batch[target_key], batch[weight_key].astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    nll = log_z - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    top5 = jax.lax.top_k(logits, 5)[1]                                     # (B, T, 5)
    result = {'loss': jnp.sum(nll * weights), 'weight': jnp.sum(weights),
              'top1': jnp.sum((top5[..., 0] == targets) * weights),
              'top5': jnp.sum(jnp.any(top5 == targets[..., None], axis=-1) * weights)}
    if nsp_logits is not None and 'nsp_labels' in batch:
      result['nsp_correct'] = jnp.sum(jnp.argmax(nsp_logits, -1) == batch['nsp_labels'])
      result['nsp_count'] = jnp.asarray(batch['nsp_labels'].shape[0], jnp.float32)
    return result
  return sums


def random_init_params(cfg: ModelConfig, seed: int = 0):
  """Fresh parameters of the same architecture (the 'before pre-training' baseline)."""
  model = build(cfg.replace(deterministic=True, decode=False))
  length = 8
  tokens = jnp.ones((1, length), jnp.int32)
  args = (tokens, tokens) if cfg.family == 't5' else (tokens,)
  return nn.unbox(jax.jit(model.init)(jax.random.key(seed), *args)['params'])


def evaluate(cfg: ModelConfig, params, batches, max_batches: int = 0) -> dict:
  """Metrics over `batches` (an iterable of batch dicts); max_batches 0 = all of them."""
  sums_fn, total, count = _sums_fn(cfg), {}, 0
  for batch in batches:
    if max_batches and count >= max_batches:
      break
    keep = {k: v for k, v in batch.items() if k in _KEYS}
    out = jax.device_get(sums_fn(params, keep))
    total = {k: total.get(k, 0.0) + float(v) for k, v in out.items()}
    count += 1
  if not count or not total['weight']:
    raise ValueError('evaluation saw no target tokens; is the split empty?')
  loss = total['loss'] / total['weight']
  metrics = {'batches': count, 'target_tokens': int(total['weight']), 'loss': loss}
  if cfg.family == 'gpt':
    metrics.update(perplexity=float(np.exp(loss)), accuracy=total['top1'] / total['weight'])
  elif cfg.family == 'bert':
    metrics.update(top1=total['top1'] / total['weight'], top5=total['top5'] / total['weight'])
    if 'nsp_count' in total:
      metrics['nsp_accuracy'] = total['nsp_correct'] / total['nsp_count']
  else:
    metrics.update(accuracy=total['top1'] / total['weight'])
  return metrics


_KEYS = {'inputs', 'targets', 'segment_ids', 'positions', 'loss_weights', 'token_type_ids',
         'nsp_labels', 'encoder_input_tokens', 'encoder_segment_ids', 'encoder_positions',
         'decoder_input_tokens', 'decoder_target_tokens', 'decoder_segment_ids',
         'decoder_positions', 'decoder_loss_weights'}
