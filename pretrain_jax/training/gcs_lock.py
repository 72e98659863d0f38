"""The workdir lock on gs://: the object `<workdir>/LOCK`, its version the object's generation.

GCS has no O_EXCL and no rename, but each upload or delete can be conditional on the generation
(if_generation_match; 0: the object must not exist) and fails with 412 otherwise. Imported only
for gs:// workdirs (lock.open_lock), so google-cloud-storage loads only there.
"""
import json
import time

from google.api_core import exceptions
from google.cloud import storage

from pretrain_jax import paths
from pretrain_jax.training import lock as lock_lib

TIMEOUT_SEC = 30.0


class GcsLock(lock_lib.WorkdirLock):
  """`gs://bucket/run/LOCK`."""

  def __init__(self, workdir: str, **kwargs):
    super().__init__(workdir, **kwargs)
    paths.check_bucket(self.path)
    self.bucket = storage.Client().bucket(paths.bucket_of(self.path)[1])

  def _blob(self):
    """A Blob per call: the heartbeat thread and a save's check may write at once."""
    return self.bucket.blob(self.path.split('/', 3)[3])

  def _read(self):
    blob = self._blob()
    try:
      text = blob.download_as_bytes(timeout=TIMEOUT_SEC)
    except exceptions.NotFound:
      return None, 0.0, None
    age = time.time() - blob.updated.timestamp() if blob.updated else 0.0
    return lock_lib.parse(text), age, blob.generation

  def _write(self, record, version):
    blob = self._blob()
    try:
      blob.upload_from_string(json.dumps(record), content_type='application/json',
                              if_generation_match=version or 0, timeout=TIMEOUT_SEC)
    except exceptions.PreconditionFailed:
      return None
    return blob.generation

  def _remove(self, version):
    try:
      self._blob().delete(if_generation_match=version, timeout=TIMEOUT_SEC)
    except (exceptions.NotFound, exceptions.PreconditionFailed):
      pass  # taken over or removed by hand: not ours to delete
