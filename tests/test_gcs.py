"""gs:// everywhere, against a GCS emulator on 127.0.0.1 (tests/gcs_emulator.py).

What the emulator cannot show: real GCS latency, IAM, and tf.io.gfile (it ignores emulators;
the library never uses it for gs://: epath runs on gcsfs with EPATH_USE_TF=false).
"""
import json
import os
import signal
import tempfile
import time

import gcs_emulator
import jax
import numpy as np
import pytest
from modeling import datasets_with_hook, small, upload_corpus

import pretrain_jax
from configs import tiny_gpt
from pretrain_jax import data, paths
from pretrain_jax.cli import terminal
from pretrain_jax.hf import convert as hf_workdir
from pretrain_jax.run import checkpoint, loop, metrics, profiler
from pretrain_jax.run import lock as lock_lib
from pretrain_jax.training.config import TrainConfig


@pytest.fixture(scope='module')
def gcs(tmp_path_factory):
  """The emulator with bucket 'bucket', its variables in os.environ, and a fresh data cache."""
  saved = dict(os.environ)
  with gcs_emulator.serve() as env:
    os.environ.update(env)
    os.environ['PRETRAIN_JAX_CACHE'] = str(tmp_path_factory.mktemp('cache'))
    try:
      yield 'gs://bucket'
    finally:
      os.environ.clear()
      os.environ.update(saved)


def names(folder: str) -> list:
  """The sorted names in `folder` ([] where nothing is under it)."""
  folder = paths.resolve(folder)
  return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_a_refused_start_removes_its_new_gcs_workdir(gcs):
  for written, kept in (('tokenizer.model', []), ('LOCK', ['LOCK'])):
    workdir = f'{gcs}/refused/{written}'
    with pytest.raises(ValueError, match='no file'):
      with terminal.removed_if_refused(workdir):
        paths.write_atomic(f'{workdir}/{written}', 'x')
        raise ValueError('matches no file')
    assert names(workdir) == kept, written   # another's lock keeps the workdir


def test_paths_round_trip(gcs):
  target = f'{gcs}/t/a/b.txt'
  paths.write_atomic(target, 'hello')
  t = paths.resolve(f'{gcs}/t')
  assert (t / 'a' / 'b.txt').read_text() == 'hello' and (t / 'a' / 'b.txt').is_file()
  assert (t / 'a').is_dir() and not (t / 'a').is_file()
  assert names(f'{gcs}/t') == ['a'] and names(f'{gcs}/t/none') == []
  paths.write_atomic(t / 'a' / 'c.jsonl', '{}')
  paths.write_atomic(t / 'a' / 'x' / 'e.txt', 'x')   # '*' stops at a '/', as glob.glob's does
  assert paths.glob(f'{gcs}/t/*/*.txt') == [target]
  assert paths.glob(f'{gcs}/t/**/*.txt') == [target, f'{gcs}/t/a/x/e.txt']
  assert paths.glob(f'{gcs}/t/**/*.jsonl') == [f'{gcs}/t/a/c.jsonl']
  paths.copy(target, t / 'd.txt')
  assert (t / 'd.txt').read_bytes() == b'hello'
  t.rmtree()
  assert not (t / 'a' / 'b.txt').exists()


def test_metrics_log_is_rewritten_whole_never_appended(gcs):
  workdir = f'{gcs}/metrics'
  for run in range(2):   # a resumed run keeps the lines already there
    writer = metrics.MetricWriter(workdir, flush_sec=0.0, resume_step=run)
    writer.write(run + 1, {'loss': 1.0 / (run + 1)})
    writer.close()
  rows = [json.loads(line) for line in
          paths.resolve(f'{workdir}/metrics.jsonl').read_text().splitlines()]
  assert [r['step'] for r in rows] == [1, 2]
  events = names(f'{workdir}/tensorboard')
  # One event file per run (named by start second and host: the two runs here may share one).
  assert events and all(e.startswith('events.out.tfevents') for e in events)
  assert paths.resolve(f'{workdir}/tensorboard/{events[-1]}').read_bytes()  # uploaded, not empty


