"""Dropout with a 16-bit keep threshold, mean-preserving exactly.

Each element is kept when its 16 random bits (`jax.random.bits(..., uint16)`) fall below
round(keep_prob * 2**16). The kept values are scaled by 2**16 / threshold, the exact inverse of
the realised keep probability, so the output's expectation equals the input exactly; the
realised rate differs from the nominal one by at most 2**-17.

Why 16 bits: they give an exact keep rate (above) at no more cost than the float32 draws of
`jax.random.bernoulli`. JAX's default partitionable threefry2x32 hashes one counter per element
whatever the width, so the width alone does not make threefry cheaper; two 16-bit draws per
32-bit word would, but they change every mask, and the fine-tuning comparisons in
docs/performance.md depend on the masks drawn, so each element keeps its own draw.
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
