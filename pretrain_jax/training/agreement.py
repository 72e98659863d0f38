"""Agreement among processes: every cross-host decision of the run machinery goes through here.

`all_processes(*flags)`, `gather_json(obj)` and `barrier(name)` are blocking collectives for
decisions taken once (the lock, a restore, a save's outcome). Per step, the loop asks two
questions all processes must answer alike: has any process been told to stop (SIGTERM), and
has a background save failed or finished on all of them. A blocking all-gather each step would
make every host wait for its step to finish before dispatching the next, which costs
throughput. `Lagged` instead starts each step's all-gather as an ordinary dispatched
computation and answers with the one started LAG steps before: the same gather on every
process, so all still act at the same step.
"""
import collections
import functools
import json

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def all_processes(*flags: bool):
  """Each flag ANDed over all processes (one all-gather on several): a bool for one flag, a
  tuple for several."""
  if jax.process_count() > 1:
    gathered = multihost_utils.process_allgather(np.asarray(flags, bool))   # (P, len(flags))
    flags = tuple(bool(f) for f in np.all(gathered.reshape(-1, len(flags)), axis=0))
  return flags[0] if len(flags) == 1 else tuple(flags)


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier `name` (nothing on one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def gather_json(obj) -> list:
  """Every process's JSON-serializable `obj`, in process order (a collective)."""
  if jax.process_count() == 1:
    return [obj]
  data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
  sizes = multihost_utils.process_allgather(np.asarray([data.size], np.int32))
  padded = np.zeros(int(np.max(sizes)), np.uint8)
  padded[:data.size] = data
  everyone = multihost_utils.process_allgather(padded)
  return [json.loads(bytes(row[:int(n)]).decode()) for row, n in
          zip(everyone, np.asarray(sizes).reshape(-1))]


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