def test_a_profile_is_traced_locally_and_copied_to_the_gs_workdir(gcs, capsys):
  """jax.profiler writes local files; on a gs:// workdir the trace lands under its
  tensorboard/plugins/profile when it stops, and the local copy is removed."""
  t = TrainConfig(batch_size=1, steps=5, learning_rate=1.0, warmup_steps=0, profile_steps=2,
                  profile_start_step=0)
  tracer = profiler.StepProfiler(t, f'{gcs}/profiled', start=0, line=print)
  step, x, local, stopped = 0, jax.numpy.ones((64, 64)), set(), []
  while step < t.steps:
    tracer.before(step)
    local.add(tracer.local)
    x = jax.jit(lambda a: a @ a / 64)(x)
    step += 1
    if tracer.after_step(step, x):
      stopped.append(step)
  assert stopped == [3] and not tracer.active
  [local] = local - {None}                      # one local folder, under the temp dir
  assert str(local).startswith(tempfile.gettempdir()) and not local.exists()
  assert 'profile of steps 2..3 written to gs://bucket/profiled/tensorboard/plugins/profile' in (
      capsys.readouterr().out)
  [run] = names(f'{gcs}/profiled/tensorboard/plugins/profile')
  traced = names(f'{gcs}/profiled/tensorboard/plugins/profile/{run}')
  assert 'perfetto_trace.json.gz' in traced and any(n.endswith('.xplane.pb') for n in traced)


def test_lock_create_refuse_heartbeat_takeover_release(gcs):
  workdir = f'{gcs}/locked'
  first = lock_lib.GcsLock(workdir, heartbeat_sec=3600)
  assert first.acquire() == ''
  with pytest.raises(lock_lib.LockHeld, match=r'gs://bucket/locked is in use by pid'):
    lock_lib.GcsLock(workdir).acquire()
  generation = first.version
  first.refresh()                                   # heartbeat: a new generation, still ours
  assert first.version != generation and first.record is not None
  # An upload that landed but whose answer was lost (the client retries and gets a 412 on our
  # own new generation) is still ours, not a takeover
  assert first._write(dict(first.record), first.version)   # first.version is now behind
  first.refresh()
  assert not first.lost and first.record is not None and first.version == first._read()[2]
  # A stale holder (heartbeat 20 min old) is taken over; the old one then stops claiming it.
  stale = dict(first.record, heartbeat=time.time() - 1200, host='elsewhere')
  first.version = first._write(stale, first.version)
  assert first.version is not None
  racer = lock_lib.GcsLock(workdir, heartbeat_sec=3600)
  racing = racer._read()[2]                         # reads the stale lock too
  second = lock_lib.GcsLock(workdir, heartbeat_sec=3600)
  assert 'gs://bucket/locked/LOCK' in second.acquire()
  assert not racer._claim(racing)                   # of two takeovers, one wins
  first.refresh()
  assert first.record is None and first.lost        # 412: it knows it lost the lock
  first.release()                                   # and deletes nothing
  racer.release()
  lock_file = paths.resolve(f'{workdir}/LOCK')
  assert json.loads(lock_file.read_text())['start'] == second.record['start']
  second.release()
  assert not lock_file.exists()
  # A SIGTERM between the upload and noting it (the start-up handler calls release()): the
  # lock it wrote is still removed, and another trainer's is not.
  third = lock_lib.GcsLock(workdir, heartbeat_sec=3600)
  assert third._claim(None)                         # written; acquire() has not returned
  third.release()
  assert not lock_file.exists()
  assert second._claim(None)
  third.release()
  assert lock_file.exists()
  second.release()
  assert isinstance(lock_lib.open_lock(workdir), lock_lib.GcsLock)


def test_rows_up_to_each_checkpoint_outlive_a_killed_trainer(gcs, monkeypatch):
  """GCS cannot append, so rows are buffered and rewritten every 30 s: a trainer killed
  within 30 s of a checkpoint lost the rows before it, which its resume never logs again.
  Every save now writes them first. (Killed: the writer's exit flush never runs.)"""
  config = small(tiny_gpt.get_config(), steps=5)
  config.train.update(log_every=1, checkpoint_every=2, eval_every=0)
  workdir = f'{gcs}/killed'

  def killed_at_the_fourth_batch(drawn, batch):
    if drawn == 4:
      raise SystemExit('killed')
    return batch

  datasets = datasets_with_hook(config, killed_at_the_fourth_batch)
  monkeypatch.setattr(metrics.MetricWriter, 'close', lambda self: None)
  with pytest.raises(SystemExit, match='killed'):
    loop.train_and_evaluate(config, workdir, datasets=datasets)
  assert checkpoint.complete_steps(workdir) == [2]
  rows = [json.loads(line) for line in
          paths.resolve(f'{workdir}/metrics.jsonl').read_text().splitlines()]
  assert [r['step'] for r in rows if r['split'] == 'train'] == [1, 2]


