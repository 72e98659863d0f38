"""Nothing lost under faults: a second trainer, a changed config, NaN, bit flips, damaged or
unfinished checkpoints, a full disk, a double SIGTERM, kill -9 (tiny GPT, synthetic data)."""
import errno
import hashlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import commands
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import ROOT, flip_bytes
from modeling import data_files, small, tiny_config
from orbax.checkpoint._src.handlers import json_checkpoint_handler

from configs import tiny_gpt
from pretrain_jax import data
from pretrain_jax.run import checkpoint, loop
from pretrain_jax.run import lock as lock_lib
from pretrain_jax.run import metrics as metrics_lib
from pretrain_jax.run import workdir as workdir_lib
from pretrain_jax.training import synthetic


def gpt(**train):
  config = tiny_config('gpt', **train)
  config.model.num_layers = 1
  return config


def train(config, workdir, datasets=None):
  return loop.train_and_evaluate(config, str(workdir),
                                 datasets=datasets or synthetic.synthetic_datasets(config))


def snapshot(workdir) -> dict:
  """{relative path: (sha256, mtime_ns)} of every file under `workdir`."""
  out = {}
  for root, _, files in os.walk(workdir):
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, workdir)] = (hashlib.sha256(f.read()).hexdigest(),
                                               os.stat(path).st_mtime_ns)
  return out


def train_steps(workdir) -> list:
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [r['step'] for r in map(json.loads, f) if r['split'] == 'train']


# 1. One trainer per workdir.

def test_second_trainer_is_refused_and_changes_nothing(tmp_path):
  config = gpt(steps=2, checkpoint_every=1)
  train(config, tmp_path)
  holder = lock_lib.LocalLock(str(tmp_path))   # a live trainer: this very process
  holder.acquire()
  try:
    before = snapshot(tmp_path)
    config.train.steps = 4
    with pytest.raises(lock_lib.LockHeld,
                       match=f'in use by pid {os.getpid()} on {re.escape(socket.gethostname())}'):
      train(config, tmp_path)
    assert snapshot(tmp_path) == before
  finally:
    holder.release()
  assert not os.path.exists(tmp_path / 'LOCK')
  assert train(config, tmp_path)['step'] == 4       # free again
  assert not os.path.exists(tmp_path / 'LOCK')      # released at the end of the run


def dead_pid() -> int:
  child = subprocess.Popen([sys.executable, '-c', 'pass'])
  child.wait()
  return child.pid


@pytest.mark.parametrize('holder,reason', [
    (dict(host=socket.gethostname(), pid=None, heartbeat=time.time()), 'on this host is gone'),
    # (the heartbeat is an hour older than collection time; the test may run minutes later)
    (dict(host='elsewhere', pid=1, heartbeat=time.time() - 3600),
     r'heartbeat \d{4,} s old \(> 600 s\)'),
    ({}, r'heartbeat 36\d\d s old'),   # a holder killed between creating and writing the file
])
def test_a_stale_lock_is_taken_over_with_a_message(tmp_path, holder, reason):
  if 'pid' in holder and holder['pid'] is None:
    holder['pid'] = dead_pid()
  (tmp_path / 'LOCK').write_text(json.dumps(holder) if holder else '')
  if not holder:
    os.utime(tmp_path / 'LOCK', (time.time() - 3600,) * 2)
  lock = lock_lib.LocalLock(str(tmp_path), heartbeat_sec=0.05)
  message = lock.acquire()
  try:
    assert 'took over the stale lock' in message and re.search(reason, message), message
    first = json.loads((tmp_path / 'LOCK').read_text())
    assert first['pid'] == os.getpid()
    time.sleep(0.3)
    assert json.loads((tmp_path / 'LOCK').read_text())['heartbeat'] > first['heartbeat']
  finally:
    lock.release()
  assert not os.path.exists(tmp_path / 'LOCK')


def test_a_lock_whose_heartbeat_thread_has_not_started_is_still_released(tmp_path):
  """A SIGTERM right after the LOCK appears can land between creating the heartbeat thread and
  starting it; the start-up handler's release() must remove the LOCK all the same (joining an
  unstarted thread raises, and the handler swallows errors, leaving the LOCK)."""
  lock = lock_lib.LocalLock(str(tmp_path))
  assert lock._claim(None)
  lock._thread = threading.Thread(target=lambda: None)   # made, not started
  lock.release()
  assert not (tmp_path / 'LOCK').exists()


def test_a_lock_created_but_not_yet_noted_is_still_released(tmp_path):
  """SIGTERM during start-up once landed between creating the LOCK and noting its record; the
  start-up handler's release() then saw no record and left the LOCK (tests/test_faults.py's
  start-up SIGTERM test failed that way on a loaded machine). The record is noted before the
  LOCK is created whole, and release() removes a LOCK holding it (and the record's temporary
  file); another process's LOCK and a LOCK this process lost stay."""
  lock = lock_lib.LocalLock(str(tmp_path))
  assert lock._claim(None)                # written; acquire() has not returned
  assert json.loads((tmp_path / 'LOCK').read_text())['pid'] == os.getpid()   # never empty
  with open(lock._tmp, 'w') as f:        # a SIGTERM inside the next write left its temporary
    f.write('{')
  lock.release()
  assert sorted(os.listdir(tmp_path)) == []   # no LOCK, no temporary file
  other = dict(host=socket.gethostname(), pid=os.getpid(), start=1.0, heartbeat=time.time())
  (tmp_path / 'LOCK').write_text(json.dumps(other))
  assert not lock._claim(None)            # held: this one's record is not the one on disk
  lock.release()
  assert json.loads((tmp_path / 'LOCK').read_text()) == other
  (tmp_path / 'LOCK').unlink()
  assert lock._claim(None)
  lock.lost = True                       # taken over: never deletes
  lock.release()
  assert (tmp_path / 'LOCK').exists()


