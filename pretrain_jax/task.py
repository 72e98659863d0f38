"""Family -> model call -> loss sums. The train step and evaluation both go through here.

The model is objective-agnostic; this file knows which batch keys each family consumes
(see DESIGN.md) and how its losses add up. A loss is `sum / denominator`, with denominators
taken from the WHOLE global batch (`denominators`) so that microbatches and hosts add sums.
"""
import jax
import jax.numpy as jnp

from pretrain_jax import losses

TARGET_KEYS = {'gpt': ('targets', 'loss_weights'), 'bert': ('targets', 'loss_weights'),
               't5': ('decoder_target_tokens', 'decoder_loss_weights')}


def model_inputs(family: str, batch) -> tuple:
  """(args, kwargs) of the family's model __call__ from a batch dict."""
  if family == 'gpt':
    return (batch['inputs'],), dict(segment_ids=batch.get('segment_ids'),
                                    positions=batch.get('positions'))
  if family == 'bert':
    return (batch['inputs'],), dict(token_type_ids=batch.get('token_type_ids'),
                                    segment_ids=batch.get('segment_ids'),
                                    positions=batch.get('positions'))
  if family == 't5':
    return (batch['encoder_input_tokens'], batch['decoder_input_tokens']), dict(
        encoder_segment_ids=batch.get('encoder_segment_ids'),
        decoder_segment_ids=batch.get('decoder_segment_ids'),
        encoder_positions=batch.get('encoder_positions'),
        decoder_positions=batch.get('decoder_positions'))
  raise ValueError(f'family {family!r}; expected gpt, bert or t5')


def denominators(family: str, batch) -> dict:
  """Global denominators of each loss term, computed from the full batch."""
  weights = batch[TARGET_KEYS[family][1]]
  out = {'lm': jnp.sum(weights.astype(jnp.float32))}
  if 'nsp_labels' in batch:
    out['nsp'] = jnp.asarray(batch['nsp_labels'].shape[0], jnp.float32)
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
              loss_chunk_len: int = 0, max_predictions: int = 0) -> dict:
  """Forward pass and summed loss terms: lm, lm_z, lm_correct, lm_weight (+ nsp_*).

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
  family = model.cfg.family
  args, kwargs = model_inputs(family, batch)
  variables = {'params': params}
  hidden = model.apply(variables, *args, **kwargs, rngs=rngs, method='hidden')  # (B, T, E)
  head = lambda h: model.apply(variables, h, method='logits')
  target_key, weight_key = TARGET_KEYS[family]
  targets, weights = batch[target_key], batch[weight_key]

  def lm_sums(h, t, w):
    return losses.chunked_cross_entropy_sums(head, h, t, w, z_loss, loss_chunk_len)
  if 0 < max_predictions < targets.shape[1]:
    overflow = jnp.any(jnp.sum(weights != 0, axis=1) > max_predictions)
    lm = jax.lax.cond(overflow, lm_sums,
                      lambda *a: lm_sums(*gather_predictions(*a, max_predictions)),
                      hidden, targets, weights)
  else:
    lm = lm_sums(hidden, targets, weights)
  sums = {f'lm_{k}' if k != 'loss' else 'lm': v for k, v in lm.items()}
  if family == 'bert' and model.cfg.nsp and 'nsp_labels' in batch:
    nsp_logits = model.apply(variables, hidden, method='nsp_logits')
    nsp = losses.cross_entropy_sums(nsp_logits, batch['nsp_labels'],
                                    jnp.ones(batch['nsp_labels'].shape, jnp.float32))
    sums.update(nsp=nsp['loss'], nsp_correct=nsp['correct'])
  return sums


def total_loss(sums: dict, denoms: dict):
  """The scalar that is differentiated: mean LM loss (+ z-loss) (+ mean NSP loss)."""
  lm_denom = jnp.maximum(denoms['lm'], 1.0)
  loss = (sums['lm'] + sums['lm_z_loss']) / lm_denom
  if 'nsp' in sums:
    loss = loss + sums['nsp'] / jnp.maximum(denoms['nsp'], 1.0)
  return loss
