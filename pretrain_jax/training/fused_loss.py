"""The LM head and its cross-entropy in one: gradients made in the forward pass, no (T, V) kept.

`fused_cross_entropy_sums(head, targets, weights)` returns what
`losses.cross_entropy_sums(logits of head, targets, weights)` does, with the sums' gradients
computed a chunk of positions at a time while the loss is: each chunk's float32 (B, C, V)
logits give the gradient with respect to the chunk's hidden states and add to the gradient
with respect to the head's kernel (and bias). Those are what the backward pass keeps, and all
it does is scale them by the loss's cotangent: no (B, T, V) array is kept, and the head's
matmul is not computed again (the fused linear cross-entropy of Liger Kernel; Apple's Cut
Cross-Entropy recomputes the logits instead).

The gradient is that of 'loss' + 'z_loss' and comes through 'loss' alone ('z_loss' and the
counts carry none): the one residual serves the sum task.total_loss differentiates.

The kernel's gradient is accumulated per batch shard, (S, E, V) with S over the mesh's batch
axes, and summed once after the last chunk: a sum over the batch inside the loop would make
the partitioner reduce the whole (E, V) gradient across the shards once per chunk.
"""
import functools
import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from pretrain_jax.models import layers
from pretrain_jax.training import losses

CHUNK_LEN = 128   # positions per chunk: the default of train.loss_chunk_len=0


class _Spec(NamedTuple):   # the static arguments (hashable)
  z_loss: float
  chunk_len: int
  top5: bool
  blockwise_max: bool
  vocab_first: bool          # kernel (V, E) (a tied embedding), else (E, V)
  dtype: np.dtype            # the matmuls' operand dtype (the model's compute dtype)
  shards: int                # S: batch shards the kernel's gradient is accumulated over


def fused_cross_entropy_sums(head, targets, weights, *, z_loss: float = 0.0,
                             chunk_len: int = CHUNK_LEN, top5: bool = False,
                             blockwise_max: bool = False):
  """cross_entropy_sums of `head`'s logits (a layers.LMHead: hidden (B, T, E), kernel, bias,
  vocab_first, dtype) against (B, T) targets and weights, `chunk_len` positions at a time.

  Sums: 'loss', 'z_loss', 'correct', 'weight' (+ 'top5'); only 'loss' is differentiable and
  its gradient is that of 'loss' + 'z_loss'. Weights and targets get no gradient.
  """
  if not isinstance(chunk_len, int) or chunk_len <= 0:
    raise ValueError(f'fused loss chunk_len={chunk_len!r}; expected a positive number of '
                     'positions')
  hidden = head.hidden
  if hidden.ndim != 3:
    raise ValueError(f'the fused loss takes (B, T, E) hidden states; got {hidden.shape}')
  spec = _Spec(float(z_loss), min(chunk_len, hidden.shape[1]), bool(top5),
               bool(blockwise_max), bool(head.vocab_first), jnp.dtype(head.dtype),
               _batch_shards(hidden.shape[0]))
  loss, aux = _fused(spec, hidden, head.kernel, head.bias, targets,
                     weights.astype(jnp.float32))
  return {'loss': loss, **jax.lax.stop_gradient(aux)}


def _batch_shards(rows: int) -> int:
  """The number of shards the mesh in context splits the batch into (1 outside a mesh, or
  where they do not divide `rows`)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return 1
  axes = nn.logical_to_mesh_axes(('batch',))[0]
  axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  shards = math.prod(mesh.shape[a] for a in axes if a in mesh.shape)
  return shards if rows % shards == 0 else 1


def _kernel(spec: _Spec, kernel):
  """The kernel in the operand dtype, gathered over fsdp ONCE, before the loop (its vocabulary
  stays split over 'tensor')."""
  names = ('vocab', None) if spec.vocab_first else (None, 'vocab')
  return layers.constrain(kernel.astype(spec.dtype), *names)


def _chunk(spec: _Spec, h, kernel, bias, targets, weights, grads: bool):
  """One chunk (B, C, ...): its sums, and with `grads` the gradient of loss + z-loss with
  respect to h (B, C, E) and its (S, E, V) (or (S, V, E)) share of the kernel's, and (V,)
  of the bias's."""
  h = h.astype(spec.dtype)
  dims = ((2,), (1,)) if spec.vocab_first else ((2,), (0,))
  logits = jax.lax.dot_general(h, kernel, (dims, ((), ())),
                               preferred_element_type=jnp.float32)               # (B, C, V)
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  logits = layers.constrain(logits, 'batch', 'length', 'vocab')
  row_max, first_max = losses._first_max(logits, spec.blockwise_max)
  shift = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
  exp = jnp.exp(logits - shift[..., None])
  total = jnp.sum(exp, axis=-1)
  log_z = shift + jnp.log(total)                                                # (B, C)
  hit = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 2) == targets[..., None]
  target_logit = jnp.sum(jnp.where(hit, logits, 0.0), axis=-1)
  sums = {'loss': jnp.sum((log_z - target_logit) * weights),
          'z_loss': spec.z_loss * jnp.sum(jnp.square(log_z) * weights),
          'correct': jnp.sum((first_max == targets).astype(jnp.float32) * weights),
          'weight': jnp.sum(weights)}
  if spec.top5:
    top = jax.lax.top_k(logits, 5)[1] == targets[..., None]
    sums['top5'] = jnp.sum(jnp.any(top, axis=-1).astype(jnp.float32) * weights)
  if not grads:
    return sums, None
  # d(nll + z_loss * log_z^2) / d logits = (1 + 2 z_loss log_z) softmax - one_hot(target)
  scale = weights * (1.0 + 2.0 * spec.z_loss * log_z)
  d_logits = (exp * (scale / total)[..., None]
              - jnp.where(hit, weights[..., None], 0.0))                         # (B, C, V)
  d_bias = None if bias is None else jnp.sum(d_logits, axis=(0, 1))
  d_logits = d_logits.astype(spec.dtype)
  kernel_dims = ((2,), (0,)) if spec.vocab_first else ((2,), (1,))
  d_h = jax.lax.dot_general(d_logits, kernel, (kernel_dims, ((), ())),
                            preferred_element_type=jnp.float32)                 # (B, C, E)
  rows = h.shape[0] // spec.shards
  h_s = h.reshape((spec.shards, rows) + h.shape[1:])                            # (S, B/S, C, E)
  d_s = d_logits.reshape((spec.shards, rows) + d_logits.shape[1:])              # (S, B/S, C, V)
  contract = ((1, 2), (1, 2))
  d_kernel = (jax.lax.dot_general(d_s, h_s, (contract, ((0,), (0,))),
                                  preferred_element_type=jnp.float32)         # (S, V, E)
              if spec.vocab_first else
              jax.lax.dot_general(h_s, d_s, (contract, ((0,), (0,))),
                                  preferred_element_type=jnp.float32))        # (S, E, V)
  return sums, (d_h, d_kernel, d_bias)


