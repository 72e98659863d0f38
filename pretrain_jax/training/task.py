"""Model call -> loss sums and metrics, for any family (its record: models/family.py).

A loss is `sum / denominator`, the denominators from the WHOLE global batch, so that
microbatches and hosts add sums.
"""
import jax
import jax.numpy as jnp

from pretrain_jax import ops
from pretrain_jax.models import family_of
from pretrain_jax.training import fused_loss as fused_lib
from pretrain_jax.training import losses


def denominators(family, batch) -> dict:
  """Each loss term's denominator (`family`: a record, a name or a ModelConfig): the LM's
  weights (absent from a classification batch) and each head's rows with a label >= 0."""
  family = family_of(family)
  out = {}
  if family.weight_key in batch:
    out['lm'] = jnp.sum(batch[family.weight_key].astype(jnp.float32))
  for head in family.heads:
    if head.label_key in batch:
      out[head.name] = jnp.sum((batch[head.label_key] >= 0).astype(jnp.float32))
  return out


def gather_predictions(hidden, targets, weights, count: int):
  """The `count` positions of each row with the largest weights: (B, K, E), (B, K), (B, K).
  A row with at most `count` weighted positions keeps them all, so its loss is unchanged."""
  index = jax.lax.top_k(weights.astype(jnp.float32), count)[1]                  # (B, K)
  return (jnp.take_along_axis(hidden, index[..., None], axis=1),
          jnp.take_along_axis(targets, index, axis=1),
          jnp.take_along_axis(weights, index, axis=1))


def loss_sums(model, params, batch, *, rngs=None, z_loss: float = 0.0,
              loss_chunk_len: int = 0, max_predictions: int = 0, top5: bool = False,
              freeze_backbone: bool = False, fused_loss: bool = False) -> dict:
  """Summed terms: lm, lm_z_loss, lm_correct, lm_weight (+ lm_top5) where the batch has LM
  targets; `{head}`, `{head}_correct`, `{head}_confusion` for each active head it labels.

  max_predictions > 0 runs the LM head on that many weighted positions per row, or on every
  position when a row has more (lax.cond): the sums stay exact. `freeze_backbone` (a probe)
  stops gradients at the hidden states. `fused_loss` computes the LM head's logits and their
  gradients together, `loss_chunk_len` positions at a time (0: fused_loss.CHUNK_LEN), keeping
  no logits for the backward pass (training/fused_loss.py); else the head's logits are
  differentiated by autodiff, whole or in recomputed chunks of `loss_chunk_len`.
  """
  if not isinstance(max_predictions, int) or max_predictions < 0:
    raise ValueError(f'max_predictions_per_seq={max_predictions!r}; expected 0 (every '
                     'position) or a positive number of positions per row')
  family = family_of(model.cfg)
  args, kwargs = family.model_inputs(batch)
  variables = {'params': params}
  hidden = model.apply(variables, *args, **kwargs, rngs=rngs, method='hidden')  # (B, T, E)
  if freeze_backbone:
    hidden = jax.lax.stop_gradient(hidden)
  sums = {}
  for extra in family.active_heads(model.cfg):
    if extra.label_key in batch:
      logits = model.apply(variables, hidden, **{k: batch.get(k) for k in extra.keys},
                           rngs=rngs, method=extra.method)                      # (B, C)
      labels = batch[extra.label_key]                                           # -1: no row
      out = losses.cross_entropy_sums(logits, jnp.maximum(labels, 0),
                                      (labels >= 0).astype(jnp.float32))
      truth = jax.nn.one_hot(labels, logits.shape[-1], dtype=jnp.float32)      # -1 -> zeros
      predicted = jax.nn.one_hot(jnp.argmax(logits, -1), logits.shape[-1], dtype=jnp.float32)
      sums.update({extra.name: out['loss'], f'{extra.name}_correct': out['correct'],
                   f'{extra.name}_confusion': jnp.einsum('bt,bp->tp', truth, predicted)})
  if family.target_key not in batch:
    return sums
  def head(h):
    return model.apply(variables, h, method='logits')
  targets, weights = batch[family.target_key], batch[family.weight_key]

  def lm_sums(h, t, w):
    if fused_loss:
      return fused_lib.fused_cross_entropy_sums(
          model.apply(variables, h, method='head_inputs'), t, w, z_loss=z_loss,
          chunk_len=loss_chunk_len or fused_lib.CHUNK_LEN, top5=top5,
          blockwise_max=ops.current().blockwise_max)
    return losses.chunked_cross_entropy_sums(head, h, t, w, z_loss, loss_chunk_len, top5,
                                             ops.current().blockwise_max)
  if 0 < max_predictions < targets.shape[1]:
    overflow = jnp.any(jnp.sum(weights != 0, axis=1) > max_predictions)
    lm = jax.lax.cond(overflow, lm_sums,
                      lambda *a: lm_sums(*gather_predictions(*a, max_predictions)),
                      hidden, targets, weights)
  else:
    lm = lm_sums(hidden, targets, weights)
  sums.update({f'lm_{k}' if k != 'loss' else 'lm': v for k, v in lm.items()})
  return sums


