"""The device mesh and the ONE table mapping logical axis names onto it.

Mesh axes: `dcn` (the slices of a multislice run: pure data parallelism over the data-center
network, size 1 on one slice), then config.mesh's within a slice: `data` (pure data
parallelism), `fsdp` (ZeRO-3: parameters and optimizer state sharded too) and `tensor`
(Megatron: heads, mlp and vocab split). The batch splits over `dcn`, `data` and `fsdp`; no
parameter is sharded over `dcn`, so across slices only gradients (and the step's scalars) are
reduced.
"""
import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh

from pretrain_jax.training.config import MESH_AXES, MeshConfig, TrainConfig

AXES = ('dcn',) + MESH_AXES
BATCH_AXES = ('dcn', 'data', 'fsdp')

# Logical name (pretrain_jax.models.layers, DESIGN.md) -> mesh axis. The names not listed
# (kv, position, type_vocab, relpos_buckets, classes, layers, length) are replicated.
LOGICAL_RULES = (
    ('batch', BATCH_AXES),
    ('embed', 'fsdp'),          # every weight has an embed dim: this is what FSDP shards
    ('vocab', 'tensor'),
    ('mlp', 'tensor'),
    ('heads', 'tensor'),
)


def make_mesh(mesh_config: MeshConfig, devices: Sequence = None) -> Mesh:
  """The mesh over AXES: `dcn` spans the slices (jax.Device.slice_index; 1 where devices have
  none), config.mesh's axes the devices of a slice, where one -1 takes the devices left over."""
  devices = list(jax.devices() if devices is None else devices)
  slices = len({getattr(d, 'slice_index', 0) for d in devices})
  per_slice, sizes = len(devices) // slices, list(mesh_config.sizes.values())
  if -1 in sizes:
    sizes[sizes.index(-1)] = per_slice // math.prod(s for s in sizes if s != -1)
  if math.prod(sizes) != per_slice:
    where = f' in each of {slices} slices' if slices > 1 else ''
    raise ValueError(f'config.mesh {mesh_config.sizes} makes a mesh of {math.prod(sizes)} '
                     f'devices; expected the {per_slice} available{where}')
  shape = (1, *sizes)
  if slices > 1:   # each slice's devices in a topology-aware layout, slices side by side
    grid = mesh_utils.create_hybrid_device_mesh(shape, (slices, 1, 1, 1), devices,
                                                allow_split_physical_axes=True)
    return Mesh(grid, AXES)
  try:  # a topology-aware layout on TPU/GPU; plain order elsewhere
    grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  except (ValueError, NotImplementedError, AssertionError):
    grid = np.asarray(devices).reshape(shape)
  return Mesh(grid, AXES)


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
  for (path, leaf), sharding in zip(leaves, jax.tree.leaves(shardings), strict=True):
    try:
      sharding.shard_shape(leaf.shape)
    except ValueError as e:       # jax names the dimension, its size and its shard count
      raise ValueError(f'{what}{jax.tree_util.keystr(path)}: {e}') from None


def check_config(t: TrainConfig, m, mesh: Mesh, process_count: int = 1) -> None:
  """Errors for a batch (config.train) or model (ModelConfig `m`) sizes the mesh does not
  split, before any compilation."""
  shards = math.prod(mesh.shape[a] for a in BATCH_AXES)
  axes = '*'.join(a for a in BATCH_AXES if a != 'dcn' or mesh.shape[a] > 1)
  if t.batch_size % t.microbatches:
    raise ValueError(f'train.batch_size={t.batch_size} is not divisible by '
                     f'train.microbatches={t.microbatches}')
  micro = t.batch_size // t.microbatches
  if micro % shards:
    raise ValueError(
        f'train.batch_size={t.batch_size} / train.microbatches={t.microbatches} = {micro} '
        f'sequences per microbatch is not divisible by the data-parallel mesh axes '
        f'{axes}={shards} (mesh {dict(mesh.shape)})')
  if shards % process_count:
    raise ValueError(f'the data-parallel mesh axes {axes}={shards} (mesh {dict(mesh.shape)}) '
                     f'are not a multiple of the {process_count} processes (hosts); expected a '
                     'multiple: each process feeds batch shards of its own (tensor parallelism '
                     'stays within a host)')
  for key, axis in (('num_heads', 'tensor'), ('mlp_dim', 'tensor'), ('vocab_size', 'tensor'),
                    ('emb_dim', 'fsdp')):
    if getattr(m, key) % mesh.shape[axis]:
      raise ValueError(f'model.{key}={getattr(m, key)} is not divisible by '
                       f'mesh.{axis}={mesh.shape[axis]}')
