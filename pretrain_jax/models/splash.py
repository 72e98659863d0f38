"""Splash attention (jax.experimental.pallas.ops.tpu.splash_attention) reading an AttentionMask.

The translation, part by part (the kernel runs per row of the batch, heads first):

    causal flag          CausalMask((T, S)) block mask (blocks above the diagonal are skipped),
                         else FullMask((T, S))
    segment ids          SegmentIds(q, kv): a query sees keys of its own id; padding (id 0)
                         sees only padding, rows the core zeroes after
    prefix (prefix LM)   a second call: FullMask with the prefix's ids and -1 / -2 elsewhere,
                         so a prefix query sees exactly its document's prefix; each query row
                         takes the call it belongs to (where(prefix, full, causal)): both
                         calls are exact softmaxes, so outputs and gradients are the dense
                         mask's, for the cost of one full and one causal pass
    bias                 none: splash adds no logit bias (T5's relative bias and ALiBi run on
                         the flash kernel, models/flash.py; attention.runnable_implementation)

Lengths are padded to a multiple of 128 (splash's key blocks are whole TPU lanes) with
segment id 0, which no real token sees. On a mesh, the kernel runs under shard_map over the
batch and head axes the logical rules in context give ('batch', 'heads'; training/step.py
traces the steps with them).
"""
import concurrent.futures
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec as P

from pretrain_jax.models import masks

LANES = 128           # key blocks are multiples of the 128 lanes of a TPU vector register
BLOCKS = (512, 256, 128)  # block sizes tried, largest first (512: MaxText's default)


def padded_length(length: int) -> int:
  return -(-length // LANES) * LANES


def block_size(padded: int) -> int:
  """The largest of BLOCKS dividing a padded length."""
  return next(b for b in BLOCKS if padded % b == 0)


@functools.lru_cache(maxsize=64)
def kernel(kind: str, q_len: int, kv_len: int, heads: int, interpret: bool):
  """A splash kernel for (heads, q_len, H) queries and (heads, kv_len, H) keys; `kind` is
  'causal' or 'full'. Made once per shape: its block maps are numpy work at trace time."""
  shape = (q_len, kv_len)
  block = splash.CausalMask(shape) if kind == 'causal' else splash.FullMask(shape)
  bq, bkv = block_size(q_len), block_size(kv_len)
  sizes = splash.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq,
                            block_kv_dkv=bkv, block_kv_dkv_compute=bkv, block_q_dq=bq,
                            block_kv_dq=bkv)
  # Made in a thread of its own, where no trace is active (JAX's trace state is per thread):
  # its block maps are concrete arrays, so the cached kernel outlives the trace that first asks
  # for it, an nn.scan's too (which ensure_compile_time_eval does not escape).
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    return pool.submit(functools.partial(
        splash.make_splash_mha, splash.MultiHeadMask([block] * heads), block_sizes=sizes,
        head_shards=1, q_seq_shards=1, interpret=interpret,
        residual_checkpoint_name=masks.KERNEL_RESIDUALS)).result()


def calls(mask, lengths, padded):
  """The kernel calls that make `mask` for (T, S) = `lengths` padded to `padded`:
  ([(kind, q ids (B|1, T'), kv ids (B|1, S'))], the (B, T') rows that take the second call or
  None)."""
  segments = mask.segments()
  if segments is None:
    segments = tuple(jnp.ones((1, n), jnp.int32) for n in lengths)
  q_ids, kv_ids = (_pad(s.astype(jnp.int32), n) for s, n in zip(segments, padded, strict=True))
  out = [('causal' if mask.causal else 'full', q_ids, kv_ids)]
  if mask.prefix is None:
    return out, None
  prefix = _pad(jnp.asarray(mask.prefix) > 0, padded[0])
  out.append(('full', jnp.where(prefix, q_ids, -1), jnp.where(prefix, kv_ids, -2)))
  return out, prefix


def attention(query, key, value, mask, scale, *, interpret: bool):
  """(B, T, N, H) queries, (B, S, N, H) keys and values -> (B, T, N, H); `mask` an
  AttentionMask without bias or dense part (attention.kernel_readable)."""
  b, t, s = query.shape[0], query.shape[1], key.shape[1]
  tp, sp = padded_length(t), padded_length(s)
  def heads_first(x, length):
    return jnp.swapaxes(_pad(x, length), 1, 2)  # (B, N, L, H)
  q = heads_first(query * jnp.asarray(scale, query.dtype), tp)
  k, v = heads_first(key, sp), heads_first(value, sp)
  parts, prefix = calls(mask, (t, s), (tp, sp))
  outs = []
  for kind, q_ids, kv_ids in parts:
    q_ids, kv_ids = (jnp.broadcast_to(x, (b, x.shape[1])) for x in (q_ids, kv_ids))
    outs.append(_sharded(kind, q, k, v, q_ids, kv_ids, interpret))
  out = outs[0] if prefix is None else jnp.where(prefix[:, None, :, None], outs[1], outs[0])
  return jnp.swapaxes(out, 1, 2)[:, :t].astype(query.dtype)


def _sharded(kind, q, k, v, q_ids, kv_ids, interpret):
  def local(q, k, v, q_ids, kv_ids):
    run = kernel(kind, q.shape[2], k.shape[2], q.shape[1], interpret)
    return jax.vmap(run)(q, k, v, segment_ids=splash.SegmentIds(q_ids, kv_ids))

  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return local(q, k, v, q_ids, kv_ids)
  batch, heads = nn.logical_to_mesh_axes(('batch', 'heads'))
  rows, per_head = P(batch, None), P(batch, heads, None, None)
  return jax.shard_map(local, mesh=mesh, in_specs=(per_head,) * 3 + (rows, rows),
                       out_specs=per_head, check_vma=False)(q, k, v, q_ids, kv_ids)


def _pad(x, length: int):
  """Pad axis 1 of x to `length` with zeros (segment id 0: padding)."""
  return jnp.pad(x, [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2))
