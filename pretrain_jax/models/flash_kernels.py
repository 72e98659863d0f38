"""The Pallas TPU kernels of the flash path (models/flash.py): forward, dq and dk/dv, each a
grid over (row, head, block, block) with an online softmax over key blocks (FlashAttention-2).

Every kernel computes a block's visibility and bias from positions, ids and a small per-head
table, never reading a (T, S) tensor:

    visibility  segment ids equal (0 = padding; the prefix LM's prefix tokens carry the negated
                id), and with `causal` key position <= query position or both in a prefix
    bias        'relative': the (C, 128) per-head table of the bias at each relative position
                key - query, clipped to [-clip, clip] (T5's buckets saturate beyond
                max_distance), looked up 128 lanes at a time; 'alibi': the per-head -slope
                (lane 0 of the table) times |key - query|

With a relative bias the dq kernel also sums each block's logit gradient per offset (one
diagonal of the block each, `diagonal_sums`), (B, N, nq, nk, 1, W), from which flash.py adds up
the table's gradient. Blocks above the diagonal of a causal mask without a prefix are skipped,
their index maps repeating the last block fetched so that no copy is issued.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

LANES = 128
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)  # finite: a fully hidden row stays NaN-free
NT = (((1,), (1,)), ((), ()))                         # x @ y.T
NN = (((1,), (0,)), ((), ()))                         # x @ y
F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Spec:
  """What a call computes, static: the mask's causal flag and prefix, the bias kind ('',
  'relative' or 'alibi') and its clip, the blocks and the padded lengths."""
  causal: bool
  prefix: bool
  bias: str
  clip: int
  block_q: int
  block_kv: int
  q_len: int
  kv_len: int

  @property
  def skips(self) -> bool:
    """Blocks wholly above the diagonal are skipped (a prefix sees past it)."""
    return self.causal and not self.prefix

  @property
  def grid_q(self) -> int:
    return self.q_len // self.block_q

  @property
  def grid_kv(self) -> int:
    return self.kv_len // self.block_kv

  @property
  def roll_width(self) -> int:
    """Lanes of the dq kernel's offset sums: every diagonal of a (bq, bkv) block."""
    return self.block_q + self.block_kv

  def last_kv_block(self, i):
    """The last key block that query block i sees under a causal mask."""
    return _divide((i + 1) * self.block_q - 1, self.block_kv)

  def first_q_block(self, j):
    """The first query block that sees key block j under a causal mask."""
    return _divide(j * self.block_kv, self.block_q)


def _divide(x, d: int):
  """x // d for x >= 0, as a truncating division (floor division's sign test has no
  ahead-of-time Mosaic lowering)."""
  return jax.lax.div(x, jnp.int32(d))


def visible(spec: Spec, q_ids, kv_ids, q_pos, k_pos):
  """Bool, broadcast of the (rows, 1) / (1, cols) operands: the query sees the key."""
  if spec.prefix:
    same = jnp.abs(q_ids) == jnp.abs(kv_ids)
    return same & ((k_pos <= q_pos) | ((q_ids < 0) & (kv_ids < 0)))
  same = q_ids == kv_ids
  return same & (k_pos <= q_pos) if spec.causal else same


def bias_block(spec: Spec, table_ref, offsets):
  """(rows, cols) int32 key - query offsets -> (rows, cols) float32 bias of this head."""
  if spec.bias == 'alibi':
    return table_ref[0:1, 0:1] * jnp.abs(offsets).astype(F32)
  index = jnp.clip(offsets, -spec.clip, spec.clip) + spec.clip   # [0, 2 * clip]
  chunks = []
  for start in range(0, offsets.shape[1], LANES):    # a lane gather reads one vreg's 128 lanes
    part = index[:, start:start + LANES]
    lane, chunk = jnp.bitwise_and(part, LANES - 1), jnp.right_shift(part, 7)  # 128 = 2**7
    out = None
    for c in range(table_ref.shape[0]):
      row = jnp.broadcast_to(table_ref[c:c + 1, :], part.shape)
      found = jnp.take_along_axis(row, lane, axis=1, mode='promise_in_bounds')
      out = found if out is None else jnp.where(chunk == c, found, out)
    chunks.append(out)
  return chunks[0] if len(chunks) == 1 else jnp.concatenate(chunks, axis=1)


