"""The operations whose form depends on the backend a step runs on; model code reads as plain Flax.

Layers call `matmul` (jnp.dot of (M, K) @ (K, F)), `Dropout` (flax.linen.Dropout's fields and
call), `dropout(x, rng, rate)` (the attention probabilities'), `all_finite(tree)` and read
`current()` (the attention platform, T5's per-row bias, the loss's blockwise maximum). What
they compute is the form in effect while they are traced: a `backends.Tuning` record, PLAIN
unless a caller says otherwise. training.step.make_steps says so once, from its mesh's devices
(backends.for_device), by binding its steps to that form (`bind`); inference/load.py binds its
evaluation step to its devices' form the same way.

The form is a jax user context (jax.make_user_context), entered while a bound function runs:
  - it belongs to the program: a jitted function is keyed on the context's value (jax puts
    user contexts in jit's cache key), and a bound function enters its own form whatever the
    caller's, so a program traced under one form is never reused under another;
  - two meshes in one process (a CPU mesh beside an accelerator's) each bind their own steps,
    where a module attribute would hold one form for the whole process;
  - no layer carries it: a field in every layer's config would thread it through every
    ModelConfig.replace and make equal models unequal; unbound, a model computes PLAIN.

  backends.py  the Tuning records (PLAIN, CPU, an fp8 one) and for_device, which picks one
  cpu.py       the XLA:CPU forms CPU swaps in (dense-layer weight gradients, 16-bit dropout
               masks, the state's finiteness check, init programs' compiler options)
  fp8.py       fp8 dense layers (train.fp8; GPUs with fp8 tensor cores): e4m3 operands, e5m2
               gradients, one scale per tensor from its current maximum

A bottom layer like paths.py: every package but cloud/ may import it; it imports none of them.
"""
import functools

import flax.linen as nn
import jax

from pretrain_jax.ops import backends

_FORM = jax.make_user_context(backends.PLAIN)   # part of every jitted program's cache key


def current() -> backends.Tuning:
  """The form in effect (PLAIN outside any `using` / `bind`)."""
  return _FORM.value


def using(tuning: backends.Tuning):
  """A context manager: the operations below compute `tuning`'s form inside it."""
  return _FORM(tuning)


def bind(tuning: backends.Tuning, fn):
  """`fn` run in `tuning`'s form, whatever form its caller is in: what make_steps jits."""
  @functools.wraps(fn)
  def bound(*args, **kwargs):
    with using(tuning):
      return fn(*args, **kwargs)
  return bound


def matmul(x, w):
  """(M, K) @ (K, F) -> (M, F): jnp.dot's values, in the current form (its gradient's)."""
  return current().matmul(x, w)


def dropout(x, rng, rate: float):
  """x with each element dropped with probability `rate` (key `rng`), the rest scaled by
  1 / (1 - rate): flax.linen.Dropout's mask, or the current form's."""
  return current().dropout(x, rng, rate)


def all_finite(tree) -> jax.Array:
  """() bool: every floating-point leaf of `tree` is free of NaN / inf."""
  return current().all_finite(tree)


class Dropout(nn.Dropout):
  """flax.linen.Dropout (same fields, call and key) drawing its mask in the current form."""

  @nn.compact
  def __call__(self, inputs, deterministic=None, rng=None):
    deterministic = nn.merge_param('deterministic', self.deterministic, deterministic)
    if self.rate == 0.0 or deterministic:
      return inputs
    if self.broadcast_dims:
      raise ValueError(f'broadcast_dims={self.broadcast_dims}; this Dropout draws one mask '
                       'element per input element')
    return dropout(inputs, self.make_rng(self.rng_collection) if rng is None else rng,
                   self.rate)
