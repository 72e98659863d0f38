"""One trainer per workdir: `<workdir>/LOCK`, and `hold`, which holds it for a run.

The lock record is {host, pid, start, heartbeat}; a daemon thread refreshes the heartbeat. A
lock is stale (taken over, with a message) when its holder ran on this host and its pid is
gone, or when its heartbeat is older than STALE_SEC (a holder elsewhere, or a hung one).
`LocalLock` is an atomic create on a POSIX filesystem; `gcs_lock.GcsLock` generation
preconditions on gs://. Of two trainers taking over the same stale lock, one wins; the other
finds its fresh lock and refuses.
"""
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time

import jax

from pretrain_jax import paths
from pretrain_jax.training import agreement
from pretrain_jax.training import checkpoint as ckpt_lib

LOCK_FILE = 'LOCK'
HEARTBEAT_SEC = 30.0      # the holder refreshes its heartbeat this often
STALE_SEC = 600.0         # a lock whose heartbeat is older than this is taken over


class LockHeld(RuntimeError):
  """Another live trainer holds the workdir."""


class WorkdirLock:
  """`acquire()` (raises LockHeld), `refresh()`, `release()` over an implementation's
  `_create()`, `_holder()` -> (record or None, age in seconds, version), `_take_over(version)`
  and `_delete()`."""

  lost = False    # set by refresh() when the lock on storage is another trainer's now
  pending = None  # the record being written: a SIGTERM before `record` is set still finds it

  def __init__(self, path: str, heartbeat_sec: float, stale_sec: float):
    self.path, self.heartbeat_sec, self.stale_sec = path, heartbeat_sec, stale_sec
    self.record = None
    self._stop = threading.Event()
    self._thread = None
    self._mutex = threading.Lock()

  def acquire(self) -> str:
    """Takes the lock; returns '' or the message saying whose stale lock was taken over."""
    if self._create():
      self._start_heartbeat()
      return ''
    holder, age, version = self._holder()
    reason = stale_reason(holder, age, self.stale_sec) if holder is not None else 'it vanished'
    where = paths.dirname(self.path)
    if not reason:
      raise LockHeld(held_message(where, holder, self.path))
    if not self._take_over(version):
      other = self._holder()[0] or {}
      raise LockHeld(f'{where} was taken over by pid {other.get("pid")} on '
                     f'{other.get("host")} just now')
    self._start_heartbeat()
    return (f'took over the stale lock {self.path} of pid {(holder or {}).get("pid")} on '
            f'{(holder or {}).get("host")}: {reason}')

  def _new_record(self) -> dict:
    now = time.time()
    return {'host': socket.gethostname(), 'pid': os.getpid(), 'start': now, 'heartbeat': now}

  def _start_heartbeat(self) -> None:
    self._thread = threading.Thread(target=self._beat, daemon=True, name='workdir-lock')
    self._thread.start()

  def _beat(self):
    while not self._stop.wait(self.heartbeat_sec):
      try:
        self.refresh()
      except Exception as e:  # pylint: disable=broad-exception-caught  (a network blip)
        print(f'workdir lock heartbeat {self.path} failed: {type(e).__name__}: {e}; retrying in '
              f'{self.heartbeat_sec:.0f} s', file=sys.stderr, flush=True)

  def release(self) -> None:
    """Stops the heartbeat and deletes the lock if it is this trainer's."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    with self._mutex:
      self._delete()
      self.record = None


class LocalLock(WorkdirLock):
  """`<workdir>/LOCK` created atomically: a hard link of a written temporary file (never an
  empty LOCK), `O_EXCL` where the filesystem has no hard links (a gcsfuse mount)."""

  def __init__(self, workdir: str, *, heartbeat_sec: float = HEARTBEAT_SEC,
               stale_sec: float = STALE_SEC):
    super().__init__(os.path.join(os.path.abspath(workdir), LOCK_FILE), heartbeat_sec, stale_sec)

  def _holder(self):
    try:
      with open(self.path) as f:
        text = f.read()
      age = time.time() - os.path.getmtime(self.path)
    except FileNotFoundError:
      return None, 0.0, None
    try:
      return json.loads(text), age, None
    except ValueError:
      return {}, age, None  # a holder killed between create and write: judged by the file's age

  def _create(self) -> bool:
    """A SIGTERM that lands before `self.record` is set (the start-up handler calls release())
    still removes the LOCK: release() knows the `pending` record."""
    paths.makedirs(os.path.dirname(self.path))
    record = self.pending = self._new_record()
    tmp = self._tmp_path()
    with open(tmp, 'w') as f:
      f.write(json.dumps(record))
    try:
      os.link(tmp, self.path)
    except FileExistsError:
      return False
    except OSError:  # no hard links here: create, then write
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        return False
      with os.fdopen(fd, 'w') as f:
        f.write(json.dumps(record))
    finally:
      os.remove(tmp)
    self.record = record
    return True

  def _tmp_path(self) -> str:
    return f'{self.path}.new-{os.getpid()}'

  def _take_over(self, version) -> bool:
    del version
    aside = f'{self.path}.stale-{socket.gethostname()}-{os.getpid()}'
    try:
      os.rename(self.path, aside)
      os.remove(aside)
    except FileNotFoundError:
      pass  # someone else took it over first; _create decides
    return self._create()

  def refresh(self) -> None:
    """Rewrites the heartbeat (atomically), if the lock on disk is still ours."""
    with self._mutex:
      holder = self._holder()[0]
      if self.record is None:
        return
      if not is_record(holder or {}, self.record):
        self.lost, self.record = True, None
        return
      self.record['heartbeat'] = time.time()
      paths.write_text(self.path, json.dumps(self.record))

  def _delete(self) -> None:
    holder = self._holder()[0]
    if holder and not self.lost and is_record(holder, self.record or self.pending):
      os.remove(self.path)
    if os.path.exists(self._tmp_path()):   # a SIGTERM inside _create
      os.remove(self._tmp_path())


def is_record(holder: dict, record) -> bool:
  """Whether the lock `holder` on storage is `record` (the same pid and start time)."""
  return record is not None and (holder.get('pid'), holder.get('start')) == (record['pid'],
                                                                           record['start'])


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def stale_reason(holder: dict, age: float, stale_sec: float) -> str:
  """Why the lock `holder` (its file `age` seconds old) is stale, or '' when it is alive."""
  heartbeat_age = time.time() - holder['heartbeat'] if 'heartbeat' in holder else age
  if holder.get('host') == socket.gethostname() and not _pid_alive(int(holder.get('pid', -1))):
    return f'pid {holder.get("pid")} on this host is gone'
  if heartbeat_age > stale_sec:
    return f'heartbeat {heartbeat_age:.0f} s old (> {stale_sec:.0f} s)'
  return ''


def held_message(where: str, holder: dict, lock_path: str) -> str:
  return (f'{where} is in use by pid {holder.get("pid")} on {holder.get("host")} (started '
          f'{_when(holder.get("start"))}, heartbeat {_when(holder.get("heartbeat"))}); wait for '
          f'it to finish, stop it, or delete {lock_path} if that trainer is certainly dead')


def _when(t) -> str:
  return time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t)) if t else '?'


def open_lock(workdir: str) -> WorkdirLock:
  scheme, _ = paths.bucket_of(workdir)
  if scheme is None:
    return LocalLock(workdir)
  if scheme == 'gs':
    from pretrain_jax.training import gcs_lock  # pylint: disable=g-import-not-at-top  (cycle)
    return gcs_lock.GcsLock(workdir)
  raise ValueError(f'workdir {workdir!r}: the workdir lock is implemented for local paths and '
                   f'gs:// only, not {scheme}://')


@contextlib.contextmanager
def hold(workdir: str, steps: int):
  """Holds the workdir for a run: process 0 takes the lock (every process raises LockHeld when
  it cannot), then removes the folders of interrupted saves. Refuses `steps` below the newest
  checkpoint before anything is written. Yields `check_held(step)`, to call before each save."""
  lock, error, message = None, '', ''
  held = []                            # the lock, for the start-up SIGTERM handler to release
  previous = _stop_at_startup(held)
  try:   # (the finally restores the SIGTERM handler whatever fails, e.g. an unreachable bucket)
    if jax.process_index() == 0:
      taking = open_lock(workdir)
      held.append(taking)              # (release() deletes only a LOCK it wrote)
      try:
        message = taking.acquire()
        lock = taking                  # released by the finally only once acquired
      except LockHeld as e:
        error = str(e)
    if not agreement.all_processes(not error):
      raise LockHeld(error or 'process 0 could not lock the workdir')
    if message:
      print(message, file=sys.stderr, flush=True)
    done = ckpt_lib.complete_steps(workdir)
    if done and done[-1] > steps:
      raise ValueError(f'train.steps={steps} but {ckpt_lib.checkpoint_dir(workdir)} holds step '
                       f'{done[-1]}: nothing to train. Pass --config.train.steps > {done[-1]} '
                       'to train on, or evaluate the checkpoint with pretrain-jax evaluate')
    if jax.process_index() == 0:
      ckpt_lib.remove_temporary(workdir)

    def check_held(step) -> None:
      """Before a save: raises LockHeld on every process when another trainer has taken the
      workdir over (its lock is checked now, not at the last heartbeat)."""
      if lock is not None:
        try:
          lock.refresh()
        except Exception as e:  # pylint: disable=broad-exception-caught  (a network blip)
          print(f'workdir lock {lock.path}: could not check it before saving step {step} '
                f'({type(e).__name__}: {e}); saving', file=sys.stderr, flush=True)
      if not agreement.all_processes(lock is None or not lock.lost):
        raise LockHeld(f'another trainer took over {workdir} (its LOCK is no longer this '
                       f'run\'s); this one stops without saving step {step} over its checkpoints')
    yield check_held
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)
    if lock is not None:
      lock.release()


def _stop_at_startup(held: list):
  """Until the train loop installs its own SIGTERM handler (save the step, then stop), SIGTERM
  releases the lock in `held` and exits 143: the default action would kill the process and
  leave the LOCK (another host would wait 10 minutes for it to go stale). The handler leaves
  with os._exit, not an exception: Python may run it inside a garbage-collection callback,
  where an exception is printed and dropped (the SIGTERM lost). Multi-process runs too
  (cli.join_processes turns JAX's own C-level handler off). Returns the handler it replaced
  (None: left alone: not the main thread, or a Python handler someone else set)."""
  if threading.current_thread() is not threading.main_thread() or (
      signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
    return None

  def stop(signum, frame):
    del frame
    os.write(2, b'SIGTERM before training started: stopped, nothing to save\n')
    for lock in held:
      if lock._mutex.locked():  # pylint: disable=protected-access  (interrupted inside it)
        continue                # left to go stale (at once for a later run on this host)
      try:
        lock.release()
      except Exception:  # pylint: disable=broad-exception-caught  (it goes stale instead)
        pass
    os._exit(128 + signum)  # pylint: disable=protected-access
  return signal.signal(signal.SIGTERM, stop)
