"""What the model and the train step compute differently on one backend: one `Tuning` record,
chosen once per step by `for_device` (training.step.make_steps binds its steps to it: the ops
package docstring says how; state.run_once asks `for_platform` for programs that run once).

PLAIN is the form outside any binding: jnp.dot, flax.linen.Dropout's masks, one (1, N, T, S)
bias for all rows, a whole-row maximum in the loss, all(isfinite) for the state check, and
attention paths for JAX's default backend (`platform` ''). for_platform gives GPUs and TPUs the
same with their platform named, so the attention core picks its path for the step's devices.
CPU swaps in XLA:CPU's faster forms (ops/cpu.py). Every CPU form computes the plain form's
values except dropout, whose 16-bit masks are another random stream (the CPU runs in docs/ were
made with it, so on CPU it stays).

`bias_per_row` (T5's relative position bias on the reference attention path): broadcast the
(1, N, T, S) bias to (B, N, T, S) once per stack. Every layer adds the same bias; broadcast
inside each layer, the backward pass reduces each layer's (B, N, T, S) logit gradient over B
separately (one slow XLA:CPU reduction per layer); broadcast once, the layers' gradients are
summed first and reduced once, as in HF's T5. The reference path materializes per-row logits
anyway. jax.nn.dot_product_attention ('xla', 'cudnn') keeps the (1, N, T, S) bias, so cuDNN is
never handed a per-row bias and gradient it would otherwise reduce over the batch itself.

`matmul` with train.fp8 (`for_device`): every dense layer in fp8 on GPUs that have fp8 tensor
cores (ops/fp8.py); refused on other devices, where it would only emulate the rounding.

`blockwise_max` (training/losses.py): the loss finds each row's maximum block by block, so the
row is read once by a plain max. Not on accelerators: a vocabulary-sharded (tensor-parallel)
row would be resharded by the block reshape and gather, and the whole-row search is one more
fused reduction there.
"""
import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from pretrain_jax.ops import cpu, fp8


def flax_dropout(x, rng, rate: float):
  """PLAIN's dropout: flax.linen.Dropout(rate)'s mask and scale with the key `rng`, as its
  __call__ draws them (a function, so no module is made inside the caller's)."""
  if rate == 1.0:
    return jnp.zeros_like(x)
  keep_prob = 1.0 - rate
  keep = jax.random.bernoulli(rng, p=keep_prob, shape=x.shape)
  return jax.lax.select(keep, x / keep_prob, jnp.zeros_like(x))


def float_leaves(tree) -> list:
  """The floating-point leaves of `tree`, complex ones as their real and imaginary parts."""
  return [part for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)
          for part in ((x.real, x.imag) if jnp.iscomplexobj(x) else (x,))]


def all_finite(tree) -> jax.Array:
  """() bool: every floating-point leaf of `tree` is free of NaN/inf."""
  leaves = float_leaves(tree)
  if not leaves:
    return jnp.asarray(True)
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def cpu_all_finite(tree) -> jax.Array:
  """all_finite by one float sum of x - x per leaf (cpu.finite_by_subtraction) where XLA keeps
  x - x = NaN for a NaN (no fast math); all_finite elsewhere."""
  leaves = float_leaves(tree)
  if leaves and cpu.subtraction_sees_nan():
    return cpu.finite_by_subtraction(leaves)
  return all_finite(tree)


@dataclasses.dataclass(frozen=True, eq=False)
class Tuning:
  """How one backend computes the model and the train step (the same values as PLAIN but for
  dropout's random stream); the module docstring says what each field does."""
  name: str
  platform: str                # the attention core's backend ('' = JAX's default backend)
  matmul: Callable             # (M, K) @ (K, F): the dense layers (layers.Dense2D)
  dropout: Callable            # dropout(x, rng, rate): every dropout (ops.dropout, ops.Dropout)
  bias_per_row: bool           # T5, reference attention: the bias broadcast once per stack
  blockwise_max: bool          # losses: the row maximum found block by block
  all_finite: Callable         # tree -> () bool: the train step's state_finite
  init_compiler_options: Mapping[str, Any] | None   # programs that run once (run_once)

  def __repr__(self):
    return f'Tuning({self.name!r})'


PLAIN = Tuning('plain', platform='', matmul=jnp.dot, dropout=flax_dropout,
               bias_per_row=False, blockwise_max=False, all_finite=all_finite,
               init_compiler_options=None)
CPU = Tuning('cpu', platform='cpu', matmul=cpu.matmul, dropout=cpu.dropout,
             bias_per_row=True, blockwise_max=True, all_finite=cpu_all_finite,
             init_compiler_options=cpu.INIT_COMPILER_OPTIONS)


@functools.cache
def for_platform(platform: str) -> Tuning:
  """The tuning of a device platform ('cpu', 'gpu', 'tpu', ...: jax.Device.platform): CPU's, or
  PLAIN's with the platform named. One record per platform, so one per process."""
  if platform == 'cpu':
    return CPU
  return dataclasses.replace(PLAIN, name=platform, platform=platform)


@functools.cache
def with_fp8(platform: str) -> Tuning:
  """for_platform(platform) with fp8 dense layers (ops/fp8.py); one record per process."""
  return dataclasses.replace(for_platform(platform), name=f'{platform}+fp8', matmul=fp8.matmul)


def for_device(device, fp8_dense: bool = False) -> Tuning:
  """The tuning of a step on `device` (a jax.Device): for_platform(its platform), or with
  `fp8_dense` (train.fp8) its fp8 form, refused (ValueError) where the device has no fp8
  tensor cores (not an NVIDIA GPU of compute capability >= fp8.MIN_COMPUTE_CAPABILITY)."""
  if not fp8_dense:
    return for_platform(device.platform)
  capability = getattr(device, 'compute_capability', None) if device.platform == 'gpu' else None
  try:
    ok = capability is not None and float(capability) >= fp8.MIN_COMPUTE_CAPABILITY
  except (TypeError, ValueError):
    ok = False
  if not ok:
    where = (f'compute capability {capability}' if capability is not None
             else f'platform {device.platform}')
    raise ValueError(f'train.fp8=True on {device.device_kind} ({where}); expected an NVIDIA '
                     f'GPU of compute capability >= {fp8.MIN_COMPUTE_CAPABILITY} (Ada, Hopper '
                     'or newer: fp8 tensor cores), or train.fp8=False')
  return with_fp8(device.platform)
