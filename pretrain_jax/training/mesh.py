"""The device mesh and the ONE table mapping logical axis names onto it.

Mesh axes: `data` (pure data parallelism), `fsdp` (data parallelism whose parameters and
optimizer state are sharded too, ZeRO-3 style) and `tensor` (Megatron-style: heads, mlp and
vocab split). The batch dimension is split over `data` and `fsdp` together.
"""
from typing import Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from pretrain_jax.training.config import MESH_AXES, MeshConfig, TrainConfig
BATCH_AXES = ('data', 'fsdp')

# Logical name (pretrain_jax.models.layers, DESIGN.md) -> mesh axis. Names not listed are
# replicated.
LOGICAL_RULES = (
    ('batch', BATCH_AXES),
    ('embed', 'fsdp'),          # every weight has an embed dim: this is what FSDP shards
    ('vocab', 'tensor'),
    ('mlp', 'tensor'),
    ('heads', 'tensor'),
    ('kv', None),
    ('position', None),
    ('type_vocab', None),
    ('relpos_buckets', None),
    ('classes', None),
    ('layers', None),           # the stacked axis of scan_layers
    ('length', None),
)


def mesh_shape(mesh_config: MeshConfig, num_devices: int) -> tuple:
  """config.mesh -> (data, fsdp, tensor) sizes; one -1 takes the devices left over."""
  sizes = list(mesh_config.sizes.values())
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(f'config.mesh {dict(zip(MESH_AXES, sizes))}: {num_devices} devices are '
                       f'not divisible by the fixed axes ({known})')
    sizes[sizes.index(-1)] = num_devices // known
  if int(np.prod(sizes)) != num_devices:
    raise ValueError(f'config.mesh {dict(zip(MESH_AXES, sizes))} has {int(np.prod(sizes))} '
                     f'devices; expected the {num_devices} available')
  return tuple(sizes)


def make_mesh(mesh_config: MeshConfig, devices: Sequence = None) -> Mesh:
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh_config, len(devices))
  try:  # a topology-aware layout on TPU/GPU; plain order elsewhere
    grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  except (ValueError, NotImplementedError, AssertionError):
    grid = np.asarray(devices).reshape(shape)
  return Mesh(grid, MESH_AXES)


def axis_size(mesh: Mesh, axes) -> int:
  if axes is None:
    return 1
  axes = (axes,) if isinstance(axes, str) else axes
  return int(np.prod([mesh.shape[a] for a in axes]))


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def logical_shardings(logical_specs, mesh: Mesh):
  """Tree of logical PartitionSpecs (nn.get_partition_spec) -> tree of NamedShardings."""
  return nn.logical_to_mesh_sharding(logical_specs, mesh, LOGICAL_RULES)


def traced_in(mesh: Mesh, fn):
  """`fn` traced with `mesh` and LOGICAL_RULES in context, so a kernel that runs under
  shard_map (splash attention, models/splash.py) finds the batch and head axes."""
  def traced(*args):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(LOGICAL_RULES):
      return fn(*args)
  return traced


def check_divisible(abstract_tree, shardings, what: str) -> None:
  """Every sharded dimension must split evenly; name the first one that does not."""
  leaves = jax.tree_util.tree_leaves_with_path(abstract_tree)
  for (path, leaf), sharding in zip(leaves, jax.tree_util.tree_leaves(shardings)):
    for dim, (size, axes) in enumerate(zip(leaf.shape, sharding.spec)):
      n = axis_size(sharding.mesh, axes)
      if size % n:
        raise ValueError(
            f'{what}{jax.tree_util.keystr(path)} has shape {leaf.shape}: dimension {dim} '
            f'({size}) is sharded over mesh axes {axes} of size {n} and must be divisible by it')


def check_config(t: TrainConfig, m, mesh: Mesh, process_count: int = 1) -> None:
  """Errors for a batch (config.train) or a head count (ModelConfig `m`) that does not fit the
  mesh, before any compilation."""
  shards = axis_size(mesh, BATCH_AXES)
  if t.batch_size % t.microbatches:
    raise ValueError(f'train.batch_size={t.batch_size} is not divisible by '
                     f'train.microbatches={t.microbatches}')
  micro = t.batch_size // t.microbatches
  if micro % shards:
    raise ValueError(
        f'train.batch_size={t.batch_size} / train.microbatches={t.microbatches} = {micro} '
        f'sequences per microbatch is not divisible by the data-parallel mesh axes '
        f'data*fsdp={shards} (mesh {dict(mesh.shape)})')
  if t.batch_size % process_count:
    raise ValueError(f'train.batch_size={t.batch_size} is not divisible by the '
                     f'{process_count} processes (hosts)')
  if shards % process_count:
    raise ValueError(f'the data-parallel mesh axes data*fsdp={shards} (mesh {dict(mesh.shape)}) '
                     f'are not a multiple of the {process_count} processes (hosts): each '
                     'process feeds its own rows of the batch, so each needs batch shards of '
                     'its own; expected data*fsdp a multiple of the process count (tensor '
                     'parallelism within a host)')
  tensor = mesh.shape['tensor']
  for key in ('num_heads', 'mlp_dim', 'vocab_size'):
    if getattr(m, key) % tensor:
      raise ValueError(f'model.{key}={getattr(m, key)} is not divisible by '
                       f'mesh.tensor={tensor}')
  if m.emb_dim % mesh.shape['fsdp']:
    raise ValueError(f'model.emb_dim={m.emb_dim} is not divisible by '
                     f'mesh.fsdp={mesh.shape["fsdp"]}')