def total_loss(sums: dict, denoms: dict):
  """The differentiated scalar, `loss` everywhere: mean LM loss + mean z-loss (where the batch
  has LM targets) + each head's mean loss."""
  loss = jnp.zeros((), jnp.float32)
  if 'lm' in sums:
    loss = (sums['lm'] + sums['lm_z_loss']) / jnp.maximum(denoms['lm'], 1.0)
  for name in denoms:
    if name != 'lm' and name in sums:
      loss = loss + sums[name] / jnp.maximum(denoms[name], 1.0)
  return loss


def confusion_metrics(confusion) -> dict:
  """(C, C) counts (true x predicted) -> Matthews correlation (Gorodkin's multi-class form)
  and F1 (of class 1 for C = 2, as GLUE's MRPC/QQP; macro for C > 2); 0 where undefined."""
  total, hits = jnp.sum(confusion), jnp.trace(confusion)
  true, pred = jnp.sum(confusion, 1), jnp.sum(confusion, 0)
  den = jnp.sqrt((total ** 2 - jnp.sum(pred ** 2)) * (total ** 2 - jnp.sum(true ** 2)))
  mcc = jnp.where(den > 0, (hits * total - jnp.sum(pred * true)) / jnp.maximum(den, 1e-12), 0.0)
  tp = jnp.diagonal(confusion)
  f1_per_class = jnp.where(true + pred > 0, 2 * tp / jnp.maximum(true + pred, 1e-12), 0.0)
  f1 = f1_per_class[1] if confusion.shape[0] == 2 else jnp.mean(f1_per_class)
  return {'mcc': mcc, 'f1': f1}


def metrics_from_sums(sums: dict, denoms: dict) -> dict:
  """Summed terms -> the one set of metric names of training and evaluation (DESIGN.md):
  loss, lm_loss, lm_perplexity, lm_accuracy, lm_top5_accuracy, z_loss and, per head,
  {head}_loss, {head}_accuracy, {head}_mcc, {head}_f1."""
  out = {'loss': total_loss(sums, denoms)}
  if 'lm' in sums:
    lm_weight = jnp.maximum(denoms['lm'], 1.0)
    lm_loss = sums['lm'] / lm_weight
    out.update({'lm_loss': lm_loss, 'lm_perplexity': jnp.exp(lm_loss),
                'lm_accuracy': sums['lm_correct'] / lm_weight,
                'z_loss': sums['lm_z_loss'] / lm_weight})
    if 'lm_top5' in sums:
      out['lm_top5_accuracy'] = sums['lm_top5'] / lm_weight
  for name in denoms:
    if name != 'lm' and name in sums:
      weight = jnp.maximum(denoms[name], 1.0)
      out.update({f'{name}_loss': sums[name] / weight,
                  f'{name}_accuracy': sums[f'{name}_correct'] / weight})
      out.update({f'{name}_{k}': v for k, v in
                  confusion_metrics(sums[f'{name}_confusion']).items()})
  return out
