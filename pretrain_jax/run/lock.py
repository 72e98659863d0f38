"""One trainer per workdir: `<workdir>/LOCK`, and `hold`, which holds it for a run.

The lock record is {host, pid, start, heartbeat}; a daemon thread refreshes the heartbeat. A
lock is stale (taken over, with a message) when its holder ran on this host and its pid is
gone, or when its heartbeat is older than STALE_SEC (a holder elsewhere, or a hung one). Every
write is conditional on the version read, so of two trainers taking over one stale lock, one
wins and the other refuses.
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
from pretrain_jax.run import agreement
from pretrain_jax.run import checkpoint as ckpt_lib

LOCK_FILE = 'LOCK'
HEARTBEAT_SEC = 30.0      # the holder refreshes its heartbeat this often
STALE_SEC = 600.0         # a lock whose heartbeat is older than this is taken over
GCS_TIMEOUT_SEC = 30.0    # each request of a gs:// lock


class LockHeld(RuntimeError):
  """Another live trainer holds the workdir."""


class WorkdirLock:
  """`acquire()` (raises LockHeld), `refresh()`, `release()` over a storage's `_read()` ->
  (record or None, age in seconds, version), `_write(record, version)` -> the new version, or
  None unless the lock is still `version` (None: absent), and `_remove(version)`."""

  lost = False    # set by refresh() when the lock on storage is another trainer's now
  version = None  # the storage's version of this trainer's record

  def __init__(self, workdir: str, *, heartbeat_sec: float = HEARTBEAT_SEC,
               stale_sec: float = STALE_SEC):
    self.path = paths.resolve(workdir) / LOCK_FILE
    self.heartbeat_sec, self.stale_sec = heartbeat_sec, stale_sec
    self.record, self._thread, self._stop = None, None, threading.Event()

  def acquire(self) -> str:
    """Takes the lock; returns '' or the message saying whose stale lock was taken over."""
    message = ''
    if not self._claim(None):
      holder, age, version = self._read()
      reason = 'it vanished' if holder is None else stale_reason(holder, age, self.stale_sec)
      # (a takeover fails when another trainer's came first; a lock that vanished is created)
      if not reason or not (self._claim(version) or self._claim(None)):
        holder = (self._read()[0] if reason else holder) or {}
        raise LockHeld(f'{self.path.parent} is in use by pid {holder.get("pid")} on '
                       f'{holder.get("host")} (started {_when(holder.get("start"))}, heartbeat '
                       f'{_when(holder.get("heartbeat"))}); wait for it to finish, stop it, or '
                       f'delete {self.path} if that trainer is certainly dead')
      message = (f'took over the stale lock {self.path} of pid {(holder or {}).get("pid")} on '
                 f'{(holder or {}).get("host")}: {reason}')
    self._thread = threading.Thread(target=self._beat, daemon=True, name='workdir-lock')
    self._thread.start()
    return message

  def _claim(self, version) -> bool:
    """Writes a new record over `version`. The record is noted first: a SIGTERM inside the
    write (the start-up handler calls release()) still removes it."""
    now = time.time()
    self.record = {'host': socket.gethostname(), 'pid': os.getpid(), 'start': now,
                   'heartbeat': now}
    self.version = self._write(self.record, version)
    return self.version is not None

  def _ours(self, holder) -> bool:
    return bool(holder) and self.record is not None and (
        (holder.get('pid'), holder.get('start')) == (self.record['pid'], self.record['start']))

  def refresh(self) -> None:
    """Rewrites the heartbeat if the lock is still this trainer's, else sets `lost`. A write
    refused over its own record (the heartbeat's and a save's at once; a gs:// upload whose
    answer was lost, retried) goes on from it."""
    if self.record is None:
      return
    record = dict(self.record, heartbeat=time.time())
    version = self._write(record, self.version)
    if version is None:
      holder, _, version = self._read()
      if not self._ours(holder):
        print(f'workdir lock {self.path} was taken over by another trainer; this one no longer '
              'holds the run and stops at its next save', file=sys.stderr, flush=True)
        self.lost, self.record = True, None
        return
    self.record, self.version = record, version

  def check(self, when: str, then: str) -> None:
    """refresh(); storage failing (a network blip) is said and does not stop the run."""
    try:
      self.refresh()
    except Exception as e:
      print(f'workdir lock {self.path}: could not check it {when} ({type(e).__name__}: {e}); '
            f'{then}', file=sys.stderr, flush=True)

  def _beat(self):
    while not self._stop.wait(self.heartbeat_sec):
      self.check('for its heartbeat', f'retrying in {self.heartbeat_sec:.0f} s')

  def release(self) -> None:
    """Stops the heartbeat and removes the lock if it holds this trainer's record."""
    self._stop.set()
    if self._thread is not None and self._thread.is_alive():   # (a SIGTERM can land before the
      self._thread.join()                                       # thread started: no join then)
    if not self.lost and self.record is not None:
      holder, _, version = self._read()
      if self._ours(holder):
        self._remove(version)


