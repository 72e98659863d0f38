"""Losses as (sum, denominator) pieces: sum over hosts and microbatches first, divide once."""
import jax
import jax.numpy as jnp


def cross_entropy_sums(logits, targets, weights, z_loss: float = 0.0, top5: bool = False,
                       blockwise_max: bool = False):
  """Weighted token cross-entropy of (..., V) logits against (...) ids, (...) weights (0: none).

  Sums: 'loss' (-log p(target)), 'z_loss' (z_loss * log(Z)^2, PaLM's), 'correct' (argmax
  hits), 'weight' (the denominator), with `top5` 'top5'. One row maximum (_first_max) serves
  log Z and the argmax hit: fewer reads of the logits than logsumexp plus argmax.
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

  `blockwise` (XLA:CPU's tuning) cuts V into blocks (the largest divisor in 64..min(V/2, 512);
  a V with none is searched whole) and searches only the first block holding the maximum, so
  the row is read once by a plain max instead of once more by a compare-and-select. A row with
  a NaN has a NaN loss but an unspecified hit (XLA:CPU's max may drop NaNs, openxla/xla#21461).
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
  """cross_entropy_sums(head(hidden), ...) over `chunk_len` positions at a time (0: at once).

  `head` maps (B, C, E) -> (B, C, V); hidden is (B, T, E), targets and weights (B, T). Each
  chunk runs under jax.checkpoint, so the backward pass recomputes its logits instead of
  keeping all (B, T, V) of them. Chunks cut the sequence, never the (sharded) batch; T is
  padded with zero-weight positions.
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