def test_of_two_trainers_taking_over_one_stale_lock_one_wins(tmp_path, monkeypatch):
  """Both read the stale lock; the first takes it over; the second's takeover is made against
  the lock it read, which is gone, so it refuses, and the LOCK stays the first's. A stale lock
  removed between the read and the takeover is created anew."""
  stale = json.dumps(dict(host='elsewhere', pid=1, start=1.0, heartbeat=time.time() - 3600))
  (tmp_path / 'LOCK').write_text(stale)
  first, second, third = (lock_lib.LocalLock(str(tmp_path), heartbeat_sec=3600)
                          for _ in range(3))

  def reads_first(lock, first_read):      # its first read of the lock is `first_read()`
    reads = iter([first_read])
    monkeypatch.setattr(lock, '_read', lambda: next(reads, lambda: None)() or
                        lock_lib.LocalLock._read(lock))
  snapshot = second._read()
  reads_first(second, lambda: snapshot)   # read before the first's takeover
  try:
    assert 'took over the stale lock' in first.acquire()
    with pytest.raises(lock_lib.LockHeld, match=f'in use by pid {os.getpid()} on '):
      second.acquire()
    assert json.loads((tmp_path / 'LOCK').read_text())['start'] == first.record['start']
  finally:
    second.release()
    assert (tmp_path / 'LOCK').exists()   # the refused one removes nothing
    first.release()
  assert sorted(os.listdir(tmp_path)) == []
  (tmp_path / 'LOCK').write_text(stale)

  def read_then_removed():
    read = lock_lib.LocalLock._read(third)
    (tmp_path / 'LOCK').unlink()
    return read
  reads_first(third, read_then_removed)
  assert 'took over the stale lock' in third.acquire()
  assert json.loads((tmp_path / 'LOCK').read_text())['start'] == third.record['start']
  third.release()
  assert sorted(os.listdir(tmp_path)) == []


