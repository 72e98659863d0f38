"""Dropout with a 16-bit keep threshold, mean-preserving exactly.

Each element is kept when its 16 random bits (`jax.random.bits(..., uint16)`) fall below
round(keep_prob * 2**16). The kept values are scaled by 2**16 / threshold, the exact inverse of
the realised keep probability, so the output's expectation equals the input exactly; the
realised rate differs from the nominal one by at most 2**-17.

Speed: when written, 16-bit draws cost a third of `jax.random.bernoulli`'s float32 ones
(philox4x32, a (8, 8, 256, 256) mask on the 2-core XLA:CPU: 31.5 vs 10.8 ms). On jax 0.10.2
(2026-11-24) they save nothing: philox4x32 9.6 ms here vs 7.0-10.4 ms for bernoulli, and
JAX's default partitionable threefry2x32 hashes one counter per element whatever the width
(41.0 vs 43.9 ms). Taking two 16-bit draws from each 32-bit word halves threefry's cost
(18.5 ms; philox 8.5 ms) but changes every mask; measured, that moved the README's fine-tuning
results (T5 on word_order, full vs scratch over seeds 0-2: 0.530 vs 0.525 instead of 0.549 vs
0.508), so it waits until those results no longer hang on the dropout stream.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp

_BITS = 16


def keep_mask(rng, keep_prob: float, shape):
  """(mask, scale): bool mask with P(True) = threshold / 2**16 ~= keep_prob; scale = 1 / that."""
  if not 0.0 < keep_prob <= 1.0:
    raise ValueError(f'keep_prob={keep_prob}; expected in (0, 1]')
  threshold = max(1, round(keep_prob * 2 ** _BITS))
  bits = jax.random.bits(rng, shape, jnp.uint16).astype(jnp.uint32)
  return bits < threshold, 2 ** _BITS / threshold


def dropout(x, rng, rate: float):
  """Zero each element of x with probability ~rate and scale the rest to keep the mean."""
  if rate == 0.0:
    return x
  keep, scale = keep_mask(rng, 1.0 - rate, x.shape)
  return jnp.where(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype))


class Dropout(nn.Dropout):
  """flax.linen.Dropout (same fields and call) drawing its mask with `keep_mask`."""

  @nn.compact
  def __call__(self, inputs, deterministic=None, rng=None):
    deterministic = nn.merge_param('deterministic', self.deterministic, deterministic)
    if self.rate == 0.0 or deterministic:
      return inputs
    if self.broadcast_dims:
      raise ValueError(f'broadcast_dims={self.broadcast_dims}; this Dropout draws one mask '
                       'element per input element')
    return dropout(inputs, self.make_rng(self.rng_collection) if rng is None else rng,
                   self.rate)