def _run(spec: _Spec, hidden, kernel, bias, targets, weights, grads: bool):
  """Every chunk in a loop: (sums, None) or (sums, (d_hidden, d_kernel, d_bias))."""
  length = hidden.shape[1]
  chunks = -(-length // spec.chunk_len)
  pad = chunks * spec.chunk_len - length
  if pad:       # zero-weight positions: no loss and no gradient
    def padded(x):
      return jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    hidden, targets, weights = padded(hidden), padded(targets), padded(weights)
  kernel = _kernel(spec, kernel)
  kernel_names = ('batch', 'vocab', None) if spec.vocab_first else ('batch', None, 'vocab')

  def chunk(i):
    def cut(x):
      return jax.lax.dynamic_slice_in_dim(x, i * spec.chunk_len, spec.chunk_len, axis=1)
    return _chunk(spec, cut(hidden), kernel, bias, cut(targets), cut(weights), grads)

  if chunks == 1:
    sums, out = chunk(0)
    if out is not None:
      out = (out[0].astype(hidden.dtype)[:, :length], layers.constrain(out[1], *kernel_names),
             out[2])
  else:
    zero_sums = jax.eval_shape(lambda: chunk(0)[0])
    zero_sums = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zero_sums)
    carry = (zero_sums,)
    if grads:
      d_kernel = jnp.zeros((spec.shards,) + kernel.shape, jnp.float32)
      carry += (jnp.zeros(hidden.shape, hidden.dtype), layers.constrain(d_kernel, *kernel_names),
                None if bias is None else jnp.zeros(bias.shape, jnp.float32))

    def body(i, carry):
      sums, out = chunk(i)
      new = (jax.tree.map(jnp.add, carry[0], sums),)
      if grads:
        d_h, d_kernel, d_bias = out
        new += (jax.lax.dynamic_update_slice_in_dim(carry[1], d_h.astype(hidden.dtype),
                                                    i * spec.chunk_len, axis=1),
                layers.constrain(carry[2] + d_kernel, *kernel_names),
                None if bias is None else carry[3] + d_bias)
      return new
    carry = jax.lax.fori_loop(0, chunks, body, carry)
    sums, out = carry[0], (carry[1][:, :length], carry[2], carry[3]) if grads else None
  if out is not None:
    out = (out[0], jnp.sum(out[1], axis=0), out[2])     # the shards' kernel gradients, once
  return sums, out


def _split(sums):
  return sums['loss'], {k: v for k, v in sums.items() if k != 'loss'}


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(spec, hidden, kernel, bias, targets, weights):
  return _split(_run(spec, hidden, kernel, bias, targets, weights, grads=False)[0])


def _fused_forward(spec, hidden, kernel, bias, targets, weights):
  sums, grads = _run(spec, hidden, kernel, bias, targets, weights, grads=True)
  return _split(sums), (grads, jnp.zeros((0,), kernel.dtype),
                        None if bias is None else jnp.zeros((0,), bias.dtype))


def _fused_backward(spec, residuals, cotangents):
  (d_hidden, d_kernel, d_bias), kernel_like, bias_like = residuals
  g = cotangents[0]                     # of 'loss', which stands for loss + z_loss
  d_hidden = (d_hidden.astype(jnp.float32) * g).astype(d_hidden.dtype)
  d_kernel = (d_kernel * g).astype(kernel_like.dtype)
  d_bias = None if d_bias is None else (d_bias * g).astype(bias_like.dtype)
  return d_hidden, d_kernel, d_bias, None, None


_fused.defvjp(_fused_forward, _fused_backward)