def test_the_heartbeat_and_a_save_refreshing_at_once_keep_the_lock(tmp_path):
  """refresh() runs on the heartbeat thread and before each save, unserialized: a write that
  loses to the other finds its own record and goes on; no temporary file is left."""
  lock = lock_lib.LocalLock(str(tmp_path), heartbeat_sec=3600)
  lock.acquire()
  errors = []

  def refresh_many():
    try:
      for _ in range(200):
        lock.refresh()
    except Exception as e:
      errors.append(e)
  threads = [threading.Thread(target=refresh_many) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors and not lock.lost
  assert json.loads((tmp_path / 'LOCK').read_text())['start'] == lock.record['start']
  lock.release()
  assert sorted(os.listdir(tmp_path)) == []


def test_a_live_lock_on_another_host_is_respected(tmp_path):
  (tmp_path / 'LOCK').write_text(json.dumps(dict(host='elsewhere', pid=1, start=time.time(),
                                                 heartbeat=time.time() - 5)))
  with pytest.raises(lock_lib.LockHeld, match='in use by pid 1 on elsewhere'):
    lock_lib.LocalLock(str(tmp_path)).acquire()


# 2. A resume with another model or data stream is refused before anything is written.

def test_config_differences_name_each_key():
  saved = gpt().to_dict()
  other = tiny_config('bert').to_dict()
  lines = workdir_lib.config_differences(saved, other)
  assert "model.family: 'gpt' -> 'bert'" in lines and "data.objective: 'clm' -> 'mlm'" in lines
  changed = gpt(steps=99, learning_rate=0.5, checkpoint_every=7)
  changed.mesh.data = 1
  assert workdir_lib.config_differences(saved, changed.to_dict()) == \
      ['train.learning_rate: 0.01 -> 0.5']
  assert workdir_lib.config_differences(saved, changed.to_dict(), 'train.learning_rate') == []
  with pytest.raises(ValueError, match='allow_config_change names model.num_layers'):
    workdir_lib.config_differences(saved, saved, 'train.learning_rate,model.num_layers')
  # Where the prepared copy lives is not what it holds: a config.json from before the key, or
  # a run moving its copy, resumes.
  older = gpt().to_dict()
  del older['data']['prepared_dir']
  moved = gpt()
  moved.data.prepared_dir = 'gs://bucket/prepared'
  assert workdir_lib.config_differences(older, moved.to_dict()) == []
  # The default stream count (0: resolved from the batch) written out, as the data position's
  # own refusal suggests: the data position compares the resolved counts
  spelled = gpt()
  spelled.data.num_streams = 8
  assert workdir_lib.config_differences(saved, spelled.to_dict()) == []


def test_a_changed_data_source_is_refused_before_any_data_are_prepared(tmp_path, monkeypatch):
  """A resume with another data.files read and prepared the new files (hours on C4) before
  refusing a change that needed only config.json."""
  config = gpt(steps=2)
  config.data.files = str(tmp_path / 'corpus_a' / '*.jsonl')
  workdir_lib.write_config(config, str(tmp_path / 'run'), '', None)
  config.data.files = str(tmp_path / 'corpus_b' / '*.jsonl')

  def opened(*args, **kwargs):
    raise AssertionError('the data were opened before the config check')
  monkeypatch.setattr(loop, 'open_datasets', opened)
  with pytest.raises(ValueError, match=r"the config differs from .*data\.files: '.*corpus_a"):
    loop.train_and_evaluate(config, str(tmp_path / 'run'))


def test_refused_resume_leaves_config_json_unchanged(tmp_path):
  config = gpt(steps=2, checkpoint_every=1)
  train(config, tmp_path)
  before = snapshot(tmp_path)
  bert = tiny_config('bert', steps=4)
  bert.model.num_layers = 1
  with pytest.raises(ValueError, match=r"model\.family: 'gpt' -> 'bert'"):
    train(bert, tmp_path)
  deeper = gpt(steps=4)
  deeper.model.num_layers = 3
  with pytest.raises(ValueError, match=r'model\.num_layers: 1 -> 3'):
    train(deeper, tmp_path)
  assert snapshot(tmp_path) == before
  checkpoint.restore_params(str(tmp_path))         # evaluate still reads the checkpoints

  # A resume that trains nothing rewrites nothing; an allowed change is kept in the history.
  train(config, tmp_path)
  assert snapshot(tmp_path)[workdir_lib.CONFIG_FILE] == before[workdir_lib.CONFIG_FILE]
  faster = gpt(steps=3, checkpoint_every=1, learning_rate=0.02,
               allow_config_change='train.learning_rate')
  assert train(faster, tmp_path)['step'] == 3
  assert sorted(os.listdir(tmp_path / 'config_history')) == ['0_step0.json', '1_step2.json']
  assert workdir_lib.load_config(str(tmp_path)).train.learning_rate == 0.02


def test_a_refused_resume_at_the_last_step_does_not_say_nothing_to_train(tmp_path, capsys):
  """'already at train.steps=2: nothing to train' came before the refusal of a changed model,
  as if the run were finished; it is said only to a run the config check lets through."""
  config = gpt(steps=2, checkpoint_every=1)
  train(config, tmp_path)
  capsys.readouterr()
  deeper = gpt(steps=2, checkpoint_every=1)
  deeper.model.num_layers = 3
  with pytest.raises(ValueError, match=r'model\.num_layers: 1 -> 3'):
    train(deeper, tmp_path)
  assert 'nothing to train' not in capsys.readouterr().err
  assert train(config, tmp_path)['step'] == 2
  assert 'already at train.steps=2' in capsys.readouterr().err
  os.rename(tmp_path / workdir_lib.CONFIG_FILE, tmp_path / 'config.json.moved')
  with pytest.raises(ValueError, match='config.json'):   # refused later, by write_config
    train(config, tmp_path)
  assert 'nothing to train' not in capsys.readouterr().err


# 3. No non-finite state is ever saved; restore_params refuses one.

@pytest.mark.parametrize('warmup, async_save, stop', [(0, False, 2), (30, True, 3)])
def test_a_divergence_sets_aside_the_checkpoint_whose_loss_it_is(tmp_path, warmup, async_save,
                                                                 stop):
  # The largest rates float32 holds (a larger one is refused by the config check). Warmup's
  # first rate is 0, so step 1 keeps the init; the next update puts the weights near 1e30, and
  # the loss of that state, the step after, overflows: its checkpoint would evaluate to NaN.
  config = gpt(steps=4, checkpoint_every=1, learning_rate=1e30, warmup_steps=warmup,
               async_checkpoints=async_save)
  with pytest.raises(FloatingPointError, match=rf'non-finite training at step {stop}: loss') \
      as raised:
    train(config, tmp_path)
  assert f'checkpoint {stop - 1}, whose loss this is, was moved aside' in str(raised.value)
  assert checkpoint.complete_steps(str(tmp_path)) == list(range(1, stop - 1))
  assert [p.split('-')[0] for p in os.listdir(tmp_path / 'checkpoints') if '.' in p] == \
      [f'{stop - 1}.nonfinite']
  # The run resumes from the checkpoint before (a fresh start when there is none) and, at a
  # sane rate, trains to a finite loss.
  config.train.update(learning_rate=1e-3, allow_config_change='train.learning_rate')
  result = train(config, tmp_path)
  assert result['start_step'] == stop - 2 and math.isfinite(result['train_loss'])


def test_restore_params_refuses_non_finite_params(tmp_path):
  config = gpt(steps=1)
  train(config, tmp_path)
  ckpt = checkpoint.Checkpointer(str(tmp_path), async_save=False)
  params = checkpoint.restore_params(str(tmp_path))[1]
  bad = jax.tree.map(lambda x: x * np.float32('nan'), params)
  # Written the way a diverged run without the step's check would have written it.
  ckpt.manager.save(2, args=ocp.args.Composite(
      state=ocp.args.StandardSave({'params': bad}), data=ocp.args.JsonSave({})))
  ckpt.close()
  with pytest.raises(checkpoint.CheckpointError, match='params/.* holds non-finite values'):
    checkpoint.restore_params(str(tmp_path), step=2)


# 4./5. Bit flips and damaged checkpoints: detected, moved aside, the previous one is used.

def test_checksums_name_the_damaged_array():
  tree = {'params': {'w': jax.numpy.arange(6.0).reshape(2, 3)}}
  sums = checkpoint.shard_checksums(tree)
  assert checkpoint.verify(tree, sums, 'ckpt') == 0
  flipped = np.arange(6.0, dtype=np.float32).reshape(2, 3)
  flipped.reshape(-1).view(np.uint8)[5] ^= 0x01
  with pytest.raises(checkpoint.CheckpointError,
                     match=r'ckpt: array params/w \(shard \[\[0, 2\], \[0, 3\]\]\)'):
    checkpoint.verify({'params': {'w': jax.numpy.asarray(flipped)}}, sums, 'ckpt')


def test_flipped_bytes_are_detected_on_restore(tmp_path):
  train(gpt(steps=2, checkpoint_every=1), tmp_path)
  for path in data_files(tmp_path, 2):   # params and optimizer state alike
    flip_bytes(path)
  with pytest.raises(checkpoint.CheckpointError, match=r'checkpoint .*/checkpoints/2'):
    checkpoint.restore_params(str(tmp_path))
  checkpoint.restore_params(str(tmp_path), step=1)


def damage(workdir, step, how):
  state = os.path.join(checkpoint.checkpoint_dir(str(workdir)), str(step), 'state')
  if how == 'flip':
    for path in data_files(workdir, step):
      flip_bytes(path)
  elif how == 'truncate':
    path = data_files(workdir, step)[0]
    os.truncate(path, os.path.getsize(path) // 2)
  elif how == 'delete':
    os.remove(data_files(workdir, step)[0])
  elif how == 'garbage':
    path = data_files(workdir, step)[0]
    with open(path, 'wb') as f:
      f.write(os.urandom(os.path.getsize(path)))
  elif how == 'garbage_metadata':
    with open(os.path.join(state, '_METADATA'), 'w') as f:
      f.write('{not json')
  elif how == 'missing_metadata':
    os.remove(os.path.join(state, '_METADATA'))


@pytest.mark.parametrize('how', [
    'truncate', 'flip',
    pytest.param('delete', marks=pytest.mark.slow),
    pytest.param('garbage', marks=pytest.mark.slow),
    pytest.param('garbage_metadata', marks=pytest.mark.slow),
    pytest.param('missing_metadata', marks=pytest.mark.slow)])
def test_damaged_newest_checkpoint_falls_back_and_is_moved_aside(tmp_path, capsys, how):
  whole = tmp_path / 'whole'
  train(gpt(steps=4, checkpoint_every=2), whole)
  config = gpt(steps=4, checkpoint_every=2)
  config.train.steps = 3    # checkpoints 2 and 3 (the final one)
  train(config, tmp_path / 'w')
  damage(tmp_path / 'w', 3, how)
  config.train.steps = 4
  result = train(config, tmp_path / 'w')
  assert result['start_step'] == 2 and result['step'] == 4
  err = capsys.readouterr().err
  assert re.search(r'checkpoint 3 is damaged and was moved aside to .*/3\.corrupt-\d', err), err
  moved = [n for n in os.listdir(checkpoint.checkpoint_dir(str(tmp_path / 'w')))
           if n.startswith('3.corrupt-')]
  assert len(moved) == 1                          # kept, never deleted
  a = checkpoint.restore_params(str(whole))[1]
  b = checkpoint.restore_params(str(tmp_path / 'w'))[1]
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_a_damaged_last_checkpoint_trains_its_step_again_without_saying_nothing_to_train(
    tmp_path, capsys):
  """The newest checkpoint was at train.steps, so 'nothing to train' was printed, and then it
  proved damaged and the run fell back and trained: the message follows the restored step."""
  config = gpt(steps=3, checkpoint_every=2)          # checkpoints 2 and 3 (the final one)
  train(config, tmp_path)
  damage(tmp_path, 3, 'truncate')
  capsys.readouterr()
  result = train(config, tmp_path)
  assert (result['start_step'], result['step']) == (2, 3)
  err = capsys.readouterr().err
  assert 'checkpoint 3 is damaged' in err and 'nothing to train' not in err, err
  assert train(config, tmp_path)['start_step'] == 3
  assert 'already at train.steps=3' in capsys.readouterr().err


@pytest.mark.slow   # two trainings, one in a fresh process
def test_a_damaged_checkpoint_is_a_few_lines_naming_the_array_not_thousands(tmp_path):
  """The fallback worked, but orbax's abandoned reads printed ~4,000 lines (Exception ignored in
  <coroutine ...>, Event loop is closed, Future exception was never retrieved) and the one line
  was cut inside a TensorStore repr, naming no array."""
  args = ['--config', os.path.join(ROOT, 'configs', 'tiny_gpt.py'), '--workdir', str(tmp_path),
          '--config.train.checkpoint_every=2', '--config.train.eval_every=0',
          '--config.model.num_layers=1', '--config.train.batch_size=4',
          '--config.data.seq_len=32']
  first = commands.run('train', *args, '--config.train.steps=4', timeout=600)
  assert first.returncode == 0, first.stderr[-3000:]
  damage(tmp_path, 4, 'delete')
  # A fresh process: what it prints at exit (its last garbage collection) is checked too.
  done = subprocess.run([sys.executable, '-m', 'pretrain_jax.commands.train', *args,
                         '--config.train.steps=6'], capture_output=True, text=True,
                        timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stderr.strip().splitlines()
  moved = [x for x in lines if x.startswith('checkpoint 4 is damaged and was moved aside')]
  assert len(moved) == 1 and re.search(r'failed to restore \(\w+: .*Error reading "\S+/', moved[0])
  assert len(lines) < 20, done.stderr[-3000:]
  assert 'Exception ignored' not in done.stderr and 'Event loop is closed' not in done.stderr


def test_no_restorable_checkpoint_moves_nothing(tmp_path):
  config = gpt(steps=1)
  train(config, tmp_path)
  damage(tmp_path, 1, 'truncate')
  config.train.steps = 2
  with pytest.raises(checkpoint.CheckpointError, match='no checkpoint under .* restores'):
    train(config, tmp_path)
  assert checkpoint.complete_steps(str(tmp_path)) == [1]


# 6. A full disk stops the run at once; a restart needs no cleanup.

def test_failed_save_stops_at_once_and_a_restart_resumes(tmp_path, monkeypatch):
  """The save of step 10 fails in the background while step 12 trains; the run stops on the
  next step (13), long before the next log / save point (20), and the restart resumes."""
  original = json_checkpoint_handler.JsonCheckpointHandler._save_fn
  at_step_12, failed = threading.Event(), threading.Event()

  async def disk_full(self, x, directory):
    if re.search(r'/10\.orbax-checkpoint-tmp', str(directory)):
      at_step_12.wait(timeout=60)     # the background save is still writing at step 12
      failed.set()
      raise OSError(errno.ENOSPC, 'No space left on device', str(directory))
    return await original(self, x, directory)

  stepped = metrics_lib.StepClock.stepped
  steps_seen = []

  def stepped_and_hook(self, metrics):
    stepped(self, metrics)
    steps_seen.append(None)
    if len(steps_seen) == 12:
      at_step_12.set()
      assert failed.wait(timeout=60)
      time.sleep(0.5)                 # the save thread ends with the error
  monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, '_save_fn', disk_full)
  monkeypatch.setattr(metrics_lib.StepClock, 'stepped', stepped_and_hook)
  config = gpt(steps=40, checkpoint_every=10, log_every=20)
  with pytest.raises(checkpoint.CheckpointSaveError,
                     match=r'checkpoint 10 .*No space left.*step 13\. .* is none'):
    train(config, tmp_path)
  assert checkpoint.complete_steps(str(tmp_path)) == []
  monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, '_save_fn', original)
  monkeypatch.setattr(metrics_lib.StepClock, 'stepped', stepped)
  config.train.steps = 20
  result = train(config, tmp_path)
  assert result['start_step'] == 0 and result['step'] == 20
  assert checkpoint.complete_steps(str(tmp_path)) == [10, 20]
  assert not [n for n in os.listdir(checkpoint.checkpoint_dir(str(tmp_path))) if 'tmp' in n]


def test_leftover_temporary_folders_are_removed_at_start(tmp_path, capsys):
  config = gpt(steps=1)
  train(config, tmp_path)
  leftover = os.path.join(checkpoint.checkpoint_dir(str(tmp_path)),
                          '7.orbax-checkpoint-tmp-1234567')
  os.makedirs(os.path.join(leftover, 'state'))
  config.train.steps = 2
  assert train(config, tmp_path)['start_step'] == 1
  assert not os.path.exists(leftover)
  assert '7.orbax-checkpoint-tmp-1234567' in capsys.readouterr().err


# 7. Cadence errors and a run asked to go backwards.

@pytest.mark.parametrize('key,value,hint', [
    ('checkpoint_every', 0, 'a final checkpoint is always saved'),
    ('log_every', 0, 'train.log_every >= train.steps logs only the last step'),
    ('keep_checkpoints', -1, '0 keeps all')])
def test_bad_cadence_is_refused(tmp_path, key, value, hint):
  with pytest.raises(ValueError, match=f'train.{key}={value}') as raised:
    train(gpt(**{key: value}), tmp_path)
  assert hint in str(raised.value)    # (the log_every error gave checkpoint_every's hint)
  assert not os.path.exists(tmp_path / 'config.json')


def test_fewer_steps_than_the_checkpoint_is_an_error(tmp_path):
  os.makedirs(os.path.join(checkpoint.checkpoint_dir(str(tmp_path)), '40'))
  with pytest.raises(ValueError, match=r'train\.steps=20 .*step 40\b'):
    train(gpt(steps=20), tmp_path)
  assert not os.path.exists(tmp_path / 'LOCK')


# 8. Signals and kills (subprocesses).

CHILD = '''
import os, signal, sys, time, json
sys.path[:0] = [{root!r}, {tests!r}]
from modeling import tiny_config
from pretrain_jax.training import synthetic
from pretrain_jax.run import checkpoint, loop
from pretrain_jax.run import metrics as metrics_lib
config = tiny_config('gpt', steps=40, checkpoint_every={every})
config.model.num_layers = 1
mode = {mode!r}
base = synthetic.synthetic_datasets(config)

def datasets(*, split, **kw):
  data = base(split=split, **kw)
  if split != config.data.train_split or mode != 'sigterm':
    return data
  inner_next = type(data).__next__
  class Hooked(type(data)):
    def __next__(self):
      if self.index == 13:
        os.kill(os.getpid(), signal.SIGTERM)
      return inner_next(self)
  data.__class__ = Hooked
  return data

original_wait, original_save = checkpoint.Checkpointer.wait, checkpoint.Checkpointer.save
def slow_wait(self):            # the second SIGTERM lands while the final save is written
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(0.5)
  original_wait(self)
def save_then_die(self, step, *args):
  original_save(self, step, *args)
  if step == 10:
    os.kill(os.getpid(), signal.SIGKILL)    # the save of step 10 is still being written
if mode == 'sigterm':
  checkpoint.Checkpointer.wait = slow_wait
else:
  checkpoint.Checkpointer.save = save_then_die
print(json.dumps(loop.train_and_evaluate(config, {workdir!r}, datasets=datasets)))
'''


def run_child(workdir, mode, every):
  code = CHILD.format(root=ROOT, tests=os.path.join(ROOT, 'tests'), workdir=str(workdir),
                      mode=mode, every=every)
  return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                        timeout=300, env=dict(os.environ, JAX_PLATFORMS='cpu'))