def logits(spec: Spec, a, b, table_ref, a_ids, b_ids, a_pos, b_pos, keys_first: bool):
  """a @ b.T with bias and mask; rows are keys when `keys_first` (the dk/dv kernel)."""
  s = jax.lax.dot_general(a, b, NT, preferred_element_type=F32)
  q_ids, kv_ids, q_pos, k_pos = ((b_ids, a_ids, b_pos, a_pos) if keys_first
                                 else (a_ids, b_ids, a_pos, b_pos))
  if spec.bias:
    s = s + bias_block(spec, table_ref, k_pos - q_pos)
  return jnp.where(visible(spec, q_ids, kv_ids, q_pos, k_pos), s, MASK_VALUE)


def positions(shape, axis: int, start):
  """Absolute positions along `axis` of a block starting at `start`."""
  return start + jax.lax.broadcasted_iota(jnp.int32, shape, axis)


def diagonal_sums(x, width: int):
  """(rows, cols) -> (1, width) sums of its diagonals, width >= rows + cols: lane u sums the
  entries of column - row = u - (rows - 1).

  Row r is rolled right by rows - 1 - r, which puts every diagonal in one lane (the zero lanes
  past the block take the wrap), then the rows are summed. The roll is static, eight rows (one
  vreg) at a time, then one row of the eight at a time: Mosaic's strided roll would do it in one
  step, but only on v5 and later."""
  rows, cols = x.shape
  x = jnp.concatenate([x, jnp.zeros((rows, width - cols), x.dtype)], axis=1)
  groups = x[rows - 8:rows]
  for start in range(0, rows - 8, 8):
    groups = groups + pltpu.roll(x[start:start + 8], rows - 8 - start, 1)
  out = groups[7:8]
  for r in range(7):
    out = out + pltpu.roll(groups[r:r + 1], 7 - r, 1)
  return out


def column(ref):
  """A (1, n) row block of a ref -> its (n, 1) column."""
  return jnp.expand_dims(ref[0], -1)


