"""The train state and its shardings; the state is created already sharded.

Parameters carry logical axis names (pretrain_jax.models.layers); `mesh.LOGICAL_RULES` maps them
onto
the mesh. Optimizer-state leaves that mirror a parameter (Adam's mu/nu, Adafactor's unfactored
v) take that parameter's sharding; everything else in the optimizer state (counts, Adafactor's
factored row/column statistics, O(rows + cols)) is replicated.
"""
import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from pretrain_jax.models import family_of
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.tuning import backends


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array        # () int32: optimizer steps taken
  params: dict           # fp32 (param_dtype) parameters
  opt_state: optax.OptState


def boxed_abstract_params(model, batch: dict = None):
  """ShapeDtypeStructs of the parameters, still boxed with their logical axis names."""
  family = family_of(model.cfg)
  args, kwargs = family.model_inputs(family.init_batch(8) if batch is None else batch)
  return jax.eval_shape(lambda rng: model.init(rng, *args, **kwargs)['params'],
                        jax.random.key(0))


def abstract_params(model) -> dict:
  """ShapeDtypeStructs of the parameters (no shardings)."""
  return nn.meta.unbox(boxed_abstract_params(model))


def _path_names(path) -> tuple:
  return tuple(jax.tree_util.keystr(path, simple=True, separator='/').split('/'))


def _opt_state_shardings(opt_state, params, param_shardings, mesh: Mesh):
  """Shard each optimizer leaf like the parameter whose path it ends with (same shape)."""
  by_path = {}
  for (path, leaf), sharding in zip(jax.tree_util.tree_leaves_with_path(params),
                                    jax.tree_util.tree_leaves(param_shardings)):
    by_path[_path_names(path)] = (leaf.shape, sharding)
  replicated = NamedSharding(mesh, P())

  def sharding_of(path, leaf):
    names = _path_names(path)
    for start in range(len(names)):
      shape, sharding = by_path.get(names[start:], (None, None))
      if shape is not None and shape == leaf.shape:
        return sharding
    return replicated
  return jax.tree_util.tree_map_with_path(sharding_of, opt_state)


def abstract_state(model, tx, mesh: Mesh, batch: dict):
  """(abstract TrainState of ShapeDtypeStructs carrying shardings, init function).

  The init function maps a PRNG key to the real TrainState; jit it with the abstract state's
  shardings as `out_shardings` (see `create_state`).
  """
  args, kwargs = family_of(model.cfg).model_inputs(batch)

  def init_params(rng):
    return model.init({'params': rng, 'dropout': rng}, *args, **kwargs)['params']

  def init_state(rng):
    params = nn.meta.unbox(init_params(rng))
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

  boxed = boxed_abstract_params(model, batch)
  param_shardings = mesh_lib.logical_shardings(nn.get_partition_spec(boxed), mesh)
  params = nn.meta.unbox(boxed)
  mesh_lib.check_divisible(params, param_shardings, 'params')
  opt_state = jax.eval_shape(tx.init, params)
  shardings = TrainState(step=NamedSharding(mesh, P()), params=param_shardings,
                         opt_state=_opt_state_shardings(opt_state, params, param_shardings,
                                                        mesh))
  abstract = jax.eval_shape(init_state, jax.random.key(0))
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract, shardings)
  return abstract, init_state


def shardings_of(abstract) -> TrainState:
  return jax.tree.map(lambda a: a.sharding, abstract)


def run_once(fn, *args, out_shardings=None):
  """jax.jit(fn, out_shardings=...)(*args) for a program that runs once (an init), compiled
  with its devices' tuning.init_compiler_options (tuning/backends.py)."""
  lowered = jax.jit(fn, out_shardings=out_shardings).lower(*args)
  device = (next(iter(jax.tree.leaves(out_shardings)[0].device_set)) if out_shardings
            else jax.devices()[0])
  options = backends.for_platform(device.platform).init_compiler_options
  return lowered.compile(compiler_options=dict(options) if options else None)(*args)


def init_in_shards(init_state, shardings, seed: int):
  """init_state(jax.random.key(seed)) with every leaf created directly in its shards
  (nothing is gathered onto one device)."""
  return run_once(init_state, jax.random.key(seed), out_shardings=shardings)


def create_state(model, tx, mesh: Mesh, batch: dict, seed: int):
  """(TrainState created directly in its shards, abstract state). Nothing is ever gathered
  onto one device, so a model larger than one device's memory can be initialised."""
  abstract, init_state = abstract_state(model, tx, mesh, batch)
  return init_in_shards(init_state, shardings_of(abstract), seed), abstract


def count_params(params) -> int:
  return int(sum(x.size for x in jax.tree_util.tree_leaves(params)))
