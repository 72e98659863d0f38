"""Cloud Storage outages that cannot be ridden out, through tests/fault_proxy.py in front of the
GCS emulator: each ends in one error naming what failed, within the clients' own retry
deadlines, with the last complete checkpoint restorable, and a checkpoint that cannot be read
is skipped and kept, never replaced or deleted (docs/training.md, storage faults)."""
import os
import re
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


# (b) Checkpoints that cannot be read: evaluation and resumption take the newest that reads.

def trained(workdir: str, steps: int) -> dict:
  """Trains a tiny GPT on synthetic data to `steps` in `workdir`, a checkpoint every 2 steps,
  the newest 2 kept."""
  config = small(tiny_gpt.get_config(), steps=steps)
  config.train.update(log_every=1, checkpoint_every=2, eval_every=0, keep_checkpoints=2)
  return loop.train_and_evaluate(config, workdir,
                                 datasets=datasets_with_hook(config, lambda d, b: b))


def generations(prefix: str) -> dict:
  """{name: generation} of the objects under gs://bucket/<prefix>, listed by
  google-cloud-storage (gcsfs would answer from its listing cache): a rewrite changes them."""
  from google.cloud import storage  # noqa: PLC0415 (gs:// only)
  return {b.name: b.generation for b in storage.Client().list_blobs('bucket', prefix=prefix)}


def skipped(err: str, step: int) -> list:
  """The lines of `err` saying checkpoint `step` was skipped as unreadable."""
  return [line for line in err.splitlines()
          if re.match(rf'checkpoint {step} under \S+ could not be read \(.*Forbidden.*\); '
                      'skipped', line)]


@pytest.mark.parametrize('unreadable,read', [
    ('state/', 'state'), pytest.param('', 'commit_success.txt', marks=pytest.mark.slow)])
def test_an_unreadable_newest_checkpoint_is_skipped_and_kept(proxy, capsys, unreadable, read):
  """Every read of checkpoint 4's arrays refused (the restore fails), or of all its files (the
  listing cannot tell it is complete): evaluation reads 2, saying so in one line; the resumed
  run trains from 2, saves neither over 4 nor deletes any checkpoint (orbax's rotation would
  read every folder's state), and 4's files are the ones written before; the next run
  rotates."""
  workdir = f'gs://bucket/unreadable_{read}'
  trained(workdir, 4)
  written = generations(f'unreadable_{read}/checkpoints/4/')
  capsys.readouterr()
  proxy.fail(403, prefix=f'{workdir}/checkpoints/4/{unreadable}')
  try:
    assert checkpoint.restore_params(workdir)[2] == 2
    lines = skipped(capsys.readouterr().err, 4)
    assert len(lines) == 1 and read in lines[0], lines
    resumed = trained(workdir, 6)
  finally:
    proxy.clear()
  err = capsys.readouterr().err
  assert resumed['start_step'] == 2 and resumed['step'] == 6
  assert len(skipped(err, 4)) == 1 and 'resuming from step 2' in skipped(err, 4)[0], err
  assert 'not saving step 4' in err
  assert checkpoint.complete_steps(workdir) == [2, 4, 6]   # none rotated away (keep 2)
  assert generations(f'unreadable_{read}/checkpoints/4/') == written
  assert checkpoint.restore_params(workdir, 4)[2] == 4
  if not unreadable:   # (the slow case only: one more run)
    assert trained(workdir, 8)['checkpoint_steps'] == [6, 8]   # the next run rotates


def test_no_readable_checkpoint_is_one_error_naming_them_all(proxy):
  workdir = 'gs://bucket/none_readable'
  trained(workdir, 4)
  for step in (2, 4):
    proxy.fail(403, prefix=f'{workdir}/checkpoints/{step}/')
  try:
    with pytest.raises(checkpoint.CheckpointError,
                       match=r'no checkpoint under \S+ could be read: \S+/checkpoints/4 '
                             r'\(.*Forbidden.*\) \| \S+/checkpoints/2 \(.*Forbidden'):
      checkpoint.restore_params(workdir)
    with pytest.raises(checkpoint.CheckpointError,
                       match=r'no checkpoint under \S+ restores: .*checkpoints/2 could not '
                             r'be read .*checkpoints/4 could not be read .*rerun the same '
                             r'command'):
      trained(workdir, 6)
  finally:
    proxy.clear()
  assert checkpoint.complete_steps(workdir) == [2, 4]   # nothing moved, deleted or trained
