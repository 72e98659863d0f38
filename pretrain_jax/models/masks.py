"""Pure attention-mask builders, and the mask as a value the attention paths read.

A dense mask is a bool array, True = the query may see the key; every builder returns shape
(B or 1, 1, T, S) so masks broadcast over heads and combine with `combine_masks`. Models hand
the attention core an `AttentionMask`: the small value those builders are made from (a causal
flag, segment ids, a bidirectional prefix, a bias), which kernels read as it is and the
reference path turns into its dense matrix (`AttentionMask.dense`, `AttentionMask.dense_bias`).
The core never decides causality. A position bias is a value too: T5's `RelativeBias` (a
bucket table) and ALiBi's `AlibiBias` (one slope per head), functions of key position minus
query position that a kernel computes block by block (models/flash.py).

Worked example: two documents packed in one row of length 5 plus padding,
segment_ids = [1, 1, 2, 2, 0], combined with causal_mask(5) gives

    q\\k  0 1 2 3 4
    0    1 0 0 0 0
    1    1 1 0 0 0
    2    0 0 1 0 0
    3    0 0 1 1 0
    4    0 0 0 0 0     <- padding sees nothing (the core returns zeros for this row)
"""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

# The checkpoint name of what the attention kernels' backward reads besides q, k, v: their
# output and its logsumexp (layers.REMAT keeps them, so no policy reruns a forward kernel).
# Here, beside the mask value both kernels read, so neither kernel imports attention.py.
KERNEL_RESIDUALS = 'attention_residuals'


def causal_mask(q_len: int, kv_len: int | None = None, offset=0) -> jnp.ndarray:
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
                 kv_segment_ids: jnp.ndarray | None = None) -> jnp.ndarray:
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


def combine_masks(*masks: jnp.ndarray | None) -> jnp.ndarray | None:
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


def prefix_mask(prefix: jnp.ndarray) -> jnp.ndarray:
  """(B, T) flags of the tokens in their document's prefix -> (B, 1, T, T): both in a prefix.

  With the segment mask and causal_mask it makes the prefix LM's worldview (see AttentionMask).
  """
  p = jnp.asarray(prefix) > 0
  return (p[:, :, None] & p[:, None, :])[:, None]


def relative_position_bucket(relative_position, bidirectional: bool, num_buckets: int,
                             max_distance: int):
  """T5's bucketing of key_pos - query_pos: exact for small distances, log-spaced beyond."""
  buckets = 0
  if bidirectional:
    num_buckets //= 2
    buckets = (relative_position > 0).astype(jnp.int32) * num_buckets
    distance = jnp.abs(relative_position)
  else:
    distance = -jnp.minimum(relative_position, 0)
  max_exact = num_buckets // 2
  is_small = distance < max_exact
  large = max_exact + (jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact)
                       / np.log(max_distance / max_exact)
                       * (num_buckets - max_exact)).astype(jnp.int32)
  large = jnp.minimum(large, num_buckets - 1)
  return buckets + jnp.where(is_small, distance, large)


@flax.struct.dataclass
class RelativeBias:
  """T5's relative position bias as a value: query i and key j add
  table[relative_position_bucket(j - i), head] (in `dtype`) to their logit.

  Fields:
    table: (num_buckets, N) float, the learned bias of each bucket and head.
    bidirectional: buckets for both signs of j - i (the encoder) or only j <= i (the decoder).
    max_distance: the distance from which all keys share the last bucket.
    dtype: the compute dtype the bias is rounded to before it is added (the model's).
  """
  table: jax.Array
  bidirectional: bool = flax.struct.field(pytree_node=False, default=True)
  max_distance: int = flax.struct.field(pytree_node=False, default=128)
  dtype: jnp.dtype = flax.struct.field(pytree_node=False, default=jnp.float32)

  @property
  def num_buckets(self) -> int:
    return self.table.shape[0]

  def buckets(self, relative_position):
    return relative_position_bucket(relative_position, self.bidirectional, self.num_buckets,
                                    self.max_distance)

  def dense(self, q_len: int, kv_len: int, q_offset=0):
    """(1, N, T, S) bias of queries at q_offset + 0..T-1 and keys at 0..S-1 (a one-hot matmul,
    as t5x: its gradient is a matmul, not a scatter-add of T*S rows into the buckets)."""
    q = jnp.arange(q_len) + q_offset
    buckets = self.buckets(jnp.arange(kv_len)[None, :] - q[:, None])             # (T, S)
    one_hot = jax.nn.one_hot(buckets, self.num_buckets, dtype=self.table.dtype)  # (T, S, R)
    bias = jnp.einsum('tsr,rn->nts', one_hot, self.table, precision=jax.lax.Precision.HIGHEST)
    return bias[None].astype(self.dtype)                                        # (1, N, T, S)


@flax.struct.dataclass
class AlibiBias:
  """ALiBi (symmetric, as MosaicBERT) as a value: query i and key j add -slopes[head] * |i - j|
  to their logit; `slopes` (N,) float32 (layers.alibi_slopes)."""
  slopes: jax.Array

  def dense(self, q_len: int, kv_len: int):
    """(1, N, T, S) float32 bias."""
    distance = jnp.abs(jnp.arange(q_len)[:, None] - jnp.arange(kv_len)[None, :])
    return -self.slopes[None, :, None, None] * distance.astype(jnp.float32)[None, None]


BIAS_VALUES = (RelativeBias, AlibiBias)


