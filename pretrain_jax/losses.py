"""Losses as (sum, denominator) pieces: sum over hosts and microbatches first, divide once."""
import jax
import jax.numpy as jnp


def cross_entropy_sums(logits, targets, weights, z_loss: float = 0.0):
  """Weighted token cross-entropy.

  Args:
    logits: (..., V) float logits.
    targets: (...) int ids.
    weights: (...) float weights (0 = ignore).
    z_loss: coefficient of log(Z)^2 (PaLM's auxiliary loss keeping the softmax normaliser near 1).

  Returns:
    dict of sums over all positions: 'loss' (weighted -log p(target)), 'z_loss', 'correct'
    (weighted argmax hits) and 'weight' (sum of weights, the denominator).
  """
  logits = logits.astype(jnp.float32)
  weights = weights.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)                                    # (...)
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  nll = log_z - target_logit
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return {'loss': jnp.sum(nll * weights),
          'z_loss': z_loss * jnp.sum(jnp.square(log_z) * weights),
          'correct': jnp.sum(correct * weights),
          'weight': jnp.sum(weights)}