def test_second_sigterm_during_the_final_save_is_ignored(tmp_path):
  child = run_child(tmp_path, 'sigterm', every=100)
  assert child.returncode == 0, child.stderr[-3000:]
  assert 'save in progress' in child.stderr
  announced = int(re.search(r'SIGTERM: saved step (\d+)', child.stderr).group(1))
  assert announced == json.loads(child.stdout.splitlines()[-1])['step']
  assert checkpoint.complete_steps(str(tmp_path)) == [announced]
  assert checkpoint.restore_params(str(tmp_path))[2] == announced   # complete and verified
  assert not os.path.exists(tmp_path / 'LOCK')


@pytest.mark.slow
def test_kill_9_during_a_save_then_restart_matches_an_uninterrupted_run(tmp_path):
  config = tiny_config('gpt', steps=40, checkpoint_every=5)
  config.model.num_layers = 1
  train(config, tmp_path / 'whole')
  child = run_child(tmp_path / 'killed', 'kill', every=5)
  assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
  assert json.loads((tmp_path / 'killed' / 'LOCK').read_text())['pid'] != os.getpid()
  result = train(config, tmp_path / 'killed')      # stale lock taken over, tmp folder removed
  assert result['start_step'] in (5, 10) and result['step'] == 40
  a = checkpoint.restore_params(str(tmp_path / 'whole'))[1]
  b = checkpoint.restore_params(str(tmp_path / 'killed'))[1]
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_a_data_position_that_cannot_restore_leaves_the_workdir_unchanged(tmp_path):
  """An allowed change passes the config check; the data position then refuses (as a changed
  batch layout does): config.json, its history and the logs stay as they were, so the original
  command still resumes."""
  config = gpt(steps=2, checkpoint_every=1)
  train(config, tmp_path)
  before = snapshot(tmp_path)

  def refusing(**kw):
    it = synthetic.synthetic_datasets(config)(**kw)
    def set_state(state):
      raise ValueError('data iterator state has stream_rows=2 but this iterator has 1')
    it.set_state = set_state
    return it
  changed = gpt(steps=3, checkpoint_every=1, learning_rate=0.02,
                allow_config_change='train.learning_rate')
  with pytest.raises(ValueError, match='stream_rows'):
    train(changed, tmp_path, datasets=refusing)
  assert snapshot(tmp_path) == before
  assert train(gpt(steps=3, checkpoint_every=1), tmp_path)['step'] == 3