def parse(text) -> dict:
  """The record; {} for a holder killed between creating and writing it (judged by age)."""
  try:
    return json.loads(text)
  except ValueError:
    return {}


class LocalLock(WorkdirLock):
  """`<workdir>/LOCK`, created whole: a hard link of the written record (`O_EXCL` where the
  filesystem has no hard links: a gcsfuse mount). Its version is its text: a heartbeat or a
  takeover compares it, then replaces the file (two steps: of two takeovers in one instant, the
  one overwritten learns it at its next heartbeat or save check)."""

  @property
  def _tmp(self):
    """Per thread: the heartbeat thread and a save's check may write at once."""
    return self.path.with_name(f'{LOCK_FILE}.new-{os.getpid()}-{threading.get_native_id()}')

  def _read(self):
    try:
      text = self.path.read_text()
      return parse(text), time.time() - self.path.stat().mtime, text
    except FileNotFoundError:
      return None, 0.0, None

  def _write(self, record, version):
    paths.makedirs(self.path.parent)
    text = json.dumps(record)
    self._tmp.write_text(text)
    try:
      if version is None:
        try:
          os.link(self._tmp, self.path)
        except FileExistsError:
          raise
        except OSError:  # no hard links here: an exclusive create, then the write
          with open(self.path, 'x') as f:  # noqa: PTH123 (O_EXCL: epath has no 'x' mode)
            f.write(text)
      elif self._read()[2] == version:
        self._tmp.replace(self.path)
      else:
        return None
      return text
    except FileExistsError:
      return None
    finally:
      self._tmp.unlink(missing_ok=True)

  def _remove(self, version):
    del version  # (release() has just read it)
    self.path.unlink(missing_ok=True)

  def release(self) -> None:
    super().release()
    self._tmp.unlink(missing_ok=True)  # (a SIGTERM inside _write)


class GcsLock(WorkdirLock):
  """`gs://bucket/run/LOCK`, its version the object's generation. GCS has no O_EXCL and no
  rename, but each upload or delete can be conditional on the generation
  (if_generation_match; 0: the object must not exist) and fails with 412 otherwise."""

  def __init__(self, workdir: str, **kwargs):
    super().__init__(workdir, **kwargs)
    from google.api_core import exceptions  # noqa: PLC0415 (google-cloud-storage: gs:// only)
    from google.cloud import storage  # noqa: PLC0415 (google-cloud-storage: gs:// only)
    self.errors = exceptions
    self.bucket = storage.Client().bucket(str(self.path).split('/')[2])

  def _blob(self):
    """A Blob per call: the heartbeat thread and a save's check may write at once."""
    return self.bucket.blob(str(self.path).split('/', 3)[3])

  def _read(self):
    blob = self._blob()
    try:
      text = blob.download_as_bytes(timeout=GCS_TIMEOUT_SEC)
    except self.errors.NotFound:
      return None, 0.0, None
    age = time.time() - blob.updated.timestamp() if blob.updated else 0.0
    return parse(text), age, blob.generation

  def _write(self, record, version):
    blob = self._blob()
    try:
      blob.upload_from_string(json.dumps(record), content_type='application/json',
                              if_generation_match=version or 0, timeout=GCS_TIMEOUT_SEC)
    except self.errors.PreconditionFailed:
      return None
    return blob.generation

  def _remove(self, version):
    try:
      self._blob().delete(if_generation_match=version, timeout=GCS_TIMEOUT_SEC)
    except (self.errors.NotFound, self.errors.PreconditionFailed):
      pass  # taken over or removed by hand: not ours to delete


