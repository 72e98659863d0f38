"""fp8 dense layers (train.fp8, GPUs of compute capability 8.9 or newer: Ada, Hopper): the
matmul `backends.for_devices` puts in a Tuning when a run opts in.

`matmul` is x @ w with both operands quantized to float8_e4m3fn and the output gradient to
float8_e5m2 (more range, less precision: gradients span more decades than activations), each
with one scale per tensor taken from its own maximum |value| in this step ("current scaling"),
so there is no scale history to keep in the train state or checkpoint. Each operand is
quantized and dequantized (flax.linen.fp8_ops.qdq) right before its dot, the pattern XLA:GPU's
GEMM rewriter turns into one cuBLASLt fp8 GEMM with the scales as its alpha; elsewhere the
same arithmetic runs in the compute dtype, which is what the CPU tests compare. The weight
and input gradients use the quantized operands the forward pass used. The LM head
(embedding.attend, a tied table) stays in the compute dtype: its logits feed the loss.
"""
import jax
import jax.numpy as jnp
from flax.linen import fp8_ops

FORWARD, GRADIENT = jnp.float8_e4m3fn, jnp.float8_e5m2
MIN_COMPUTE_CAPABILITY = 8.9     # the first NVIDIA GPUs with fp8 tensor cores (Ada, Hopper)


def scale_of(x, q_dtype) -> jax.Array:
  """() float32: max|x| / the fp8 type's largest value, so x / scale fills its range (1 for an
  all-zero or non-finite x, whose NaN then shows in the step's finiteness check)."""
  amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
  fp8_max = fp8_ops.get_fp8_max(q_dtype, jnp.float32)
  ok = (amax > 0) & jnp.isfinite(amax)
  return jax.lax.stop_gradient(jnp.where(ok, amax / fp8_max, 1.0))


def qdq(x, q_dtype) -> jax.Array:
  """x rounded to `q_dtype` at its own scale, back in x's dtype."""
  return fp8_ops.qdq(x, q_dtype, scale_of(x, q_dtype), x.dtype)


@jax.custom_vjp
def matmul(x, w):
  """(M, K) @ (K, F) -> (M, F) of the fp8-rounded operands (module docstring)."""
  return jnp.dot(qdq(x, FORWARD), qdq(w, FORWARD))


def _forward(x, w):
  qx, qw = qdq(x, FORWARD), qdq(w, FORWARD)
  return jnp.dot(qx, qw), (qx, qw)


def _backward(residuals, dy):
  qx, qw = residuals
  qdy = qdq(dy, GRADIENT)
  dx = jax.lax.dot_general(qdy, qw, (((1,), (1,)), ((), ())))       # dy @ w^T: (M, K)
  dw = jax.lax.dot_general(qx, qdy, (((0,), (0,)), ((), ())))       # x^T @ dy: (K, F)
  return dx.astype(qx.dtype), dw.astype(qw.dtype)


matmul.defvjp(_forward, _backward)