def sigterm_at_batch(monkeypatch, n):
  """data.make_dataset's train split sends SIGTERM when its n-th batch is drawn."""
  real = data.make_dataset

  def make(data_config, tokenizer, *, split, **kw):
    it = real(data_config, tokenizer, split=split, **kw)
    if split != data_config.train_split:
      return it
    nxt, drawn = it.__next__, [0]

    class Hooked(type(it)):
      def __next__(self):
        drawn[0] += 1
        if drawn[0] == n:
          os.kill(os.getpid(), signal.SIGTERM)
        return nxt()
    it.__class__ = Hooked
    return it
  monkeypatch.setattr(data, 'make_dataset', make)


@pytest.mark.slow
def test_train_stop_resume_evaluate_export_all_on_gs(gcs, monkeypatch, tmp_path):
  start = time.time()
  files = upload_corpus(f'{gcs}/corpus')
  config = small(tiny_gpt.get_config(), steps=6)
  config.train.update(log_every=1, checkpoint_every=100)
  config.data.files = files
  whole = loop.train_and_evaluate(config, f'{gcs}/whole')
  assert whole['step'] == 6
  with monkeypatch.context() as m:
    sigterm_at_batch(m, 3)
    first = loop.train_and_evaluate(config, f'{gcs}/parts')
  assert first['preempted'] and first['checkpoint_steps'] == [3]
  second = loop.train_and_evaluate(config, f'{gcs}/parts')
  assert second['start_step'] == 3 and second['step'] == 6
  # Bit-exact resume: the same losses at every step, the same parameters.
  def losses(w):
    return {r['step']: r['loss'] for r in map(json.loads, paths.resolve(
        f'{w}/metrics.jsonl').read_text().splitlines()) if r['split'] == 'train'}
  assert losses(f'{gcs}/parts') == losses(f'{gcs}/whole') and len(losses(f'{gcs}/whole')) == 6
  _, whole_params, _ = checkpoint.restore_params(f'{gcs}/whole')
  _, part_params, step = checkpoint.restore_params(f'{gcs}/parts')
  assert step == 6
  jax.tree.map(np.testing.assert_array_equal, whole_params, part_params)
  # The workdir holds everything; nothing was written to a local 'gs:' folder.
  written = set(names(f'{gcs}/parts'))
  assert {'config.json', 'tokenizer.model', 'checkpoints', 'metrics.jsonl', 'tensorboard',
          'config_history'} <= written and 'LOCK' not in written
  assert paths.read_json(f'{gcs}/parts/config.json')['data']['tokenizer'] == \
      f'{gcs}/parts/tokenizer.model'
  assert not os.path.exists('gs:') and not os.path.exists(os.path.join(str(tmp_path), 'gs:'))
  # load_pretrained('gs://...') + evaluate reproduces the logged eval loss.
  model = pretrain_jax.load_pretrained(f'{gcs}/parts')
  assert model.step == 6 and model.tokenizer.path == f'{gcs}/parts/tokenizer.model'
  batches = data.make_dataset(model.data_config, model.tokenizer,
                              split=model.data_config.eval_split, batch_size=4, repeat=False)
  logged = [r for r in map(json.loads, paths.resolve(f'{gcs}/parts/metrics.jsonl').read_text()
                           .splitlines()) if r['split'] == 'eval'][-1]['loss']
  assert model.evaluate(batches, max_batches=1)['loss'] == pytest.approx(logged, abs=1e-5)
  # Export to a Hugging Face directory in the bucket, and load it back from there.
  out = hf_workdir.export_hf(f'{gcs}/parts', f'{gcs}/hf/gpt')
  assert out['hf_dir'] == f'{gcs}/hf/gpt' and out['step'] == 6
  assert {'config.json', 'model.safetensors'} <= set(names(f'{gcs}/hf/gpt'))
  again = pretrain_jax.load_pretrained(f'{gcs}/hf/gpt')
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b)),
               again.params, jax.tree.map(np.asarray, model.params))
  print(f'end to end on the emulator: {time.time() - start:.1f} s')