def stale_reason(holder: dict, age: float, stale_sec: float) -> str:
  """Why the lock `holder` (its file `age` seconds old) is stale, or '' when it is alive."""
  if holder.get('host') == socket.gethostname():
    try:
      os.kill(int(holder.get('pid', -1)), 0)
    except ProcessLookupError:
      return f'pid {holder.get("pid")} on this host is gone'
    except PermissionError:
      pass  # alive: another user's
  heartbeat_age = time.time() - holder['heartbeat'] if 'heartbeat' in holder else age
  if heartbeat_age > stale_sec:
    return f'heartbeat {heartbeat_age:.0f} s old (> {stale_sec:.0f} s)'
  return ''


def _when(t) -> str:
  return time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t)) if t else '?'


def open_lock(workdir: str) -> WorkdirLock:
  if not paths.is_remote(workdir):
    return LocalLock(workdir)
  if str(workdir).startswith('gs://'):
    return GcsLock(workdir)
  raise ValueError(f'workdir {workdir!r}: the workdir lock is implemented for local paths and '
                   f'gs:// only, not {str(workdir).split("://")[0]}://')


@contextlib.contextmanager
def hold(workdir: str, steps: int):
  """Holds the workdir for a run: process 0 takes the lock (every process raises LockHeld when
  it cannot); a Checkpointer made inside deletes interrupted saves. Refuses `steps` below the newest
  checkpoint before anything is written. Yields `check_held(step)`, to call before each save."""
  taking = open_lock(workdir) if jax.process_index() == 0 else None
  previous, lock = _stop_at_startup(taking), None
  try:   # (the finally restores the SIGTERM handler whatever fails)
    error, message = '', ''
    if taking is not None:
      try:
        message, lock = taking.acquire(), taking   # released by the finally once acquired
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

    def check_held(step) -> None:
      """Before a save: LockHeld on every process if another trainer took the workdir over."""
      if lock is not None:
        lock.check(f'before saving step {step}', 'saving')
      if not agreement.all_processes(lock is None or not lock.lost):
        raise LockHeld(f'another trainer took over {workdir} (its LOCK is no longer this '
                       f'run\'s); this one stops without saving step {step} over its checkpoints')
    yield check_held
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)
    if lock is not None:
      lock.release()


def _stop_at_startup(lock):
  """Until the loop installs its handler (save, stop), SIGTERM releases `lock` and exits 143 on
  every process (killed, it would leave the LOCK to go stale in 10 minutes): by os._exit, since
  Python may run the handler inside a garbage-collection callback, which drops an exception.
  Returns the handler it replaced (None: left alone: not the main thread, or another's)."""
  if threading.current_thread() is not threading.main_thread() or (
      signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
    return None

  def stop(signum, frame):
    del frame
    os.write(2, b'SIGTERM before training started: stopped, nothing to save\n')
    if lock is not None:
      with contextlib.suppress(Exception):  # (it goes stale instead)
        lock.release()
    os._exit(128 + signum)
  return signal.signal(signal.SIGTERM, stop)