def test_batch_size_is_not_a_key_a_resume_may_change():
  # each data stream fills a fixed number of rows of every batch: its position cannot continue
  with pytest.raises(ValueError, match='allow_config_change names train.batch_size'):
    workdir_lib.config_differences(gpt().to_dict(), gpt().to_dict(), 'train.batch_size')


def test_a_resumed_run_logs_each_step_once(tmp_path):
  writer = metrics_lib.MetricWriter(str(tmp_path))
  for step in range(1, 6):
    writer.write(step, {'loss': float(step)})
  writer.close()
  with open(tmp_path / 'metrics.jsonl', 'a') as f:
    f.write('{"step": 6, "spl')                    # a crash mid-line
  writer = metrics_lib.MetricWriter(str(tmp_path), resume_step=3)   # restored checkpoint 3
  writer.write(4, {'loss': 40.0})
  writer.close()
  assert train_steps(tmp_path) == [1, 2, 3, 4]
  with open(tmp_path / 'metrics.jsonl') as f:
    assert json.loads(f.read().splitlines()[-1])['loss'] == 40.0


def test_a_trainer_whose_lock_was_taken_over_stops_before_its_next_save(tmp_path):
  """A newer trainer took the workdir over (it judged this one's heartbeat stale: a stalled
  host): this one must not go on saving checkpoints into the run the other now owns."""
  config = gpt(steps=6, checkpoint_every=2, log_every=1, eval_every=0, async_checkpoints=False)
  lock_path = tmp_path / lock_lib.LOCK_FILE
  other = {'host': 'elsewhere', 'pid': 1, 'start': 1.0, 'heartbeat': time.time()}

  def taken_over_at_batch_3(**kw):
    it = synthetic.synthetic_datasets(config)(**kw)
    if not kw.get('repeat'):
      return it
    class Watched:
      n = 0
      def __iter__(self):
        return self
      def __next__(self):
        self.n += 1
        if self.n == 3:
          lock_path.write_text(json.dumps(other))
        return next(it)
      def __getattr__(self, name):
        return getattr(it, name)
    return Watched()
  with pytest.raises(lock_lib.LockHeld, match='another trainer took over .* stops without '
                                                 'saving step 4'):
    train(config, tmp_path, datasets=taken_over_at_batch_3)
  assert checkpoint.complete_steps(str(tmp_path)) == [2]
  assert json.loads(lock_path.read_text()) == other     # its lock is left alone


