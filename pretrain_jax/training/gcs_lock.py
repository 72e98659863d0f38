"""The workdir lock on gs://: one object, `<workdir>/LOCK`, guarded by generation preconditions.

GCS has no O_EXCL and no rename, but every write can be made conditional on the object's
generation (a number that changes on every write):
  acquire    upload with if_generation_match=0: fails (412) when the object exists
  takeover   of a stale lock (lock.stale_reason: heartbeat older than stale_sec, or a dead pid
             on this host): upload with if_generation_match=<the stale generation we read>;
             of two trainers racing, one wins, the other gets 412 and refuses
  heartbeat  upload with if_generation_match=<our generation>; a 412 means we were taken over:
             the heartbeat stops and says so, and the trainer stops before its next save (the
             newer trainer owns the run)
  release    delete with if_generation_match=<our generation>
Imported only for gs:// workdirs (lock.open_lock), so google-cloud-storage loads only there.
"""
import json
import sys
import time

from google.api_core import exceptions
from google.cloud import storage

from pretrain_jax import paths
from pretrain_jax.training import lock as lock_lib

TIMEOUT_SEC = 30.0


class GcsLock(lock_lib.WorkdirLock):
  """`gs://bucket/run/LOCK`; a daemon thread refreshes its heartbeat."""

  def __init__(self, workdir: str, *, heartbeat_sec: float = lock_lib.HEARTBEAT_SEC,
               stale_sec: float = lock_lib.STALE_SEC):
    super().__init__(paths.join(paths.absolute(workdir), lock_lib.LOCK_FILE), heartbeat_sec,
                     stale_sec)
    _, bucket = paths.bucket_of(self.path)
    paths.check_bucket(self.path)
    self.blob = storage.Client().bucket(bucket).blob(self.path.split('/', 3)[3])
    self.generation = None

  def _holder(self):
    """(record or None, age in seconds, generation) of the lock object."""
    blob = self.blob.bucket.blob(self.blob.name)
    try:
      text = blob.download_as_bytes(timeout=TIMEOUT_SEC)
    except exceptions.NotFound:
      return None, 0.0, None
    age = time.time() - blob.updated.timestamp() if blob.updated else 0.0
    try:
      return json.loads(text), age, blob.generation
    except ValueError:
      return {}, age, blob.generation

  def _write(self, record: dict, generation: int) -> bool:
    """Uploads `record` if the object's generation is `generation` (0: absent); False on 412."""
    self.pending = record
    try:
      self.blob.upload_from_string(json.dumps(record), content_type='application/json',
                                   if_generation_match=generation, timeout=TIMEOUT_SEC)
    except exceptions.PreconditionFailed:
      return False
    self.record, self.generation = record, self.blob.generation
    return True

  def _create(self) -> bool:
    return self._write(self._new_record(), 0)

  def _take_over(self, version) -> bool:
    return self._write(self._new_record(), version or 0)

  def refresh(self) -> None:
    """Rewrites the heartbeat if the object is still the one we wrote."""
    with self._mutex:
      if self.record is None:
        return
      record = dict(self.record, heartbeat=time.time())
      if not self._write(record, self.generation):
        holder, _, generation = self._holder()
        if holder and lock_lib.is_record(holder, record):
          self.record, self.generation = holder, generation   # our own write, retried: a 412
          return
        print(f'workdir lock {self.path} was taken over by another trainer; this one no longer '
              'holds the run and stops at its next save', file=sys.stderr, flush=True)
        self.lost, self.record = True, None

  def _delete(self) -> None:
    generation = self.generation
    if self.lost:
      generation = None       # another trainer's now
    elif self.record is None:   # a SIGTERM between our upload and noting it?
      holder, _, generation = self._holder()
      if not (holder and lock_lib.is_record(holder, self.pending)):
        generation = None
    if generation is not None:
      try:
        self.blob.delete(if_generation_match=generation, timeout=TIMEOUT_SEC)
      except (exceptions.NotFound, exceptions.PreconditionFailed):
        pass  # taken over or removed by hand: not ours to delete