@flax.struct.dataclass
class AttentionMask:
  """Who may see whom, as a value: what the model's top builds once and every layer reads.

  The effective mask is `segment_mask(q_segment_ids, kv_segment_ids) AND (causal_mask OR
  prefix_mask(prefix)) AND dense_mask`, each part present only when given, and `bias` is added
  to the logits. Kernels read the parts (splash: segment ids and a causal / full block mask;
  flash: those, the prefix and a bias value; cuDNN: the causal flag and sequence lengths);
  `dense()` and `dense_bias()` are the matrices for the paths that materialize one. The four
  worldviews of the chapter are four values:

      BERT       AttentionMask(q_segment_ids=seg)                     bidirectional
      GPT        AttentionMask(q_segment_ids=seg, causal=True)        left to right
      T5         encoder as BERT + relative bias; decoder as GPT + bias; cross-attention
                 AttentionMask(q_segment_ids=dec_seg, kv_segment_ids=enc_seg)
      prefix LM  AttentionMask(q_segment_ids=seg, causal=True, prefix=prefix)

  Worked example (prefix LM): one row, two documents and padding, segment_ids =
  [1, 1, 1, 2, 2, 0], prefix = [1, 1, 0, 1, 0, 0] (the first two tokens of document 1 and the
  first of document 2 are their prompts):

      q\\k  0 1 2 3 4 5
      0    1 1 0 0 0 0     <- a prefix token sees its whole prefix, both ways
      1    1 1 0 0 0 0
      2    1 1 1 0 0 0     <- after the prefix: causal within the document
      3    0 0 0 1 0 0
      4    0 0 0 1 1 0
      5    0 0 0 0 0 0     <- padding sees nothing (the core returns zeros for this row)

  Fields:
    q_segment_ids: (B, T) int, 1-based document ids, 0 = padding; None: one document, no
      padding.
    kv_segment_ids: (B, S) for cross-attention; None: the queries' (self-attention).
    prefix: (B, T) int or bool, nonzero on the leading tokens of each document that see each
      other bidirectionally; only with `causal` self-attention. A prefix is the start of its
      document (the splash path relies on it: a prefix token sees no token after the prefix).
    bias: added to the logits: a value (RelativeBias: T5's relative positions; AlibiBias), which
      the flash kernel computes per block, or a float matrix broadcastable to (B, N, T, S) (a
      stack's bias made dense once), which only paths that materialize the logits read.
    dense_mask: a bool (B|1, 1, T, S) mask ANDed on top, for callers with a matrix (the decode
      cache); only paths that materialize the mask can read it.
    causal: query i sees keys j <= i (static).
  """
  q_segment_ids: jax.Array | None = None
  kv_segment_ids: jax.Array | None = None
  prefix: jax.Array | None = None
  bias: jax.Array | RelativeBias | AlibiBias | None = None
  dense_mask: jax.Array | None = None
  causal: bool = flax.struct.field(pytree_node=False, default=False)

  @property
  def cross(self) -> bool:
    """Keys carry their own segment ids (encoder-decoder attention)."""
    return self.kv_segment_ids is not None

  def check(self) -> None:
    """The combinations the fields' meaning allows; raises ValueError naming the field."""
    if self.prefix is not None and (not self.causal or self.cross):
      raise ValueError(f'AttentionMask.prefix needs causal self-attention; got causal='
                       f'{self.causal}, kv_segment_ids '
                       f'{"given" if self.cross else "None"}')
    if self.cross and self.q_segment_ids is None:
      raise ValueError('AttentionMask.kv_segment_ids needs q_segment_ids (the decoder\'s)')

  @property
  def bias_is_value(self) -> bool:
    """The bias is a value a kernel computes (RelativeBias, AlibiBias), not a matrix."""
    return isinstance(self.bias, BIAS_VALUES)

  def dense_bias(self, q_len: int, kv_len: int):
    """The bias as a float matrix broadcastable to (B, N, T, S), or None."""
    return self.bias.dense(q_len, kv_len) if self.bias_is_value else self.bias

  def segments(self):
    """(q (B, T), kv (B, S)) segment ids, or None where there are none."""
    if self.q_segment_ids is None:
      return None
    return self.q_segment_ids, (self.kv_segment_ids if self.cross else self.q_segment_ids)

  def dense(self, q_len: int, kv_len: int, *, causal: bool | None = None):
    """The bool mask (B|1, 1, T, S) of every part but the bias; None if nothing is hidden.

    `causal=False` leaves the causal part out, for a kernel told it as a flag (the prefix, an
    exception to causality, is kept: with one, causal is never factored out)."""
    self.check()
    causal = self.causal if causal is None else causal
    segments = self.segments()
    mask = segment_mask(*segments) if segments is not None else None
    if causal or self.prefix is not None:
      visible = causal_mask(q_len, kv_len)
      if self.prefix is not None:
        visible = jnp.logical_or(visible, prefix_mask(self.prefix))
      mask = combine_masks(mask, visible)
    return combine_masks(mask, self.dense_mask)

  def rows_that_see(self, q_len: int, kv_len: int):
    """Bool, broadcastable to (B, T, N): query rows that see at least one key (the others
    return zeros), or None when every row does. Self-attention reads it off the segment ids (a
    real token sees itself); cross-attention and dense masks reduce over the keys (fused, never
    stored)."""
    if self.dense_mask is not None:
      return jnp.swapaxes(jnp.any(self.dense(q_len, kv_len), axis=-1), 1, 2)  # (B|1, T, N|1)
    segments = self.segments()
    if segments is None:
      return None
    q, kv = segments
    if not self.cross:
      return (q > 0)[..., None]                                               # (B, T, 1)
    return jnp.any((q[:, :, None] == kv[:, None, :]) & (q[:, :, None] > 0), axis=-1)[..., None]