def test_a_lock_that_cannot_be_checked_before_a_save_does_not_stop_training(tmp_path,
                                                                           monkeypatch, capsys):
  def unreachable(self):
    raise OSError('storage timed out')
  monkeypatch.setattr(lock_lib.LocalLock, 'refresh', unreachable)
  assert train(gpt(steps=4, checkpoint_every=2, eval_every=0), tmp_path)['step'] == 4
  assert checkpoint.complete_steps(str(tmp_path))[-1] == 4
  assert 'before saving step 2 (OSError: storage timed out)' in capsys.readouterr().err


def test_a_rerun_after_a_crash_before_the_first_checkpoint_logs_each_step_once(tmp_path):
  config = gpt(steps=4, checkpoint_every=1000, log_every=1, eval_every=0)

  def crashing(**kw):   # the train stream dies at its third batch: no checkpoint was saved
    it = synthetic.synthetic_datasets(config)(**kw)
    if not kw.get('repeat'):
      return it
    class Dying:
      def __init__(self):
        self.n = 0
      def __iter__(self):
        return self
      def __next__(self):
        self.n += 1
        if self.n == 3:
          raise RuntimeError('the data source went away')
        return next(it)
      def __getattr__(self, name):
        return getattr(it, name)
    return Dying()
  with pytest.raises(RuntimeError, match='went away'):
    train(config, tmp_path, datasets=crashing)
  assert checkpoint.complete_steps(str(tmp_path)) == []
  assert train_steps(tmp_path) == [1, 2]
  assert train(config, tmp_path)['step'] == 4
  assert train_steps(tmp_path) == [1, 2, 3, 4]


