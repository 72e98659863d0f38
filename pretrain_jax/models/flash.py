"""The flash path: a Pallas TPU attention kernel (models/flash_kernels.py) that reads the whole
AttentionMask value, the bias included, so no (T, S) tensor leaves it in either pass.

The translation, part by part:

    causal flag          key position <= query position, per block; blocks above the
                         diagonal are skipped (not with a prefix, which sees past it)
    segment ids          a query sees keys of its own id; padding (id 0) sees only padding,
                         rows the core zeroes after
    prefix (prefix LM)   the prefix tokens' ids negated: a query and a key of one document
                         that are both in its prefix see each other both ways
    RelativeBias (T5)    the bias at every relative position key - query in [-clip, clip],
                         clip = max(max_distance, num_buckets) (the buckets are constant
                         beyond it): table[relative_position_bucket(offset)], the model's own
                         function and rounding, as an (N, C, 128) per-head table the kernel
                         looks up; its gradient comes back summed per offset (per diagonal
                         of each block) from the dq kernel and reaches the (buckets, N)
                         table through that gather
    AlibiBias            -slope * |key - query| per head

Queries are scaled before the kernel; lengths are padded to a multiple of 128 with segment id
0, and blocks are splash's (the largest of 512 / 256 / 128 dividing the padded length). On a
mesh each kernel runs under shard_map over the batch and head axes of the logical rules in
context (as splash does); the table's gradient is summed over the batch after.
"""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from pretrain_jax.models import flash_kernels as fk
from pretrain_jax.models import masks, splash

F32 = jnp.float32


def attention(query, key, value, mask, scale, *, interpret: bool):
  """(B, T, N, H) queries, (B, S, N, H) keys and values -> (B, T, N, H); `mask` an
  AttentionMask without a dense part (attention.kernel_readable)."""
  b, t, n, _ = query.shape
  s = key.shape[1]
  tp, sp = splash.padded_length(t), splash.padded_length(s)
  q = _heads_first(query * jnp.asarray(scale, query.dtype), tp)
  k, v = _heads_first(key, sp), _heads_first(value, sp)
  q_ids, kv_ids = (jnp.broadcast_to(x, (b, x.shape[1]))[:, None]
                   for x in segment_ids(mask, (t, s), (tp, sp)))     # (B, 1, L)
  kind, clip, table = bias_table(mask.bias, n)
  spec = fk.Spec(causal=mask.causal, prefix=mask.prefix is not None, bias=kind, clip=clip,
                 block_q=splash.block_size(tp), block_kv=splash.block_size(sp), q_len=tp,
                 kv_len=sp)
  out = _attend(spec, interpret, q, k, v, q_ids, kv_ids, table)
  return jnp.swapaxes(out, 1, 2)[:, :t].astype(query.dtype)


def segment_ids(mask, lengths, padded):
  """(q (B|1, T'), kv (B|1, S')) int32 ids padded with 0; prefix tokens' ids negated."""
  segments = mask.segments()
  if segments is None:
    segments = tuple(jnp.ones((1, n), jnp.int32) for n in lengths)
  q, kv = (_pad(x.astype(jnp.int32), n) for x, n in zip(segments, padded, strict=True))
  if mask.prefix is None:
    return q, kv
  prefix = _pad(jnp.asarray(mask.prefix) > 0, padded[0])
  q = jnp.where(prefix, -q, q)
  return q, q


