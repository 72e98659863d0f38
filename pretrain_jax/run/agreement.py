"""Agreement among processes: every cross-host decision of the run machinery goes through here.

`all_processes`, `gather_json` and `barrier` block: decisions taken once (the lock, a restore, a
save's outcome). `Lagged` answers the per-step questions (a stop request, a background save's
outcome) from an all-gather dispatched LAG steps before, so no host waits for its step to end.
A process that stops on an error before the run's first agreement leaves a notice
(`announce_stop`); a peer blocked in that agreement reads it at once (`watch_peers`) instead of
waiting out gloo's key-value timeout (its context's set-up) for the missing process. After it,
gloo's connections are up and a gone peer fails the next collective at once: nothing is sent.
"""
import collections
import contextlib
import functools
import json
import threading

import jax
import numpy as np
from jax._src import distributed
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

_NOTICES = 'pretrain_jax/stopped/'   # jax.distributed's key-value directory of stop notices
_ON_PEER_STOP = []   # fn(notice) the command registered (it exits: a collective cannot be left)
_AGREED = []   # non-empty once this process completed a blocking agreement


def announce_stop(line: str) -> None:
  """Leaves `line` for the other processes (this one exits next), as `process I: line`, if
  this process has not completed an agreement yet (after one, the RPC to a coordinator that may
  be exiting too would only risk JAX's abort on a lost coordinator)."""
  client = distributed.global_state.client
  if client is None or _AGREED:
    return
  try:
    client.key_value_set(f'{_NOTICES}{jax.process_index()}',
                         f'process {jax.process_index()}: {line}')
  except Exception:  # the coordinator gone: gloo's error says so
    pass


def watch_peers(on_stop) -> None:
  """While a blocking agreement waits, another process's stop notice calls `on_stop(notice)`
  from a thread."""
  _ON_PEER_STOP[:] = [on_stop]


@contextlib.contextmanager
def _watched():
  """Polls the stop notices while the caller blocks in the run's first agreement (the only one
  a peer's notice can precede). Only then: a process that stops on its own after an agreed
  decision prints its own error, not its peer's."""
  done, me = threading.Event(), f'{_NOTICES}{jax.process_index()}'

  def poll():
    client = distributed.global_state.client
    while not done.wait(0.2):
      try:
        notices = [v for k, v in sorted(client.key_value_dir_get(_NOTICES)) if k != me]
      except Exception:  # the collective reports the peer gone
        return
      if notices and not done.is_set():
        _ON_PEER_STOP[0](notices[0])
        return

  if not _AGREED and _ON_PEER_STOP and distributed.global_state.client is not None:
    threading.Thread(target=poll, name='peer_stop_watch', daemon=True).start()
  try:
    yield
  finally:
    done.set()
  _AGREED[:] = [True]


def all_processes(flag: bool) -> bool:
  """`flag` ANDed over all processes."""
  if jax.process_count() == 1:
    return bool(flag)
  with _watched():
    return bool(np.all(multihost_utils.process_allgather(np.asarray(flag, bool))))


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier `name` (nothing on one process)."""
  if jax.process_count() > 1:
    with _watched():
      multihost_utils.sync_global_devices(name)


def gather_json(obj) -> list:
  """Every process's JSON-serializable `obj`, in process order."""
  if jax.process_count() == 1:
    return [obj]
  data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
  with _watched():
    sizes = multihost_utils.process_allgather(np.asarray([data.size], np.int32)).reshape(-1)
    padded = np.zeros(int(np.max(sizes)), np.uint8)
    padded[:data.size] = data
    everyone = multihost_utils.process_allgather(padded)
  return [json.loads(bytes(row[:int(n)]).decode()) for row, n in zip(everyone, sizes, strict=True)]


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
