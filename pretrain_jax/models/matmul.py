"""x @ w for the dense layers, with a weight gradient XLA:CPU computes in its fast library.

XLA:CPU hands a matmul to YNNPACK when it contracts the LHS's last axis. The weight gradient
x^T @ dy contracts x's FIRST axis (the tokens), so it ran in Eigen's slower path. On CPU,
`matmul` computes it from an explicit transpose of the smaller operand instead, with
optimization barriers so XLA does not fold the transpose back into the dot:
  w (K, F), K <= F:  dw = (x^T) @ dy               (x^T: M x K)
  K > F:             dw = ((dy^T) @ x)^T           (dy^T: F x M; the transposed dw is K x F)
Measured on the 2-core CPU (M 2048, fp32, each including its transpose): (512, 2048) 23.7 ->
22.0 ms, (2048, 512) 27.2 -> 22.5 ms, (512, 512) 6.9 -> 6.2 ms; the benchmark train steps
(scripts/benchmark_hf_flax.py shapes) 3-4% faster. The activation gradient dy @ w^T is the
usual one. Other backends fuse transposes into their GEMMs for free, so there `matmul` is a
plain jnp.dot (the backend is the default one at trace time).
"""
import jax
import jax.numpy as jnp


def matmul(x, w):
  """(M, K) @ (K, F) -> (M, F), as jnp.dot; on CPU with the weight gradient above."""
  if jax.default_backend() == 'cpu':
    return _cpu_matmul(x, w)
  return jnp.dot(x, w)


@jax.custom_vjp
def _cpu_matmul(x, w):
  return jnp.dot(x, w)


def _forward(x, w):
  return jnp.dot(x, w), (x, w)


def _backward(residuals, dy):
  x, w = residuals
  barrier = jax.lax.optimization_barrier
  dx = jax.lax.dot_general(dy, w, (((1,), (1,)), ((), ())))              # dy @ w^T: (M, K)
  if w.shape[0] <= w.shape[1]:
    dw = jnp.dot(barrier(x.T), dy)                                          # (K, M) @ (M, F)
  else:
    dw = barrier(jnp.dot(barrier(dy.T), x)).T                               # ((F, M) @ (M, K))^T
  return dx.astype(x.dtype), dw.astype(w.dtype)


_cpu_matmul.defvjp(_forward, _backward)
