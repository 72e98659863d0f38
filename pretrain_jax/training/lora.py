"""LoRA (Hu et al. 2022): rank-r updates beside frozen weights, as a transform of the parameter
pytree around the model's apply; the model code never changes.

A targeted kernel W (a Dense2D kernel: in dims, then out dims) is read by the model as

  W' = W + (alpha / rank) * A @ B      A: (*in, rank), B: (rank, *out) (+ a leading layer axis
                                       when the model scans its layers)

with A drawn as PyTorch / PEFT draw it (U(+-1/sqrt(fan_in))) and B zero, so W' = W at step 0.
The trained parameters are `{'lora': {<kernel's module path>: {'a', 'b'}}, <head>: ...}`:
the factors and the task head (BERT's pooler + classifier, GPT's score; none for T5 or the
generation format). The rest, `frozen`, is an argument of every step (never a closed-over
constant: those are compiled into the program) and never in the train state, so the optimizer
sees only the trained leaves and a checkpoint holds the adapter alone.

`merge(trained, frozen, plan, scale)` is what the steps run; `unmerged_apply` computes the same
outputs the textbook way, h = x W + scale * (x A) B, by intercepting each targeted layer (the
reference the merged form is tested against). `fingerprint` names a base's weights, so an
adapter refuses a base it was not trained on. The config section, `LoraConfig` (rank, alpha,
targets), is in training/config.py, which loads no JAX (configs/ import it).
"""
import hashlib
from typing import NamedTuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from pretrain_jax.training.config import TARGETS, LoraConfig

# How many trailing kernel dims are the layer's outputs where that is not "all but the first".
KERNEL_NDIM = {'query': 3, 'key': 3, 'value': 3, 'out': 3, 'wi': 2, 'wi_0': 2, 'wi_1': 2,
               'wo': 2}   # without a scanned layer axis
FACTORS = 'lora'          # the trained tree's key for the factors


class Target(NamedTuple):
  """One adapted kernel: its path in the params, and how its dims split."""
  path: tuple       # ('h_0', 'attn', 'query', 'kernel')
  lead: int         # 1 when the layers are scanned (a leading layer axis), else 0
  n_in: int         # kernel dims after `lead` that the layer contracts (the rest: outputs)


def plan(params, targets: tuple) -> tuple:
  """The Target of every kernel of `params` (arrays, shapes or boxed) that `targets` adapts;
  a one-line error when there is none."""
  modules = {m for t in targets for m in TARGETS[t]}
  out = []
  for path, leaf in flax.traverse_util.flatten_dict(nn.unbox(params)).items():
    if path[-1] == 'kernel' and len(path) > 1 and path[-2] in modules:
      lead = len(leaf.shape) - KERNEL_NDIM[path[-2]]
      if lead not in (0, 1):
        raise ValueError(f'kernel {"/".join(path)} of shape {leaf.shape}: expected '
                         f'{KERNEL_NDIM[path[-2]]} dims (or one more, scanned layers)')
      n_in = KERNEL_NDIM[path[-2]] - 1 if path[-2] == 'out' else 1
      out.append(Target(path, lead, n_in))
  if not out:
    raise ValueError(f'lora.targets={",".join(targets)} adapts no kernel of this model; '
                     f'expected layers named {sorted(modules)}')
  return tuple(out)


def _factor_shapes(shape: tuple, target: Target, rank: int) -> tuple:
  lead, split = shape[:target.lead], target.lead + target.n_in
  return lead + shape[target.lead:split] + (rank,), lead + (rank,) + shape[split:]


def _names(names, target: Target) -> tuple:
  """Logical axis names of (A, B) from the kernel's: A keeps its inputs', B its outputs'."""
  split = target.lead + target.n_in
  return (tuple(names[:split]) + (None,),
          tuple(names[:target.lead]) + (None,) + tuple(names[split:]))


def init_factors(rng, params, targets: tuple, rank: int) -> dict:
  """{'<module path>': {'a', 'b'}} nested like `params` (arrays or logically boxed: the factors
  are boxed alike, so they shard with their kernel's input / output axes). A ~ U(+-1/sqrt(fan
  in)), B = 0."""
  flat = flax.traverse_util.flatten_dict(params)
  out = {}
  for i, target in enumerate(plan(params, targets)):
    kernel = flat[target.path]
    value = nn.unbox(kernel)
    a_shape, b_shape = _factor_shapes(value.shape, target, rank)
    fan_in = int(np.prod(a_shape[target.lead:-1]))
    bound = fan_in ** -0.5
    a = jax.random.uniform(jax.random.fold_in(rng, i), a_shape, value.dtype, -bound, bound)
    b = jnp.zeros(b_shape, value.dtype)
    if isinstance(kernel, nn.LogicallyPartitioned):
      a_names, b_names = _names(kernel.names, target)
      a, b = (nn.LogicallyPartitioned(a, a_names), nn.LogicallyPartitioned(b, b_names))
    out[target.path[:-1] + ('a',)], out[target.path[:-1] + ('b',)] = a, b
  return flax.traverse_util.unflatten_dict(out)


