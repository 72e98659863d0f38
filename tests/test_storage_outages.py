"""Cloud Storage outages that cannot be ridden out, through tests/fault_proxy.py in front of the
GCS emulator: each ends in one error naming what failed, within the clients' own retry
deadlines, with the last complete checkpoint restorable, and a checkpoint that cannot be read
is skipped and kept, never replaced or deleted (docs/training.md, storage faults)."""
import json
import os
import re
import subprocess
import sys
import time

import fault_proxy
import gcs_emulator
import jax
import numpy as np
import pytest
from helpers import ROOT, one_device_env
from modeling import datasets_with_hook, small

from configs import tiny_gpt
from pretrain_jax import data, paths
from pretrain_jax.data import corpus, sources
from pretrain_jax.data.config import DataConfig
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


# (a) A data read that keeps failing: tfds data in the bucket, read by TensorFlow's GCS client.

def test_a_failed_read_of_the_input_pipeline_names_the_file():
  """TensorFlow's read errors name the file after `when reading`, wrapped in its op's text; an
  error of the pipeline's own (a bug) is left as it is."""
  import tensorflow as tf  # noqa: PLC0415
  spent = tf.errors.AbortedError(None, None, (
      '{{function_node __wrapped__IteratorGetNext_device_/job:localhost}} All 10 retry attempts '
      "failed. The last failure: HTTP response code 503 with body '{}'\n\t when reading "
      'gs://b/d/x.tfrecord-00000-of-00001 [Op:IteratorGetNext] name: '))
  assert str(sources.read_error(spent)) == (
      'reading gs://b/d/x.tfrecord-00000-of-00001 failed (AbortedError: All 10 retry attempts '
      "failed. The last failure: HTTP response code 503 with body '{}')")
  gone = tf.errors.NotFoundError(None, None, '/data/x.tfrecord; No such file or directory')
  assert str(sources.read_error(gone)).startswith('reading /data/x.tfrecord failed (NotFound')
  assert sources.read_error(tf.errors.InvalidArgumentError(None, None, 'shapes differ')) is None
  assert sources.read_error(ValueError('a bug')) is None


DOCUMENTS = 8   # of 150 characters: an epoch of a stream every few steps, each reopening the file


@pytest.fixture(scope='module')
def bucket_data(proxy, tmp_path_factory):
  """(config, local files) of a 1-layer GPT whose data are DOCUMENTS short documents prepared as
  tfds in gs://bucket/prepared, streamed from there (shuffle_buffer 1) by TensorFlow's GCS
  client through the proxy; a char tokenizer, trained in the module's cache."""
  folder = tmp_path_factory.mktemp('data')
  files = str(folder / 'docs.jsonl')
  with open(files, 'w') as f:
    f.writelines(json.dumps({'text': d[:150]}) + '\n'
                 for d in corpus.embedded_documents()[:DOCUMENTS])
  config = small(tiny_gpt.get_config(), steps=8)
  config.model.vocab_size = 384
  config.data.update(files=files, tokenizer_type='char', tokenizer_vocab_size=300,
                     shuffle_buffer=1, validation_fraction=0.1)
  config.train.update(log_every=1, checkpoint_every=2, eval_every=0)
  sources.open_source(DataConfig.from_config(config.data), data_dir=str(folder / 'prepared'))
  paths.copy_tree(str(folder / 'prepared'), 'gs://bucket/prepared')
  config.data.prepared_dir = 'gs://bucket/prepared'
  return config, files


def failing_from_batch(monkeypatch, proxy, n, **fault):
  """data.make_dataset's train split has the proxy fail requests as `fault` says from its n-th
  batch drawn on; returns the list that gets the time it began."""
  real, began = data.make_dataset, []

  def make(data_config, tokenizer, *, split, **kw):
    it = real(data_config, tokenizer, split=split, **kw)
    if split != data_config.train_split:
      return it
    nxt, drawn = it.__next__, [0]

    class Hooked(type(it)):
      def __next__(self):
        drawn[0] += 1
        if drawn[0] == n:
          proxy.fail(**fault)
          began.append(time.monotonic())
        return nxt()
    it.__class__ = Hooked
    return it
  monkeypatch.setattr(data, 'make_dataset', make)
  return began


