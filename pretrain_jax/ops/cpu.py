"""The XLA:CPU forms that backends.CPU puts in place of the plain ones (docs/performance.md
has what each saves).

`matmul`: x @ w with a weight gradient XLA:CPU computes in its fast library. XLA:CPU hands a
matmul to YNNPACK when it contracts the LHS's last axis. The weight gradient x^T @ dy contracts
the tokens, the FIRST axis of both x and dy, so it would run in Eigen's slower path. `matmul`
computes it from explicit transposes instead, choosing the form that moves the fewest
elements, with optimization barriers so XLA does not fold a transpose back into the dot:
  x^T @ dy  =  (x^T) @ dy           transposes x                  (M x K)
            =  ((dy^T) @ x)^T       transposes dy and the result  (M x F + F x K)
The activation gradient dy @ w^T is the usual one. A tied LM head (embedding.attend) gains
nothing from it, so it stays jnp.dot. Other backends fuse transposes into their GEMMs for free.

`dropout`: a 16-bit keep threshold, mean-preserving exactly. Each element is kept
when its 16 random bits (`jax.random.bits(..., uint16)`) fall below round(keep_prob * 2**16).
The kept values are scaled by 2**16 / threshold, the exact inverse of the realised keep
probability, so the output's expectation equals the input exactly; the realised rate differs
from the nominal one by at most 2**-17, at no more cost than the float32 draws of
`jax.random.bernoulli`. JAX's default partitionable threefry2x32 hashes one counter per element
whatever the width; two 16-bit draws per 32-bit word would halve that, but they change every
mask, and the fine-tuning comparisons in docs/performance.md depend on the masks drawn, so each
element keeps its own draw (and the CPU keeps this stream).

`finite_by_subtraction`: x - x is 0 where x is finite and NaN where it is inf or NaN, so the
sum of x - x over every leaf is 0 exactly when all are finite (zeros cannot overflow). One
float sum per leaf reads each element once, where all(isfinite(x)) goes through XLA:CPU's
slower reduce-window tree for booleans. XLA folds x - x to 0 under fast math (XLA_FLAGS
--xla_cpu_enable_fast_math=true), so backends.CPU uses it only where a compiled probe on a NaN
says it is exact (`subtraction_sees_nan`).

`INIT_COMPILER_OPTIONS`: programs that run once (the train state's init) are compiled at LLVM
optimisation level 1: their compile time is dominated by the threefry fusions of the
parameter initializers, which level 1 compiles much faster while the values stay
bit-identical (tests/test_state_init.py checks all three families). Level 0 would change them
(in the last ulp of normal draws).
"""
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np

INIT_COMPILER_OPTIONS = types.MappingProxyType({'xla_backend_optimization_level': 1})
_BITS = 16


@jax.custom_vjp
def matmul(x, w):
  """(M, K) @ (K, F) -> (M, F), jnp.dot's values, with the weight gradient above."""
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


matmul.defvjp(_forward, _backward)


def keep_mask(rng, keep_prob: float, shape):
  """(mask, scale): bool mask with P(True) = threshold / 2**16 ~= keep_prob; scale = 1 / that."""
  if not 0.0 < keep_prob <= 1.0:
    raise ValueError(f'keep_prob={keep_prob}; expected in (0, 1]')
  threshold = max(1, round(keep_prob * 2 ** _BITS))
  bits = jax.random.bits(rng, shape, jnp.uint16).astype(jnp.uint32)
  return bits < threshold, 2 ** _BITS / threshold


def dropout(x, rng, rate: float):
  """Zero each element of x with probability ~rate and scale the rest to keep the mean."""
  if rate == 0.0:
    return x
  keep, scale = keep_mask(rng, 1.0 - rate, x.shape)
  return jnp.where(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype))


def finite_by_subtraction(leaves) -> jax.Array:
  """() bool: every element of the float arrays `leaves` is finite (exact where
  subtraction_sees_nan())."""
  return jnp.isfinite(sum(jnp.sum(x - x, dtype=jnp.float32) for x in leaves))


@functools.cache
def subtraction_sees_nan() -> bool:
  """Does this process's XLA:CPU keep x - x = NaN for a NaN x (no fast math)? Compiled once per
  process (the XLA flags are fixed at backend start), on a CPU device whatever the default."""
  with jax.ensure_compile_time_eval():   # run now, also when first called inside a trace
    x = jax.device_put(np.asarray([1.0, np.nan], np.float32), jax.local_devices(backend='cpu')[0])
    probe = jax.jit(lambda x: jnp.sum(x - x))(x)
  return bool(np.isnan(np.asarray(probe)))
