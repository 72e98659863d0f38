"""Per-shard crc32 checksums of a saved state, and the check of a restored one.

A save records every replica-0 shard of every process. A restore checks each recorded shard it
sees: a fully addressable array whole, whatever mesh saved it; on several hosts the shards this
process holds exactly (same mesh), counting others unchecked. Floats must also be finite.
"""
import zlib

import jax
import numpy as np


class CheckpointError(RuntimeError):
  """A checkpoint failed to restore or verify (damaged files, checksum or NaN)."""


def _leaves(tree) -> list:
  """(name, leaf) pairs; a name ('params/decoder/kernel') is a key of the checksums item."""
  return [(jax.tree_util.keystr(path, simple=True, separator='/'), leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _index(index, shape) -> list:
  return [list(sl.indices(n)[:2]) for sl, n in zip(index, shape, strict=True)]


def _crc(x) -> int:
  return zlib.crc32(np.ascontiguousarray(x).tobytes())


def shard_checksums(tree) -> dict:
  """{leaf name: [[index, crc32], ...]} of this process's replica-0 shards (host copies)."""
  out = {}
  for name, leaf in _leaves(tree):
    if isinstance(leaf, jax.Array):
      out[name] = [[_index(s.index, leaf.shape), _crc(s.data)]
                   for s in leaf.addressable_shards if s.replica_id == 0]
    else:
      out[name] = [[[[0, n] for n in np.shape(leaf)], _crc(np.asarray(leaf))]]
  return out


def verify(tree, checksums, where: str) -> int:
  """Checks `tree` against recorded checksums (None: none were saved) and for non-finite
  floats; returns the number of recorded shards it could not see (other hosts'). Raises
  CheckpointError naming the array."""
  unchecked = 0
  for name, leaf in _leaves(tree):
    full = None
    if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
      full = np.asarray(leaf)
    if checksums is not None and name not in checksums:
      raise CheckpointError(f'checkpoint {where}: array {name} has no checksum in '
                            f'{where}/checksums (the file does not match the state)')
    held = {} if full is not None else {
        str(_index(s.index, leaf.shape)): s.data for s in leaf.addressable_shards}
    for index, crc in (checksums or {}).get(name, ()):
      if full is not None:
        data = full[tuple(slice(a, b) for a, b in index)]
      elif str(index) in held:
        data = held[str(index)]
      else:
        unchecked += 1
        continue
      if _crc(data) != crc:
        raise CheckpointError(f'checkpoint {where}: array {name} (shard {index}) does not match '
                              f'its checksum in {where}/checksums; the files under {where}/state '
                              'are damaged (bit flips, partial copy)')
    if full is not None and np.issubdtype(full.dtype, np.inexact) and \
        not np.all(np.isfinite(full)):
      raise CheckpointError(f'checkpoint {where}: array {name} holds non-finite values '
                            '(NaN/inf); it was saved from a diverged run')
  return unchecked
