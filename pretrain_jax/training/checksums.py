"""Per-shard crc32 checksums of a saved state, and the check of a restored one.

`save` checksums the bytes of every shard with replica_id 0 that this process holds, on host
numpy copies taken before the save returns; process 0 writes all processes' lists (gathered) as
the `checksums` item of the same atomic save. A restore compares every recorded shard it can
see: a fully addressable array (one host, or replicated) is checked whole, whatever mesh it was
saved from; on several hosts a shard is checked when this process holds exactly that shard
(same mesh), others are counted as unchecked. Restored floating-point arrays must also be
finite. The host copy costs one device->host transfer of the state per save.
"""
import json
import zlib

import jax
import numpy as np


class CheckpointError(RuntimeError):
  """A checkpoint failed to restore or verify (damaged files, checksum or NaN)."""


def leaf_name(path) -> str:
  """'params/decoder/kernel' for a key path (the checksums file's keys)."""
  return jax.tree_util.keystr(path, simple=True, separator='/')


def _index(index, shape) -> list:
  return [list(sl.indices(n)[:2]) for sl, n in zip(index, shape)]


def _crc(x) -> int:
  return zlib.crc32(np.ascontiguousarray(x).tobytes())


def shard_checksums(tree) -> dict:
  """{leaf name: [[index, crc32], ...]} of this process's replica-0 shards (host copies)."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if isinstance(leaf, jax.Array):
      out[leaf_name(path)] = [[_index(s.index, leaf.shape), _crc(np.asarray(s.data))]
                              for s in leaf.addressable_shards if s.replica_id == 0]
    else:
      x = np.asarray(leaf)
      out[leaf_name(path)] = [[_index((slice(None),) * x.ndim, x.shape), _crc(x)]]
  return out


def verify(tree, checksums, where: str) -> int:
  """Checks `tree` against recorded checksums and for non-finite floats; returns the number of
  recorded shards it could not see (other hosts'). Raises CheckpointError naming the array."""
  unchecked = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    name = leaf_name(path)
    full = None
    if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
      full = np.asarray(leaf)
    unchecked += _verify_checksums(name, leaf, full, checksums, where)
    if full is not None and np.issubdtype(full.dtype, np.inexact) and \
        not np.all(np.isfinite(full)):
      raise CheckpointError(f'checkpoint {where}: array {name} holds non-finite values '
                            '(NaN/inf); it was saved from a diverged run')
  return unchecked


def _verify_checksums(name, leaf, full, checksums, where) -> int:
  """The number of recorded shards of `name` this process cannot see."""
  unchecked = 0
  if checksums is not None:
    if name not in checksums:
      raise CheckpointError(f'checkpoint {where}: array {name} has no checksum in '
                            f'{where}/checksums (the file does not match the state)')
    held = {} if full is not None else {
        json.dumps(_index(s.index, leaf.shape)): s for s in leaf.addressable_shards}
    for index, crc in checksums[name]:
      if full is not None:
        data = full[tuple(slice(a, b) for a, b in index)]
      elif json.dumps(index) in held:
        data = np.asarray(held[json.dumps(index)].data)
      else:
        unchecked += 1
        continue
      if _crc(data) != crc:
        raise CheckpointError(f'checkpoint {where}: array {name} (shard {index}) does not match '
                              f'its checksum in {where}/checksums; the files under {where}/state '
                              'are damaged (bit flips, partial copy)')
  return unchecked