def _forward_kernel(q_ref, k_ref, v_ref, qid_ref, kid_ref, table_ref, o_ref, lse_ref,
                    m_ref, l_ref, acc_ref, *, spec: Spec):
  i, j = pl.program_id(2), pl.program_id(3)
  bq, bk = spec.block_q, spec.block_kv

  @pl.when(j == 0)
  def start():
    m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, F32)
    l_ref[...] = jnp.zeros(l_ref.shape, F32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, F32)

  @pl.when(j <= spec.last_kv_block(i) if spec.skips else True)
  def run():
    shape = (bq, bk)
    s = logits(spec, q_ref[...], k_ref[...], table_ref, column(qid_ref), kid_ref[...],
               positions(shape, 0, i * bq), positions(shape, 1, j * bk), keys_first=False)
    m_prev, l_prev = m_ref[...], l_ref[...]                          # (bq, 128) each
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    p = jnp.exp(s - m_next[:, :1])
    alpha = jnp.exp(m_prev - m_next)
    m_ref[...] = m_next
    l_ref[...] = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
    v = v_ref[...]
    acc_ref[...] = acc_ref[...] * alpha[:, :1] + jax.lax.dot_general(
        p.astype(v.dtype), v, NN, preferred_element_type=F32)

  @pl.when(j == spec.grid_kv - 1)
  def finish():
    total = l_ref[...]
    o_ref[...] = (acc_ref[...] / total[:, :1]).astype(o_ref.dtype)
    lse_ref[...] = m_ref[...] + jnp.log(total)


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, qid_ref, kid_ref, table_ref,
               dq_ref, *rest, spec: Spec):
  """`rest` is (offset sums ref, dq scratch) with a relative bias, else (dq scratch)."""
  offsets_ref, acc_ref = rest if len(rest) == 2 else (None, rest[0])
  i, j = pl.program_id(2), pl.program_id(3)
  bq, bk = spec.block_q, spec.block_kv
  runs = j <= spec.last_kv_block(i) if spec.skips else True

  @pl.when(j == 0)
  def start():
    acc_ref[...] = jnp.zeros(acc_ref.shape, F32)

  @pl.when(runs)
  def run():
    shape = (bq, bk)
    k = k_ref[...]
    s = logits(spec, q_ref[...], k, table_ref, column(qid_ref), kid_ref[...],
               positions(shape, 0, i * bq), positions(shape, 1, j * bk), keys_first=False)
    p = jnp.exp(s - column(lse_ref))
    v = v_ref[...]
    dp = jax.lax.dot_general(do_ref[...].astype(v.dtype), v, NT, preferred_element_type=F32)
    ds = p * (dp - column(di_ref))
    acc_ref[...] += jax.lax.dot_general(ds.astype(k.dtype), k, NN, preferred_element_type=F32)
    if offsets_ref is not None:
      offsets_ref[...] = diagonal_sums(ds, spec.roll_width)

  if offsets_ref is not None:
    @pl.when(jnp.logical_not(runs))
    def skipped():
      offsets_ref[...] = jnp.zeros(offsets_ref.shape, F32)

  @pl.when(j == spec.grid_kv - 1)
  def finish():
    dq_ref[...] = acc_ref[...].astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, qid_ref, kid_ref, table_ref,
                dk_ref, dv_ref, dk_acc, dv_acc, *, spec: Spec):
  """Keys are the rows of every block (k @ q.T), so the query's log-sum-exp and dO.O are rows."""
  j, i = pl.program_id(2), pl.program_id(3)
  bq, bk = spec.block_q, spec.block_kv

  @pl.when(i == 0)
  def start():
    dk_acc[...] = jnp.zeros(dk_acc.shape, F32)
    dv_acc[...] = jnp.zeros(dv_acc.shape, F32)

  @pl.when(i >= spec.first_q_block(j) if spec.skips else True)
  def run():
    shape = (bk, bq)
    q, do = q_ref[...], do_ref[...]
    s = logits(spec, k_ref[...], q, table_ref, column(kid_ref), qid_ref[...],
               positions(shape, 0, j * bk), positions(shape, 1, i * bq), keys_first=True)
    p = jnp.exp(s - lse_ref[...])                                    # (bk, bq)
    v = v_ref[...]
    dv_acc[...] += jax.lax.dot_general(p.astype(do.dtype), do, NN, preferred_element_type=F32)
    dp = jax.lax.dot_general(v, do.astype(v.dtype), NT, preferred_element_type=F32)
    ds = p * (dp - di_ref[...])
    dk_acc[...] += jax.lax.dot_general(ds.astype(q.dtype), q, NN, preferred_element_type=F32)

  @pl.when(i == spec.grid_q - 1)
  def finish():
    dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
    dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def _first(x, y):
  """The index map of a block read at the first of the two inner grid indices."""
  del y
  return x


def _clamped(spec: Spec, inner: str):
  """The index map of the innermost grid axis: key blocks (`inner` 'kv', grid (q, kv)) or
  query blocks ('q', grid (kv, q)); under a causal skip a skipped step repeats the nearest
  block that runs, so that no copy is issued for it."""
  if not spec.skips:
    return lambda x, y: y
  if inner == 'kv':
    return lambda i, j: jnp.minimum(j, spec.last_kv_block(i))
  return lambda j, i: jnp.maximum(i, spec.first_q_block(j))


def _params():
  return pltpu.CompilerParams(
      dimension_semantics=('parallel', 'parallel', 'parallel', 'arbitrary'))


def _rows(block: int, index, width: int):
  """BlockSpec of a (B, N, L, width) array in (block, width) tiles, tile `index(grid ids)`."""
  return pl.BlockSpec((None, None, block, width),
                      lambda b, h, x, y: (b, h, index(x, y), 0))


def _ids(block: int, index):
  """BlockSpec of (B, 1, L) ids in (1, block) rows."""
  return pl.BlockSpec((None, 1, block), lambda b, h, x, y: (b, 0, index(x, y)))


def _head_rows(block: int, index):
  return pl.BlockSpec((None, None, 1, block), lambda b, h, x, y: (b, h, 0, index(x, y)))


def _table(table):
  return pl.BlockSpec((None,) + table.shape[1:], lambda b, h, x, y: (h, 0, 0))