def bias_table(bias, heads: int):
  """(kind, clip, (N, C, 128) float32 per-head table) of a bias value (flash_kernels reads
  it): T5's bias at offsets -clip..clip in lanes, ALiBi's -slope in lane 0."""
  if bias is None:
    return '', 0, jnp.zeros((heads, 1, fk.LANES), F32)
  if isinstance(bias, masks.AlibiBias):
    _check_heads('AlibiBias.slopes', bias.slopes.shape[0], heads)
    slopes = -jnp.asarray(bias.slopes, F32)
    return 'alibi', 0, jnp.broadcast_to(slopes[:, None, None], (heads, 1, fk.LANES))
  if not isinstance(bias, masks.RelativeBias):
    raise ValueError(f'the flash kernel reads a bias value (masks.RelativeBias or '
                     f'masks.AlibiBias); got {type(bias).__name__}')
  _check_heads('RelativeBias.table', bias.table.shape[1], heads)
  clip = max(bias.max_distance, bias.num_buckets)
  values = bias.table[bias.buckets(jnp.arange(-clip, clip + 1))]     # (2 * clip + 1, N)
  values = values.astype(bias.dtype).astype(F32).T                   # rounded as the model's
  chunks = -(-(2 * clip + 1) // fk.LANES)
  values = jnp.pad(values, [(0, 0), (0, chunks * fk.LANES - values.shape[1])])
  return 'relative', clip, values.reshape(heads, chunks, fk.LANES)


def _check_heads(what: str, got: int, heads: int) -> None:
  if got != heads:
    raise ValueError(f'{what} has {got} heads; the queries have {heads}')


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _attend(spec, interpret, q, k, v, q_ids, kv_ids, table):
  return _forward(spec, interpret, q, k, v, q_ids, kv_ids, table)[0]


def _forward(spec, interpret, q, k, v, q_ids, kv_ids, table):
  return _sharded(functools.partial(fk.forward, spec, interpret=interpret),
                  (q, k, v, q_ids, kv_ids, table),
                  ('heads', 'heads', 'heads', 'ids', 'ids', 'table'), ('heads', 'rows'))


def _attend_forward(spec, interpret, q, k, v, q_ids, kv_ids, table):
  out, lse = (checkpoint_name(x, masks.KERNEL_RESIDUALS)
              for x in _forward(spec, interpret, q, k, v, q_ids, kv_ids, table))
  return out, (q, k, v, q_ids, kv_ids, table, out, lse)


def _attend_backward(spec, interpret, residuals, do):
  q, k, v, q_ids, kv_ids, table, out, lse = residuals
  di = jnp.sum(out.astype(F32) * do.astype(F32), axis=-1)           # (B, N, T')
  args = (q, k, v, do, lse, di, q_ids, kv_ids, table)
  kinds = ('heads',) * 4 + ('rows', 'rows', 'ids', 'ids', 'table')
  dk, dv = _sharded(functools.partial(fk.backward_dkv, spec, interpret=interpret), args,
                    kinds, ('heads', 'heads'))
  relative = spec.bias == 'relative'
  dq, sums = _sharded(functools.partial(fk.backward_dq, spec, interpret=interpret), args,
                      kinds, ('heads', 'sums') if relative else ('heads', None))
  dtable = offset_sums_to_table(spec, sums, table.shape) if relative else jnp.zeros_like(table)
  return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, dtable)


_attend.defvjp(_attend_forward, _attend_backward)


def offset_sums_to_table(spec, sums, shape):
  """The dq kernel's (B, N, nq, nk, 1, W) per-block offset sums -> the gradient of the
  (N, C, 128) table: each lane's offset (flash_kernels.backward_dq), clipped as the forward
  clips it."""
  i, j, u = np.meshgrid(np.arange(spec.grid_q), np.arange(spec.grid_kv),
                        np.arange(spec.roll_width), indexing='ij')
  offset = j * spec.block_kv - i * spec.block_q + u - (spec.block_q - 1)
  index = np.clip(offset, -spec.clip, spec.clip) + spec.clip                 # (nq, nk, W)
  per_head = jnp.sum(sums, axis=(0, 4)).reshape(shape[0], -1)               # (N, nq*nk*W)
  grads = jnp.zeros((shape[0], shape[1] * shape[2]), F32).at[:, index.ravel()].add(per_head)
  return grads.reshape(shape)


def _sharded(fn, args, in_kinds, out_kinds):
  """fn(*args) under shard_map over the batch and head axes the logical rules in context give,
  each argument and result split as its kind says (None: a result that is None)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return fn(*args)
  batch, heads = nn.logical_to_mesh_axes(('batch', 'heads'))
  specs = {'heads': P(batch, heads, None, None), 'rows': P(batch, heads, None),
           'ids': P(batch, None, None), 'table': P(heads, None, None),
           'sums': P(batch, heads, None, None, None, None), None: None}
  return jax.shard_map(fn, mesh=mesh, in_specs=tuple(specs[x] for x in in_kinds),
                       out_specs=tuple(specs[x] for x in out_kinds),
                       check_vma=False)(*args)


def _heads_first(x, length: int):
  """(B, L, N, H) -> (B, N, L', H), padded to `length`."""
  return jnp.swapaxes(_pad(x, length), 1, 2)


def _pad(x, length: int):
  """Pad axis 1 of x to `length` with zeros (segment id 0: padding)."""
  return jnp.pad(x, [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2))
