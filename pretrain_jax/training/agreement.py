"""Agreement among processes: every cross-host decision of the run machinery goes through here.

`all_processes`, `gather_json` and `barrier` block: decisions taken once (the lock, a restore, a
save's outcome). `Lagged` answers the per-step questions (a stop request, a background save's
outcome) from an all-gather dispatched LAG steps before, so no host waits for its step to end.
"""
import collections
import functools
import json

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def all_processes(flag: bool) -> bool:
  """`flag` ANDed over all processes."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(np.all(multihost_utils.process_allgather(np.asarray(flag, bool))))


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier `name` (nothing on one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def gather_json(obj) -> list:
  """Every process's JSON-serializable `obj`, in process order."""
  if jax.process_count() == 1:
    return [obj]
  data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
  sizes = multihost_utils.process_allgather(np.asarray([data.size], np.int32)).reshape(-1)
  padded = np.zeros(int(np.max(sizes)), np.uint8)
  padded[:data.size] = data
  everyone = multihost_utils.process_allgather(padded)
  return [json.loads(bytes(row[:int(n)]).decode()) for row, n in zip(everyone, sizes)]


@functools.cache
def _gather_fn():
  """(jitted all-gather of one row per process, replicated out; the rows' sharding)."""
  mesh = Mesh(np.array(jax.devices()).reshape(jax.process_count(), -1), ('processes', 'local'))
  return (jax.jit(lambda rows: rows, out_shardings=NamedSharding(mesh, P())),
          NamedSharding(mesh, P('processes')))


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
    gather, sharding = _gather_fn()
    self._gathers.append(gather(jax.make_array_from_process_local_data(
        sharding, np.asarray([flags], bool))))
    if len(self._gathers) <= self.LAG:
      return None
    return np.asarray(self._gathers.popleft().addressable_data(0))

  def reset(self) -> None:
    self._gathers.clear()
