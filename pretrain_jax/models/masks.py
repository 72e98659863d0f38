"""Pure attention-mask builders. A mask is a bool array, True = the query may see the key.

Every builder returns shape (B or 1, 1, T, S) so masks broadcast over heads and combine with
`combine_masks`. Models build their masks here and hand them to the attention core; the core
never decides causality.

Worked example: two documents packed in one row of length 5 plus padding,
segment_ids = [1, 1, 2, 2, 0], combined with causal_mask(5) gives

    q\\k  0 1 2 3 4
    0    1 0 0 0 0
    1    1 1 0 0 0
    2    0 0 1 0 0
    3    0 0 1 1 0
    4    0 0 0 0 0     <- padding sees nothing (the core returns zeros for this row)
"""
from typing import Optional

import jax.numpy as jnp


def causal_mask(q_len: int, kv_len: Optional[int] = None, offset=0) -> jnp.ndarray:
  """Query i sees keys j <= i + offset.

  `offset` (scalar or (B,) array) is the index of the first query among the keys, used when
  queries continue a cached prefix. Returns (1, 1, T, S), or (B, 1, T, S) for a (B,) offset.
  """
  kv_len = q_len if kv_len is None else kv_len
  offset = jnp.asarray(offset)
  q = jnp.arange(q_len)[:, None] + offset[..., None, None]  # (T, 1) or (B, T, 1)
  k = jnp.arange(kv_len)[None, :]                           # (1, S)
  mask = k <= q
  return mask[None, None] if mask.ndim == 2 else mask[:, None]


def segment_mask(q_segment_ids: jnp.ndarray,
                 kv_segment_ids: Optional[jnp.ndarray] = None) -> jnp.ndarray:
  """Padding and packing in one: (B, T) x (B, S) 1-based segment ids (0 = padding).

  Query i sees key j iff both are real tokens of the same document. Returns (B, 1, T, S).
  """
  kv_segment_ids = q_segment_ids if kv_segment_ids is None else kv_segment_ids
  q = q_segment_ids[:, :, None]   # (B, T, 1)
  k = kv_segment_ids[:, None, :]  # (B, 1, S)
  return ((q == k) & (q > 0) & (k > 0))[:, None]


def cross_mask(decoder_segment_ids: jnp.ndarray,
               encoder_segment_ids: jnp.ndarray) -> jnp.ndarray:
  """Encoder-decoder attention: decoder token of document d sees encoder tokens of document d.

  (B, T_dec) x (B, T_enc) -> (B, 1, T_dec, T_enc).
  """
  return segment_mask(decoder_segment_ids, encoder_segment_ids)


def combine_masks(*masks: Optional[jnp.ndarray]) -> Optional[jnp.ndarray]:
  """Logical AND of the given masks (None entries are ignored; all None -> None)."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  out = masks[0]
  for m in masks[1:]:
    out = jnp.logical_and(out, m)
  return out


def positions_from_mask(mask) -> jnp.ndarray:
  """(B, T) mask or segment ids (nonzero = real token) -> positions counting real tokens only.

  The one place positions are derived from a padding mask (loading, generation, the decode
  cache): left- and right-padded rows both start at 0; padding gets the last real position
  (or 0), which no real token attends to.
  """
  return jnp.maximum(jnp.cumsum(jnp.asarray(mask) > 0, axis=-1) - 1, 0).astype(jnp.int32)
