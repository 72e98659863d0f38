"""Cloud Storage outages that cannot be ridden out, through tests/fault_proxy.py in front of the
GCS emulator: each ends in one error naming what failed, within the clients' own retry
deadlines, with the last complete checkpoint restorable (docs/training.md, storage faults)."""
import os
import time

import fault_proxy
import gcs_emulator
import jax
import numpy as np
import pytest
from modeling import datasets_with_hook, small

from configs import tiny_gpt
from pretrain_jax import paths
from pretrain_jax.run import checkpoint, loop
from pretrain_jax.run import lock as lock_lib


@pytest.fixture(scope='module')
def proxy(tmp_path_factory):
  """A FaultProxy in front of the emulator (bucket 'bucket'), its variables in os.environ."""
  saved = dict(os.environ)
  with gcs_emulator.serve() as upstream, fault_proxy.serve(upstream) as proxy:
    os.environ.update(proxy.env)
    os.environ['PRETRAIN_JAX_CACHE'] = str(tmp_path_factory.mktemp('cache'))
    try:
      yield proxy
    finally:
      proxy.clear()
      os.environ.clear()
      os.environ.update(saved)


def train_failing_from(proxy, workdir: str, batch: int, async_save=True, **fault):
  """Trains 6 steps (a checkpoint every 2) to `workdir`; from the `batch`-th batch drawn on,
  the proxy fails requests as `fault` says. Returns (the error raised, seconds from the fault
  to it)."""
  config = small(tiny_gpt.get_config(), steps=6)
  config.train.update(log_every=1, checkpoint_every=2, eval_every=0, async_checkpoints=async_save)
  started = []

  def hook(drawn, batch_):
    if drawn == batch:
      proxy.fail(**fault)
      started.append(time.monotonic())
    return batch_
  try:
    with pytest.raises(Exception) as raised:
      loop.train_and_evaluate(config, workdir, datasets=datasets_with_hook(config, hook))
  finally:
    proxy.clear()
  return raised.value, time.monotonic() - started[0]


@pytest.mark.parametrize('fault', [403, pytest.param(429, marks=pytest.mark.slow)])
def test_a_save_whose_requests_keep_failing_stops_with_one_error(proxy, fault):
  """(a) Permission lost (403: not retried) / quota exhausted (429: gcsfs retries each request
  6 times, 1 + 2 + 4 + 8 + 16 s apart, then raises) on the checkpoints mid-run. The error is
  the save's even where listing the checkpoints fails too."""
  workdir = f'gs://bucket/save_{fault}'
  error, seconds = train_failing_from(proxy, workdir, 3, async_save=False, fault=fault,
                                      prefix=f'{workdir}/checkpoints/')
  print(f'{fault}: stopped {seconds:.1f} s after the fault began ({proxy.counts})')
  assert type(error).__name__ == 'CheckpointSaveError'
  assert f'{workdir}/checkpoints' in str(error) and str(fault) in str(error)
  assert checkpoint.complete_steps(workdir) == [2]
  assert checkpoint.restore_params(workdir)[2] == 2
  assert not paths.resolve(f'{workdir}/LOCK').exists()   # released on the way out


@pytest.mark.parametrize('fault', [503, 'drop'])
def test_the_lock_rides_out_a_burst_and_a_dead_heartbeat_is_taken_over(proxy, fault):
  """(c) A burst of failures shorter than the staleness window: no false takeover (the
  heartbeat's write is retried by google-cloud-storage's default retry, conditional on the
  generation, so a retry is safe). A lock whose heartbeat stopped is still taken over."""
  workdir = f'gs://bucket/lock_{fault}'
  holder = lock_lib.GcsLock(workdir, heartbeat_sec=0.2, stale_sec=4)
  assert holder.acquire() == ''
  failed = proxy.counts['failed']
  proxy.fail(fault, prefix=f'{workdir}/LOCK')
  time.sleep(1.5)                                  # ~7 heartbeats fail
  proxy.clear()
  time.sleep(0.5)
  print(f'lock burst of {fault}: {proxy.counts}')
  assert proxy.counts['failed'] > failed and not holder.lost
  with pytest.raises(lock_lib.LockHeld, match=workdir):
    lock_lib.GcsLock(workdir, stale_sec=4).acquire()
  holder._stop.set()                               # the heartbeat stops (a hung trainer)
  holder._thread.join()
  time.sleep(4.5)
  second = lock_lib.GcsLock(workdir, stale_sec=4)
  assert 'took over the stale lock' in second.acquire()
  second.release()


def test_reading_a_checkpoint_under_failing_requests_succeeds_or_stops_with_one_error(proxy):
  """(d) Transient read failures are retried by the clients and the parameters read are the
  same; a permanent refusal is one CheckpointError naming the checkpoint."""
  workdir = 'gs://bucket/read'
  config = small(tiny_gpt.get_config(), steps=2)
  config.train.update(log_every=1, checkpoint_every=2, eval_every=0)
  loop.train_and_evaluate(config, workdir, datasets=datasets_with_hook(config, lambda d, b: b))
  clean = checkpoint.restore_params(workdir)[1]
  failed = proxy.counts['failed']
  proxy.fail(503, prefix=f'{workdir}/checkpoints/', fraction=0.3)
  try:
    read = checkpoint.restore_params(workdir)[1]
  finally:
    proxy.clear()
  print(f'read with 30% failing: {proxy.counts}')
  assert proxy.counts['failed'] > failed
  assert jax.tree.all(jax.tree.map(np.array_equal, read, clean))
  proxy.fail(403, prefix=f'{workdir}/checkpoints/2/')
  try:
    with pytest.raises(checkpoint.CheckpointError, match=f'{workdir}/checkpoints/2'):
      checkpoint.restore_params(workdir)
  finally:
    proxy.clear()
