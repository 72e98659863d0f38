"""Model call -> loss sums, for any family. The train step and evaluation both go through here.

The model is objective-agnostic; the family's record (pretrain_jax.models.family) says which
batch keys it consumes and which extra heads it has; this file says how the losses add up. A loss is `sum / denominator`, with denominators
taken from the WHOLE global batch (`denominators`) so that microbatches and hosts add sums.
"""
import jax
import jax.numpy as jnp

from pretrain_jax.models import family_of
from pretrain_jax.training import losses

def denominators(family, batch) -> dict:
  """Global denominators of each loss term, computed from the full batch (`family`: a record,
  a family name or a ModelConfig)."""
  family = family_of(family)
  out = {'lm': jnp.sum(batch[family.weight_key].astype(jnp.float32))}
  for head in family.heads:
    if head.label_key in batch:
      out[head.name] = jnp.asarray(batch[head.label_key].shape[0], jnp.float32)
  return out


def gather_predictions(hidden, targets, weights, count: int):
  """The `count` positions of each row with the largest weights: (B, K, E), (B, K), (B, K).

  Rows with at most `count` nonzero weights keep every weighted position (the rest of the K
  are zero-weight positions), so the loss over the gathered positions is the row's loss.
  """
  index = jax.lax.top_k(weights.astype(jnp.float32), count)[1]                  # (B, K)
  return (jnp.take_along_axis(hidden, index[..., None], axis=1),
          jnp.take_along_axis(targets, index, axis=1),
          jnp.take_along_axis(weights, index, axis=1))


def loss_sums(model, params, batch, *, rngs=None, z_loss: float = 0.0,
              loss_chunk_len: int = 0, max_predictions: int = 0, top5: bool = False) -> dict:
  """Forward pass and summed loss terms: lm, lm_z_loss, lm_correct, lm_weight (+ lm_top5 with
  `top5`) and, for each active head (BERT's NSP), `{head}` and `{head}_correct`.

  loss_chunk_len > 0 runs the LM head and cross-entropy that many positions at a time
  (losses.chunked_cross_entropy_sums): the same sums, without the whole (B, T, V) logits.
  max_predictions > 0 runs the LM head only on that many positions per row, those with loss
  weight (BERT's max_predictions_per_seq: 15% of positions carry the MLM loss). A batch with a
  row of more weighted positions runs the head on every position instead (lax.cond), so the
  sums are always exact; size it so that this is rare.
  """
  if not isinstance(max_predictions, int) or max_predictions < 0:
    raise ValueError(f'max_predictions_per_seq={max_predictions!r}; expected 0 (every '
                     'position) or a positive number of positions per row')
  family = family_of(model.cfg)
  args, kwargs = family.model_inputs(batch)
  variables = {'params': params}
  hidden = model.apply(variables, *args, **kwargs, rngs=rngs, method='hidden')  # (B, T, E)
  head = lambda h: model.apply(variables, h, method='logits')
  targets, weights = batch[family.target_key], batch[family.weight_key]

  def lm_sums(h, t, w):
    return losses.chunked_cross_entropy_sums(head, h, t, w, z_loss, loss_chunk_len, top5)
  if 0 < max_predictions < targets.shape[1]:
    overflow = jnp.any(jnp.sum(weights != 0, axis=1) > max_predictions)
    lm = jax.lax.cond(overflow, lm_sums,
                      lambda *a: lm_sums(*gather_predictions(*a, max_predictions)),
                      hidden, targets, weights)
  else:
    lm = lm_sums(hidden, targets, weights)
  sums = {f'lm_{k}' if k != 'loss' else 'lm': v for k, v in lm.items()}
  for extra in family.active_heads(model.cfg):
    if extra.label_key in batch:
      labels = batch[extra.label_key]
      out = losses.cross_entropy_sums(model.apply(variables, hidden, method=extra.method),
                                      labels, jnp.ones(labels.shape, jnp.float32))
      sums.update({extra.name: out['loss'], f'{extra.name}_correct': out['correct']})
  return sums


def total_loss(sums: dict, denoms: dict):
  """The scalar that is differentiated, reported as `loss` everywhere: mean LM loss + mean
  z-loss + the mean loss of each extra head (BERT's NSP)."""
  loss = (sums['lm'] + sums['lm_z_loss']) / jnp.maximum(denoms['lm'], 1.0)
  for name in denoms:
    if name != 'lm' and name in sums:
      loss = loss + sums[name] / jnp.maximum(denoms[name], 1.0)
  return loss


def metrics_from_sums(sums: dict, denoms: dict) -> dict:
  """Summed loss terms -> averages: the one set of metric names of training and evaluation.

  loss: the training objective (total_loss). lm_loss / lm_accuracy / lm_perplexity: the LM
  cross-entropy per target token, its argmax accuracy and exp(lm_loss) (+ lm_top5_accuracy
  when the sums have it). z_loss: the auxiliary term per target token. {head}_loss /
  {head}_accuracy: each extra head (nsp_loss, nsp_accuracy for BERT).
  """
  lm_weight = jnp.maximum(denoms['lm'], 1.0)
  lm_loss = sums['lm'] / lm_weight
  out = {'loss': total_loss(sums, denoms), 'lm_loss': lm_loss,
         'lm_perplexity': jnp.exp(lm_loss), 'lm_accuracy': sums['lm_correct'] / lm_weight,
         'z_loss': sums['lm_z_loss'] / lm_weight}
  if 'lm_top5' in sums:
    out['lm_top5_accuracy'] = sums['lm_top5'] / lm_weight
  for name in denoms:
    if name != 'lm' and name in sums:
      weight = jnp.maximum(denoms[name], 1.0)
      out.update({f'{name}_loss': sums[name] / weight,
                  f'{name}_accuracy': sums[f'{name}_correct'] / weight})
  return out
