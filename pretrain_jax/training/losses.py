"""Losses as (sum, denominator) pieces: sum over hosts and microbatches first, divide once."""
import jax
import jax.numpy as jnp


def cross_entropy_sums(logits, targets, weights, z_loss: float = 0.0, top5: bool = False,
                       blockwise_max: bool = False):
  """Weighted token cross-entropy.

  Args:
    logits: (..., V) float logits.
    targets: (...) int ids.
    weights: (...) float weights (0 = ignore).
    z_loss: coefficient of log(Z)^2 (PaLM's auxiliary loss keeping the softmax normaliser near 1).
    blockwise_max: find the row maximum block by block (_first_max; a ModelConfig's
      tuning.blockwise_max): the same sums.

  Returns:
    dict of sums over all positions: 'loss' (weighted -log p(target)), 'z_loss', 'correct'
    (weighted argmax hits), 'weight' (sum of weights, the denominator) and, with `top5`,
    'top5' (weighted hits among the 5 largest logits).

  The row maximum serves both log Z = max + log sum exp(logits - max) and the argmax hit,
  `target == the first index holding the maximum` (jnp.argmax's tie rule; _first_max).
  This reads the logits fewer times than jax.nn.logsumexp plus jnp.argmax's (value, index)
  reduction, with the same loss and bit-identical gradients.
  """
  logits = logits.astype(jnp.float32)
  weights = weights.astype(jnp.float32)
  row_max, first_max = _first_max(jax.lax.stop_gradient(logits), blockwise_max)  # (...), (...)
  shift = jnp.where(jnp.isfinite(row_max), row_max, 0.0)     # all -inf rows: log Z = -inf
  log_z = shift + jnp.log(jnp.sum(jnp.exp(logits - shift[..., None]), axis=-1))
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  nll = log_z - target_logit
  correct = (first_max == targets).astype(jnp.float32)
  out = {'loss': jnp.sum(nll * weights),
         'z_loss': z_loss * jnp.sum(jnp.square(log_z) * weights),
         'correct': jnp.sum(correct * weights),
         'weight': jnp.sum(weights)}
  if top5:
    hits = jnp.any(jax.lax.top_k(logits, 5)[1] == targets[..., None], axis=-1)
    out['top5'] = jnp.sum(hits.astype(jnp.float32) * weights)
  return out


def _first_index(hit):
  """The first True along the last axis (its length where there is none)."""
  index = jax.lax.broadcasted_iota(jnp.int32, hit.shape, hit.ndim - 1)
  return jnp.min(jnp.where(hit, index, hit.shape[-1]), axis=-1)


def _first_max(logits, blockwise: bool):
  """(row maximum, first index holding it) over the last axis, without a (value, index) reduce.

  With `blockwise` (XLA:CPU's choice, tuning/backends.py), the vocabulary is cut into blocks
  (the largest divisor of V in 64..min(V / 2, 512); 32128 = 64 x 502; a V with none is
  searched whole): block maxima give the row maximum, the first block holding it is found among
  the blocks, and only that block's values are searched. So the whole row is read once, by a
  plain max, instead of once more by a compare-and-select the size of the logits. A row holding
  a NaN has a NaN loss (its exp-sum) but an unspecified hit: XLA:CPU's max reduction may drop a
  NaN and return the finite maximum, or -inf (openxla/xla#21461).
  """
  vocab = logits.shape[-1]
  block = next((d for d in range(min(vocab // 2, 512), 63, -1) if vocab % d == 0), vocab)
  if block == vocab or not blockwise:
    row_max = jnp.max(logits, axis=-1)
    return row_max, _first_index(logits == row_max[..., None])
  blocks = logits.reshape(logits.shape[:-1] + (vocab // block, block))
  block_max = jnp.max(blocks, axis=-1)                                       # (..., V / b)
  row_max = jnp.max(block_max, axis=-1)
  first_block = _first_index(block_max == row_max[..., None])
  take = jnp.minimum(first_block, vocab // block - 1)[..., None, None]
  values = jnp.take_along_axis(blocks, take, axis=-2)[..., 0, :]             # (..., b)
  return row_max, first_block * block + _first_index(values == row_max[..., None])


def chunked_cross_entropy_sums(head, hidden, targets, weights, z_loss: float = 0.0,
                               chunk_len: int = 0, top5: bool = False,
                               blockwise_max: bool = False):
  """cross_entropy_sums(head(hidden), ...) without holding all the logits at once.

  The head (hidden -> logits) and the cross-entropy run over `chunk_len` sequence positions
  at a time, under jax.checkpoint: the backward pass recomputes each chunk's logits instead of
  storing the (B, T, V) logits and their softmax, so memory for them drops by T / chunk_len
  at the cost of one more head matmul. Chunks are cut along the sequence, never the batch,
  so a batch-sharded input stays where it is. T is padded up to a multiple of chunk_len with
  zero-weight positions. chunk_len 0 (or >= T) runs the head once.

  Args:
    head: (B, C, E) -> (B, C, V) logits.
    hidden: (B, T, E); targets, weights: (B, T).
    z_loss, top5, blockwise_max: as in cross_entropy_sums.
  """
  if not isinstance(chunk_len, int) or chunk_len < 0:
    raise ValueError(f'loss_chunk_len={chunk_len!r}; expected 0 (the whole sequence at once) '
                     'or a positive number of positions')
  length = hidden.shape[1]
  if chunk_len == 0 or chunk_len >= length:
    return cross_entropy_sums(head(hidden), targets, weights, z_loss, top5, blockwise_max)
  chunks = -(-length // chunk_len)
  pad = chunks * chunk_len - length

  def split(x):                                             # (B, T, ...) -> (n, B, C, ...)
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    x = x.reshape((x.shape[0], chunks, chunk_len) + x.shape[2:])
    return jnp.swapaxes(x, 0, 1)

  @jax.checkpoint
  def chunk_sums(h, t, w):
    return cross_entropy_sums(head(h), t, w, z_loss, top5, blockwise_max)

  def body(total, xs):
    return jax.tree.map(jnp.add, total, chunk_sums(*xs)), None

  zeros = {k: jnp.zeros((), jnp.float32)
           for k in ('loss', 'z_loss', 'correct', 'weight') + (('top5',) if top5 else ())}
  total, _ = jax.lax.scan(body, zeros, (split(hidden), split(targets), split(weights)))
  return total
