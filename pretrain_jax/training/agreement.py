"""Per-step agreement among processes that does not wait for the device.

The loop asks two questions after every step that all processes must answer alike: has any
process been told to stop (SIGTERM), and has a background save failed or finished on all of
them. A blocking all-gather each step would make every host wait for its step to finish before
dispatching the next, which costs throughput. `Lagged`
instead starts each step's all-gather as an ordinary dispatched computation and answers with the
one started LAG steps before: the same gather on every process, so all still act at the same step.
"""
import collections
import functools

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


@functools.cache
def _gather_fn():
  """(jitted all-gather of one row per process, replicated out; the rows' sharding)."""
  mesh = Mesh(np.array(jax.devices()).reshape(jax.process_count(), -1), ('processes', 'local'))
  return (jax.jit(lambda rows: rows, out_shardings=NamedSharding(mesh, P())),
          NamedSharding(mesh, P('processes')))


def gather_async(flags) -> jax.Array:
  """The (processes, len(flags)) bool array of every process's `flags` (dispatched)."""
  gather, sharding = _gather_fn()
  return gather(jax.make_array_from_process_local_data(sharding, np.asarray([flags], bool)))


class Lagged:
  """`agree(flags)` -> every process's flags as a (processes, len(flags)) bool array, or None
  while fewer than LAG + 1 calls were made since the last `reset`. One process: this call's own
  flags at once. All processes must call it (and `reset`) at the same steps."""

  LAG = 2

  def __init__(self):
    self._gathers = collections.deque()

  def agree(self, flags) -> np.ndarray | None:
    if jax.process_count() == 1:
      return np.asarray([flags], bool)
    self._gathers.append(gather_async(flags))
    if len(self._gathers) <= self.LAG:
      return None
    return np.asarray(self._gathers.popleft().addressable_data(0))

  def reset(self) -> None:
    self._gathers.clear()