def test_a_refused_first_run_does_not_pin_its_tokenizer(tmp_path, monkeypatch):
  """The first run trains the workdir's tokenizer, then is refused (the model's vocabulary is
  not the tokenizer's); the corrected command asks for another vocabulary and gets it, not the
  leftover copy."""
  monkeypatch.setenv('PRETRAIN_JAX_CACHE', str(tmp_path / 'cache'))
  config = small(tiny_gpt.get_config(), steps=2)
  config.data.update(tokenizer_vocab_size=256, tokenizer_train_chars=200_000, seq_len=64)
  config.model.vocab_size = 384
  workdir = str(tmp_path / 'run')
  with pytest.raises(ValueError, match='vocab_size=384 but the tokenizer has 256'):
    loop.train_and_evaluate(config, workdir)
  assert os.listdir(workdir) == [workdir_lib.TOKENIZER_FILE]
  config.data.update(tokenizer_vocab_size=384)
  config.model.vocab_size = 384
  before = set(threading.enumerate())
  assert loop.train_and_evaluate(config, workdir)['step'] == 2
  # The run closed its data iterators (loop.close_at_end): no prefetch thread of its outlives it.
  assert not [t for t in set(threading.enumerate()) - before if t.name.endswith('(_work)')]
  assert data.Tokenizer(os.path.join(workdir, workdir_lib.TOKENIZER_FILE)).vocab_size == 384