def delta(a, b, target: Target, kernel_shape: tuple):
  """scale-free A @ B reshaped as the kernel: (*lead, *in, *out)."""
  lead = a.shape[:target.lead]
  k_in = int(np.prod(a.shape[target.lead:-1]))
  k_out = int(np.prod(b.shape[target.lead + 1:]))
  product = jnp.matmul(a.reshape(lead + (k_in, a.shape[-1])),
                       b.reshape(lead + (b.shape[target.lead], k_out)))
  return product.reshape(kernel_shape)


def merge(trained: dict, frozen: dict, targets: tuple, scale: float) -> dict:
  """The model's parameters: `frozen` with each targeted kernel W + scale * A @ B, plus the
  trained head (the top-level entries of `trained` besides the factors)."""
  flat = flax.traverse_util.flatten_dict(frozen)
  factors = flax.traverse_util.flatten_dict(trained[FACTORS])
  for target in plan(frozen, targets):
    kernel = flat[target.path]
    a, b = factors[target.path[:-1] + ('a',)], factors[target.path[:-1] + ('b',)]
    update = delta(a, b, target, kernel.shape)
    flat[target.path] = (kernel + scale * update.astype(jnp.float32)).astype(kernel.dtype)
  out = flax.traverse_util.unflatten_dict(flat)
  out.update({k: v for k, v in trained.items() if k != FACTORS})
  return out


def split(params: dict, head_names: tuple) -> tuple:
  """(frozen: every top-level entry but the head's, head: the head's entries present)."""
  return ({k: v for k, v in params.items() if k not in head_names},
          {k: v for k, v in params.items() if k in head_names})


class Adapter(NamedTuple):
  """What make_steps needs to train LoRA factors: the frozen weights and how to merge."""
  config: LoraConfig
  frozen: dict               # the base's weights without the head: arrays
  head_names: tuple          # top-level names of the trained head (may be none)

  def trainable(self, fresh: dict, rng) -> dict:
    """Fresh (boxed) model params -> the trained tree: fresh factors and the fresh head."""
    factors = init_factors(rng, split(fresh, self.head_names)[0], self.config.target_names,
                           self.config.rank)
    return {FACTORS: factors, **split(fresh, self.head_names)[1]}

  def merge(self, trained: dict, frozen: dict) -> dict:
    return merge(trained, frozen, self.config.target_names, self.config.scale)


def count(tree) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree)))


def leaf_digests(params: dict) -> dict:
  """{'a/b/kernel': sha256 of its dtype, shape and bytes}: a base's weights, leaf by leaf."""
  out = {}
  for path, leaf in flax.traverse_util.flatten_dict(params).items():
    value = np.asarray(jax.device_get(leaf))
    h = hashlib.sha256(f'{value.dtype}{value.shape}'.encode())
    h.update(np.ascontiguousarray(value).tobytes())
    out['/'.join(path)] = h.hexdigest()
  return out


def fingerprint(digests: dict, head_names: tuple = ()) -> str:
  """16 hex digits naming the weights of `digests` (leaf_digests) outside the head: what an
  adapter was trained on."""
  h = hashlib.sha256()
  for name in sorted(digests):
    if name.split('/')[0] not in head_names:
      h.update(f'{name}={digests[name]};'.encode())
  return h.hexdigest()[:16]


def unmerged_apply(model, frozen: dict, trained: dict, targets: tuple, scale: float, *args,
                   **kwargs):
  """model.apply with the frozen weights and the LoRA path beside each targeted layer:
  y = layer(x) + scale * (x A) B. The reference `merge` is tested against (no weight is
  changed); layers run as a loop (not model.scan_layers, whose factors have a layer axis)."""
  factors = flax.traverse_util.flatten_dict(trained[FACTORS])
  modules = {m for t in targets for m in TARGETS[t]}

  def intercept(next_fun, args_, kwargs_, context):
    module = context.module
    out = next_fun(*args_, **kwargs_)
    path = tuple(module.scope.path)
    key = path + ('a',)
    if context.method_name != '__call__' or not path or path[-1] not in modules or \
        key not in factors:
      return out
    x = args_[0]
    a, b = factors[key], factors[path + ('b',)]
    n_in = a.ndim - 1
    low = jnp.tensordot(x.astype(jnp.float32), a, axes=(list(range(x.ndim - n_in, x.ndim)),
                                                     list(range(n_in))))       # (..., r)
    up = jnp.tensordot(low, b, axes=([low.ndim - 1], [0]))                     # (..., *out)
    return (out.astype(jnp.float32) + scale * up).astype(out.dtype)

  params = {**frozen, **{k: v for k, v in trained.items() if k != FACTORS}}
  with nn.intercept_methods(intercept):
    return model.apply({'params': params}, *args, **kwargs)