def forward(spec: Spec, q, k, v, q_ids, kv_ids, table, interpret: bool):
  """(B, N, T', H) q (scaled), k, v (B, N, S', H), ids (B, 1, T') / (B, 1, S'), table
  (N, C, 128) -> out (B, N, T', H), log-sum-exp (B, N, T') float32."""
  b, n, _, hd = q.shape
  bq, bk = spec.block_q, spec.block_kv
  kv_block = _clamped(spec, 'kv')
  out, lse = pl.pallas_call(
      functools.partial(_forward_kernel, spec=spec),
      grid=(b, n, spec.grid_q, spec.grid_kv),
      in_specs=[_rows(bq, _first, hd), _rows(bk, kv_block, hd), _rows(bk, kv_block, hd),
                _ids(bq, _first), _ids(bk, kv_block), _table(table)],
      out_specs=[_rows(bq, _first, hd), _rows(bq, _first, LANES)],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, n, spec.q_len, LANES), F32)],
      scratch_shapes=[pltpu.VMEM((bq, LANES), F32), pltpu.VMEM((bq, LANES), F32),
                      pltpu.VMEM((bq, hd), F32)],
      compiler_params=_params(), interpret=interpret, name='flash_forward',
  )(q, k, v, q_ids, kv_ids, table)
  return out, lse[..., 0]


def backward_dq(spec: Spec, q, k, v, do, lse, di, q_ids, kv_ids, table, interpret: bool):
  """dq (B, N, T', H) float32, and with a relative bias the per-block offset sums of the logit
  gradient (B, N, nq, nk, 1, W): lane u of block (i, j) sums the offset
  key - query = j * bk - i * bq + u - (bq - 1)."""
  b, n, _, hd = q.shape
  bq, bk = spec.block_q, spec.block_kv
  rows, kv_block = _first, _clamped(spec, 'kv')
  out_specs = [_rows(bq, rows, hd)]
  out_shape = [jax.ShapeDtypeStruct(q.shape, F32)]
  if spec.bias == 'relative':
    w = spec.roll_width
    out_specs.append(pl.BlockSpec((None, None, None, None, 1, w),
                                  lambda b, h, i, j: (b, h, i, j, 0, 0)))
    out_shape.append(jax.ShapeDtypeStruct((b, n, spec.grid_q, spec.grid_kv, 1, w), F32))
  outs = pl.pallas_call(
      functools.partial(_dq_kernel, spec=spec),
      grid=(b, n, spec.grid_q, spec.grid_kv),
      in_specs=[_rows(bq, rows, hd), _rows(bk, kv_block, hd), _rows(bk, kv_block, hd),
                _rows(bq, rows, hd), _head_rows(bq, rows), _head_rows(bq, rows),
                _ids(bq, rows), _ids(bk, kv_block), _table(table)],
      out_specs=out_specs, out_shape=out_shape,
      scratch_shapes=[pltpu.VMEM((bq, hd), F32)],
      compiler_params=_params(), interpret=interpret, name='flash_dq',
  )(q, k, v, do, lse[:, :, None], di[:, :, None], q_ids, kv_ids, table)
  return outs[0], (outs[1] if len(outs) == 2 else None)


def backward_dkv(spec: Spec, q, k, v, do, lse, di, q_ids, kv_ids, table, interpret: bool):
  """(dk, dv) (B, N, S', H) float32."""
  b, n, _, hd = k.shape
  bq, bk = spec.block_q, spec.block_kv
  q_block, cols = _clamped(spec, 'q'), _first
  return pl.pallas_call(
      functools.partial(_dkv_kernel, spec=spec),
      grid=(b, n, spec.grid_kv, spec.grid_q),
      in_specs=[_rows(bq, q_block, hd), _rows(bk, cols, hd), _rows(bk, cols, hd),
                _rows(bq, q_block, hd), _head_rows(bq, q_block), _head_rows(bq, q_block),
                _ids(bq, q_block), _ids(bk, cols), _table(table)],
      out_specs=[_rows(bk, cols, hd), _rows(bk, cols, hd)],
      out_shape=[jax.ShapeDtypeStruct(k.shape, F32), jax.ShapeDtypeStruct(v.shape, F32)],
      scratch_shapes=[pltpu.VMEM((bk, hd), F32), pltpu.VMEM((bk, hd), F32)],
      compiler_params=_params(), interpret=interpret, name='flash_dkv',
  )(q, k, v, do, lse[:, :, None], di[:, :, None], q_ids, kv_ids, table)
