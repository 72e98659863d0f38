"""The train state and its shardings; the state is created already sharded.

Parameters take their logical axes' shardings (mesh.LOGICAL_RULES); an optimizer leaf that
mirrors a parameter (Adam's mu/nu, Adafactor's unfactored v) takes that parameter's; the rest
(counts, Adafactor's factored row/column statistics) is replicated.
"""
import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pretrain_jax.models import family_of
from pretrain_jax.ops import backends
from pretrain_jax.training import mesh as mesh_lib


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array        # () int32: optimizer steps taken
  params: dict           # fp32 (param_dtype) parameters
  opt_state: optax.OptState


def abstract_params(model) -> dict:
  """ShapeDtypeStructs of the parameters (no shardings)."""
  init = init_params_fn(model, family_of(model.cfg).init_batch(8))
  return nn.meta.unbox(jax.eval_shape(init, jax.random.key(0)))


def _opt_state_shardings(abstract, param_shardings, mesh: Mesh):
  """Shard each optimizer leaf like the parameter whose path its path ends with (same shape)."""
  def names(path):
    return tuple(jax.tree_util.keystr(path, simple=True, separator='/').split('/'))
  by_path = {names(path): (leaf.shape, sharding) for (path, leaf), sharding in zip(
      jax.tree_util.tree_leaves_with_path(abstract.params), jax.tree.leaves(param_shardings),
      strict=True)}

  def sharding_of(path, leaf):
    path = names(path)
    for start in range(len(path)):
      shape, sharding = by_path.get(path[start:], (None, None))
      if shape == leaf.shape:
        return sharding
    return NamedSharding(mesh, P())
  return jax.tree_util.tree_map_with_path(sharding_of, abstract.opt_state)


def init_params_fn(model, batch: dict):
  """rng -> the model's fresh (logically boxed) params for `batch`'s layout."""
  args, kwargs = family_of(model.cfg).model_inputs(batch)
  return lambda rng: model.init({'params': rng, 'dropout': rng}, *args, **kwargs)['params']


def param_shardings(model, mesh: Mesh, batch: dict):
  """The model's parameter shardings (their logical axes through mesh.LOGICAL_RULES)."""
  specs = nn.get_partition_spec(jax.eval_shape(init_params_fn(model, batch), jax.random.key(0)))
  return nn.logical_to_mesh_sharding(specs, mesh, mesh_lib.LOGICAL_RULES)


def split_shardings(shardings: dict, like: dict) -> dict:
  """The top-level entries of `shardings` that `like` has (LoRA's frozen weights)."""
  return {k: shardings[k] for k in like}


def abstract_state(model, tx, mesh: Mesh, batch: dict, trainable=None):
  """(TrainState of ShapeDtypeStructs carrying their shardings, init: PRNG key -> TrainState).

  Run init with the abstract state's shardings as out_shardings (run_once); init(None, params)
  starts from given weights with a fresh optimizer state, drawing none. `trainable(fresh
  boxed params, rng) -> boxed params` makes the state's params something else (LoRA's factors
  and head: training/lora.py).
  """
  fresh = init_params_fn(model, batch)

  def init_params(rng):
    params = fresh(rng)
    return params if trainable is None else trainable(params, jax.random.fold_in(rng, 1))

  def init_state(rng, params=None):
    params = nn.meta.unbox(init_params(rng)) if params is None else params
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

  specs = nn.get_partition_spec(jax.eval_shape(init_params, jax.random.key(0)))
  param_shardings = nn.logical_to_mesh_sharding(specs, mesh, mesh_lib.LOGICAL_RULES)
  abstract = jax.eval_shape(init_state, jax.random.key(0))
  mesh_lib.check_divisible(abstract.params, param_shardings, 'params')
  shardings = TrainState(step=NamedSharding(mesh, P()), params=param_shardings,
                         opt_state=_opt_state_shardings(abstract, param_shardings, mesh))
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract, shardings)
  return abstract, init_state


def shardings_of(abstract) -> TrainState:
  return jax.tree.map(lambda a: a.sharding, abstract)


def run_once(fn, *args, out_shardings=None):
  """jax.jit(fn, out_shardings=...)(*args) for a program that runs once (an init: every leaf
  made in its shards), compiled with its devices' tuning.init_compiler_options."""
  lowered = jax.jit(fn, out_shardings=out_shardings).lower(*args)
  device = (next(iter(jax.tree.leaves(out_shardings)[0].device_set)) if out_shardings
            else jax.devices()[0])
  options = backends.for_platform(device.platform).init_compiler_options
  return lowered.compile(compiler_options=dict(options) if options else None)(*args)