def test_ctrl_c_saves_the_step_and_stops_and_a_second_one_aborts(tmp_path, capsys):
  """Ctrl-C used to be a KeyboardInterrupt traceback with no checkpoint (up to checkpoint_every
  steps lost); now it is handled as SIGTERM is."""
  config = tiny_config('gpt', steps=40, checkpoint_every=100)
  config.model.num_layers = 1
  base = synthetic.synthetic_datasets(config)

  def datasets(*, split, **kw):
    data = base(split=split, **kw)
    if split == config.data.train_split:
      inner_next = type(data).__next__

      class Hooked(type(data)):
        def __next__(self):
          if self.index == 13:
            os.kill(os.getpid(), signal.SIGINT)
          return inner_next(self)
      data.__class__ = Hooked
    return data
  before = signal.signal(signal.SIGINT, signal.default_int_handler)   # as in a terminal
  try:
    result = loop.train_and_evaluate(config, str(tmp_path), datasets=datasets)
    handed_back = signal.getsignal(signal.SIGINT)
  finally:
    signal.signal(signal.SIGINT, before)
  assert result['preempted'] and 0 < result['step'] < 40
  assert f'SIGINT: saved step {result["step"]}; exiting' in capsys.readouterr().err
  assert checkpoint.complete_steps(str(tmp_path)) == [result['step']]
  assert handed_back is signal.default_int_handler                 # handed back
  signal.signal(signal.SIGINT, signal.SIG_IGN)   # started with `nohup ... &`: stays ignored
  try:
    ignoring = loop.StopRequest()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN    # not taken over while it runs
    ignoring.close()
  finally:
    signal.signal(signal.SIGINT, before)
  before = signal.signal(signal.SIGINT, signal.default_int_handler)
  stop = loop.StopRequest()
  try:
    os.kill(os.getpid(), signal.SIGINT)
    assert stop.requested and stop.name == 'SIGINT'
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(1)
  finally:
    stop.close()
    signal.signal(signal.SIGINT, before)


def test_sigterm_during_startup_releases_the_lock(tmp_path):
  """Before the loop's handler (save, stop) is installed, SIGTERM killed the process and left
  the LOCK: a run from another host waited 10 minutes for it to go stale."""
  proc = subprocess.Popen(
      [sys.executable, '-m', 'pretrain_jax.commands.train', '--config',
       os.path.join(ROOT, 'configs', 'tiny_gpt.py'), '--workdir', str(tmp_path),
       '--config.train.steps=50'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  lock = tmp_path / lock_lib.LOCK_FILE
  try:
    while not lock.exists() and proc.poll() is None:
      time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)          # the lock is held: the run is starting
    _, err = proc.communicate(timeout=300)
  finally:
    proc.kill()
  assert proc.returncode in (143, 0), err[-3000:]   # 0: the loop had started and saved
  assert not lock.exists()
  if proc.returncode == 143:
    assert err.strip().splitlines()[-1].startswith('SIGTERM before training started'), (
        err[-3000:])


def test_train_rows_average_the_steps_since_the_previous_row(tmp_path):
  """log_every=4 (a save at 3 and 6 in between, and the end at 10): each train row's loss,
  grad norm and accuracy are the means of the per-step values of the steps it covers (the
  same run logged every step), its learning rate the logged step's, its perplexity exp of the
  mean loss. It was the logged step's batch alone."""
  per_step = _train_rows(tmp_path / 'every', log_every=1)
  rows = _train_rows(tmp_path / 'four', log_every=4)
  assert sorted(per_step) == list(range(1, 11)) and sorted(rows) == [4, 8, 10]
  for step, first in [(4, 1), (8, 5), (10, 9)]:
    covered = [per_step[s] for s in range(first, step + 1)]
    for key in ('loss', 'lm_loss', 'lm_accuracy', 'grad_norm'):
      np.testing.assert_allclose(rows[step][key], np.mean([r[key] for r in covered]),
                                 rtol=1e-6, err_msg=f'{key} at step {step}')
    assert rows[step]['learning_rate'] == per_step[step]['learning_rate']
    np.testing.assert_allclose(rows[step]['lm_perplexity'], np.exp(rows[step]['lm_loss']),
                               rtol=1e-6)
  assert rows[8]['loss'] != per_step[8]['loss']


def _train_rows(workdir, log_every) -> dict:
  train(gpt(steps=10, checkpoint_every=3, log_every=log_every), workdir)
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return {r['step']: r for r in map(json.loads, f) if r['split'] == 'train'}


def test_a_metrics_write_that_fails_before_a_save_does_not_stop_the_save(tmp_path, capsys,
                                                                        monkeypatch):
  """Rows are written before each checkpoint (gs:// buffers them); a failed write (a GCS
  blip) must not cost the checkpoint, least of all a preemption's."""
  flush, calls = metrics_lib.MetricWriter.flush, []

  def blip(self):                                  # the first write fails, later ones work
    calls.append(1)
    if len(calls) == 1:
      raise OSError('503 Service Unavailable')
    flush(self)
  monkeypatch.setattr(metrics_lib.MetricWriter, 'flush', blip)
  result = train(gpt(steps=2, checkpoint_every=1), tmp_path)
  assert result['checkpoint_steps'] == [1, 2]
  assert ('warning: metrics not written before saving step 1 (503 Service Unavailable); '
          'saving') in capsys.readouterr().err


@pytest.mark.parametrize('processes, raised, closed', [
    (1, None, True), (1, ValueError, True), (2, None, True), (2, ValueError, False)])
def test_a_run_closes_its_data_iterators_unless_a_multi_process_run_raised(
    monkeypatch, processes, raised, closed):
  """A multi-process run that raised leaves at once: waiting for a prefetch thread's read let
  the peer's exit take the coordination service down, and this process aborted (SIGABRT)."""
  calls = []

  class Iterator:
    def close(self):
      calls.append('closed')

  monkeypatch.setattr(jax, 'process_count', lambda: processes)
  loop.close_at_end(Iterator())(raised, None, None)
  assert calls == (['closed'] if closed else [])