def test_a_data_read_refused_for_good_stops_with_one_error_naming_the_file(
    proxy, bucket_data, monkeypatch):
  """Permission to read the data lost mid-run (403: TensorFlow does not retry it): one
  DataReadError naming the tfrecord file and the same command to resume; the newest complete
  checkpoint restores (the slow test below resumes from it)."""
  config, _ = bucket_data
  workdir = 'gs://bucket/data_refused'
  with monkeypatch.context() as patch:
    began = failing_from_batch(patch, proxy, 3, fault=403, prefix='gs://bucket/prepared/')
    try:
      with pytest.raises(Exception) as raised:
        loop.train_and_evaluate(config, workdir)
    finally:
      proxy.clear()
  seconds, error = time.monotonic() - began[0], str(raised.value)
  print(f'stopped {seconds:.1f} s after the fault began: {error}')
  assert type(raised.value).__name__ == 'DataReadError', error
  assert re.match(r'reading gs://bucket/prepared/\S+\.tfrecord-\d+-of-\d+ failed '
                  r'\(PermissionDeniedError: .*403', error), error
  newest = int(re.search(r'newest complete checkpoint is step (\d+): .* rerun the same '
                         r'command', error).group(1))
  assert checkpoint.complete_steps(workdir)[-1] == newest
  assert checkpoint.restore_params(workdir)[2] == newest


@pytest.mark.slow
def test_a_data_outage_the_client_retries_out_is_one_line_and_a_rerun_rides_out_a_flaky_one(
    proxy, bucket_data):
  """`pretrain-jax train` reading its data from the bucket: every read fails (503) from step 3
  on; TensorFlow's GCS client retries each (its own setting, GCS_RETRY_CONFIG_*: 6 retries 0.1 s
  apart and doubling, read when TensorFlow loads, hence a process of its own) and the run stops
  with one `error:` line naming the file. The same command, with 30% of the data reads failing,
  resumes from the newest checkpoint and finishes: the client's retries ride those out."""
  config, files = bucket_data
  workdir = 'gs://bucket/data_cli'
  env = dict(one_device_env(), **proxy.env, PRETRAIN_JAX_CACHE=os.environ['PRETRAIN_JAX_CACHE'],
             GCS_RETRY_CONFIG_MAX_RETRIES='6', GCS_RETRY_CONFIG_INIT_DELAY_TIME_US='100000')
  argv = [sys.executable, '-m', 'pretrain_jax.commands.train', '--workdir', workdir,
          '--config', os.path.join(ROOT, 'configs', 'tiny_gpt.py'),
          *[f'--config.{k}={v}' for k, v in [
              ('model.num_layers', 1), ('model.vocab_size', 384), ('train.batch_size', 4),
              ('train.steps', 8), ('train.log_every', 1), ('train.checkpoint_every', 2),
              ('train.eval_every', 0), ('data.seq_len', 64), ('data.files', files),
              ('data.prepared_dir', config.data.prepared_dir), ('data.tokenizer_type', 'char'),
              ('data.tokenizer_vocab_size', 300), ('data.shuffle_buffer', 1),
              ('data.validation_fraction', 0.1)]]]
  run = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
  err, began = [], None
  try:
    for line in run.stderr:
      err.append(line)
      if line.startswith('step 3/8'):
        proxy.fail(503, prefix='gs://bucket/prepared/')
        began = time.monotonic()
    run.wait(timeout=600)
  finally:
    proxy.clear()
  seconds = time.monotonic() - began
  errors = [line for line in err if line.startswith('error:')]
  print(f'503s: stopped {seconds:.1f} s after the fault began ({proxy.counts}): {errors}')
  assert run.returncode == 2 and len(errors) == 1 and errors[0] == err[-1], ''.join(err)
  assert 'Traceback' not in ''.join(err)
  assert re.match(r'error: reading gs://bucket/prepared/\S+\.tfrecord-\d+-of-\d+ failed '
                  r'\(AbortedError: All 6 retry attempts failed.* 503', errors[0])
  newest = int(re.search(r'newest complete checkpoint is step (\d+)', errors[0]).group(1))
  assert checkpoint.complete_steps(workdir)[-1] == newest
  failed = proxy.counts['failed']
  proxy.fail(503, prefix='gs://bucket/prepared/', fraction=0.3)
  try:
    again = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600, check=False)
  finally:
    proxy.clear()
  print(f'30% of reads failing: {proxy.counts["failed"] - failed} failed and were retried')
  assert again.returncode == 0, again.stderr[-3000:]
  result = json.loads(again.stdout.strip().splitlines()[-1])
  assert result['start_step'] == newest and result['step'] == 8
  assert proxy.counts['failed'] > failed
