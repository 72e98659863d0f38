"""x @ w for the dense layers, with a weight gradient XLA:CPU computes in its fast library.

XLA:CPU hands a matmul to YNNPACK when it contracts the LHS's last axis. The weight gradient
x^T @ dy contracts the tokens, the FIRST axis of both x and dy, so it would run in Eigen's
slower path. On CPU, `matmul` computes it from explicit transposes instead, choosing the form
that moves the fewest elements, with optimization barriers so XLA does not fold a transpose
back into the dot:
  x^T @ dy  =  (x^T) @ dy           transposes x                  (M x K)
            =  ((dy^T) @ x)^T       transposes dy and the result  (M x F + F x K)
The activation gradient dy @ w^T is the usual one. A tied LM head (embedding.attend) gains
nothing from it, so it stays jnp.dot. Other backends fuse transposes into their GEMMs for free,
so there `matmul` is jnp.dot (the backend is the default one at trace time). Timings:
docs/performance.md.
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
  (m, k), f = x.shape, w.shape[1]
  barrier = jax.lax.optimization_barrier
  dx = jax.lax.dot_general(dy, w, (((1,), (1,)), ((), ())))              # dy @ w^T: (M, K)
  if m * k <= m * f + f * k:
    dw = jnp.dot(barrier(x.T), dy)                                          # (K, M) @ (M, F)
  else:
    dw = barrier(jnp.dot(barrier(dy.T), x)).T                               # ((F, M) @ (M, K))^T
  return dx.astype(x.dtype), dw.astype(w.dtype)


_cpu_matmul.defvjp(_forward, _backward)
