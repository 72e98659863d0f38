"""Two local processes on JAX's multi-controller runtime (gloo collectives) simulate a 2-host
slice: pretrain-jax train trains with each host producing its data streams' rows from the one
copy of the data process 0 prepared in the workdir, process 0 alone writes logs, the checkpoint
is one global checkpoint, and a single process resumes from it with the losses and batches of
an uninterrupted run."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from helpers import ROOT, SMALL, TRAIN, free_port, one_device_env

from pretrain_jax import data
from pretrain_jax.run import workdir as workdir_lib


def _two_processes(workdir: str, steps: int, extra=()):
  port = free_port()
  procs = [subprocess.Popen(
      [sys.executable, *TRAIN, *SMALL, *extra, '--workdir', workdir,
       f'--config.train.steps={steps}', '--multihost',
       f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2', f'--process_id={i}'],
      cwd=ROOT, env=one_device_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for i in range(2)]
  outs = [p.communicate(timeout=600) for p in procs]
  for p, (_, err) in zip(procs, outs, strict=True):
    assert p.returncode == 0, err[-3000:]
  assert not [line for line in outs[1][0].splitlines() if line.startswith('{')]  # process 0 alone
  assert "'data': 2" in outs[0][1]                    # one mesh over both processes
  return json.loads(outs[0][0].strip().splitlines()[-1])


def _one_process(workdir: str, steps: int, extra=()):
  run = subprocess.run(
      [sys.executable, *TRAIN, *SMALL, *extra, '--workdir', workdir,
       f'--config.train.steps={steps}'], cwd=ROOT, env=one_device_env(), capture_output=True,
      text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  return json.loads(run.stdout.strip().splitlines()[-1])


def _train_steps(workdir: str) -> list:
  """The steps of metrics.jsonl's train rows, in order (a row written twice shows twice)."""
  lines = [json.loads(line) for line in open(os.path.join(workdir, 'metrics.jsonl'))]
  return [r['step'] for r in lines if r['split'] == 'train']


def _train_losses(workdir: str) -> dict:
  lines = [json.loads(line) for line in open(os.path.join(workdir, 'metrics.jsonl'))]
  return {r['step']: r['loss'] for r in lines if r['split'] == 'train'}


def _data_state(workdir: str, step: int) -> dict:
  """The `data` item of checkpoint `step` (orbax JsonSave writes it as data/metadata)."""
  return json.load(open(os.path.join(workdir, 'checkpoints', str(step), 'data', 'metadata')))


@pytest.mark.slow
def test_two_processes_train_and_resume_on_one_or_two_and_any_process_evaluates(tmp_path):
  """2 processes x 6 steps, then 2 more or 1 process x 6 more; and 1 then 2: the losses of steps
  7..12 and the data position at 12 are those of the uninterrupted 2-process run (bitwise on 2
  processes); the batches of steps 7..12, rebuilt in-process from the step-6 data state on 1
  and on 2 hosts, are bitwise equal. Process 0 alone writes the logs, the data are prepared
  once for the run, and a single process evaluates the global checkpoint."""
  extra = ['--config.train.checkpoint_every=6']
  whole = str(tmp_path / 'whole')
  result = _two_processes(whole, steps=12, extra=extra)
  assert result['step'] == 12 and result['checkpoint_steps'] == [6, 12]
  assert _train_steps(whole) == list(range(1, 13))        # each step written once
  expected = _train_losses(whole)
  two = str(tmp_path / 'two')
  cut = _two_processes(two, steps=6, extra=extra)
  assert cut['step'] == 6 and cut['checkpoint_steps'] == [6]
  prepared = os.path.join(two, 'prepared_data', 'local_text_files')
  assert len(os.listdir(prepared)) == 1          # the embedded corpus, prepared once for both
  shutil.copytree(two, str(tmp_path / '2to1'))
  diffs = {}
  for name, first, second in [('2to2', None, _two_processes), ('2to1', None, _one_process),
                              ('1to2', _one_process, _two_processes)]:
    workdir = str(tmp_path / {'2to2': 'two'}.get(name, name))
    if first:
      first(workdir, steps=6, extra=extra)
    resumed = second(workdir, steps=12, extra=extra)
    assert resumed['start_step'] == 6 and resumed['step'] == 12, resumed
    losses = _train_losses(workdir)
    assert _train_steps(workdir) == list(range(1, 13))
    diffs[name] = max(abs(losses[s] - expected[s]) for s in range(7, 13))
    assert _data_state(workdir, 12) == _data_state(whole, 12)
  assert len(os.listdir(prepared)) == 1          # reused by the 2-process resume
  assert sorted(os.listdir(os.path.join(tmp_path, '2to1', 'checkpoints'))) == ['12', '6']
  assert diffs['2to2'] == 0, diffs               # the same host count: the same sums
  print('largest loss difference, steps 7..12:', diffs)
  # Another host count changes only the order of every reduction (loss and gradient sums over
  # devices), so the losses (~7 here) differ by a few float32 ulps (4.8e-7 in [4, 8)): measured
  # 1.4e-6 / 4.8e-7. 20 ulps bounds that; a wrong batch or a skipped step moves the loss by
  # orders of magnitude more (the batches themselves are checked bitwise below).
  assert max(diffs.values()) <= 20 * np.spacing(np.float32(max(expected.values()))), diffs

  # Any single process loads the global checkpoint for evaluation.
  evaluated = subprocess.run(
      [sys.executable, '-m', 'pretrain_jax.commands.evaluate', '--workdir', two],
      cwd=ROOT, env=one_device_env(), capture_output=True, text=True, timeout=600)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  record = json.loads(evaluated.stdout.strip().splitlines()[-1])
  assert record['step'] == 12 and 0 < record['loss'] < 20

  config = workdir_lib.load_config(whole)
  tokenizer = data.load_tokenizer(config.data)
  state = _data_state(whole, 6)
  batches = {}
  for count in (1, 2):
    its = [data.make_dataset(config.data, tokenizer, split=config.data.train_split,
                             batch_size=config.train.batch_size // count, process_index=p,
                             process_count=count) for p in range(count)]
    for it in its:
      it.set_state(state)
    batches[count] = [data.assemble_global_batch([next(it) for it in its]) for _ in range(6)]
  for a, b in zip(batches[1], batches[2], strict=True):
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


FAILING_SAVE = """
import re, runpy, sys
from orbax.checkpoint._src.handlers import json_checkpoint_handler
process_id = int([a for a in sys.argv if a.startswith('--process_id=')][0].split('=')[1])
original = json_checkpoint_handler.JsonCheckpointHandler._save_fn
async def disk_full(self, x, directory):
  if re.search(r'/2\\.orbax-checkpoint-tmp', str(directory)):
    raise OSError(28, 'No space left on device', str(directory))
  return await original(self, x, directory)
if process_id == 0:       # process 0 writes the JSON items: only its save fails
  json_checkpoint_handler.JsonCheckpointHandler._save_fn = disk_full
sys.argv = sys.argv[1:]
runpy.run_module('pretrain_jax.commands.train', run_name='__main__')
"""


def _two_scripted(script: str, workdir: str, *flags, timeout: int = 300) -> list:
  """Both processes' (return code, stderr) of `pretrain-jax train` run through `script` (which
  patches the process it runs in, then runs the command) on a 40-step two-process run."""
  port = free_port()
  procs = [subprocess.Popen(
      [sys.executable, '-c', script, 'pretrain-jax train', *SMALL, '--workdir', workdir,
       '--config.train.steps=40', *flags, '--multihost', f'--coordinator_address=127.0.0.1:{port}',
       '--num_processes=2', f'--process_id={i}'],
      cwd=ROOT, env=one_device_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for i in range(2)]
  try:   # a hang fails here
    outs = [p.communicate(timeout=timeout) for p in procs]
  finally:
    for p in procs:
      p.kill()
  return [(p.returncode, err) for p, (_, err) in zip(procs, outs, strict=True)]


@pytest.mark.slow
def test_a_save_failing_on_one_process_stops_both_at_the_same_step(tmp_path):
  """Process 0's write of checkpoint 2 fails; process 1 waits in orbax's commit barrier for it
  until train.checkpoint_timeout_sec (20 s here), and then both stop at the same step with the
  one-line error (agreed checks), instead of one training on alone or both hanging."""
  workdir = str(tmp_path / 'run')
  stopped = []
  for code, err in _two_scripted(FAILING_SAVE, workdir, '--config.train.checkpoint_every=2',
                                 '--config.train.log_every=100',
                                 '--config.train.checkpoint_timeout_sec=20'):
    assert code == 2, err[-3000:]          # the one-line user error, not a hang
    # The one `error:` line; orbax's threads may log their own shutdown after it.
    last = [x for x in err.splitlines() if x.startswith('error: ')][-1:] or [err[-3000:]]
    last = last[0]
    assert re.match(r'error: saving checkpoint 2 .*stopped training at step \d+', last), last
    stopped.append(int(re.search(r'stopped training at step (\d+)', last).group(1)))
  assert stopped[0] == stopped[1] and stopped[0] <= 4, stopped   # at the latest the next save
  assert not os.path.exists(os.path.join(workdir, 'checkpoints', '2'))


FAILING_READ = """
import runpy, sys
from pretrain_jax.data import pipeline
process_id = int([a for a in sys.argv if a.startswith('--process_id=')][0].split('=')[1])
original, train_batches = pipeline.DataIterator.__next__, []
def failing(self):
  if process_id == 1 and self._identity['split'] == 'train':
    train_batches.append(1)
    if len(train_batches) == 6:
      raise OSError(5, 'Input/output error', 'gs://bucket/c4/train-00007.tfrecord')
  return original(self)
pipeline.DataIterator.__next__ = failing
sys.argv = sys.argv[1:]
runpy.run_module('pretrain_jax.commands.train', run_name='__main__')
"""


@pytest.mark.slow
def test_a_data_read_failing_on_one_process_stops_both_instead_of_hanging(tmp_path):
  """Process 1's sixth train batch fails to read. It ends with that error while process 0 waits
  inside a train step: its checkpointer's close must not enter an agreement (a collective the
  peer never joins, so both hung). Process 0 then stops, naming the other process."""
  workdir = str(tmp_path / 'run')
  (code0, err0), (code1, err1) = _two_scripted(FAILING_READ, workdir,
                                               '--config.train.checkpoint_every=3', timeout=150)
  assert code1 == 1 and 'train-00007.tfrecord' in err1, err1[-3000:]
  assert code0 == 2 and 'error: another process of this multi-process run stopped' in err0, \
      err0[-3000:]
  assert os.path.isdir(os.path.join(workdir, 'checkpoints', '3'))   # the save before it stands


def _two_processes_failing(workdir: str, extra1=()):
  """Both processes' (return code, stderr); process 1 gets `extra1` on top of the same flags."""
  port = free_port()
  procs = [subprocess.Popen(
      [sys.executable, *TRAIN, *SMALL, '--workdir', workdir, '--config.train.steps=4',
       '--multihost', f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2',
       f'--process_id={i}', *(extra1 if i else ())],
      cwd=ROOT, env=one_device_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for i in range(2)]
  try:   # before: JAX's exit barrier held every process 5 minutes, then aborted in C++
    outs = [p.communicate(timeout=150) for p in procs]
  finally:
    for p in procs:
      p.kill()
  return [(p.returncode, err) for p, (_, err) in zip(procs, outs, strict=True)]


def test_processes_given_different_configs_are_refused_on_a_fresh_workdir(tmp_path):
  """Process 1 with its own learning rate trained its replica with it, silently (only a resume
  compared configs, against config.json)."""
  refused = ('error: the processes of this run were given different configs (train.learning_rate'
             ': 0.003 on process 0, 0.01 on process 1); expected the same command, flags and '
             'config file on every host')
  ends = []
  for code, err in _two_processes_failing(str(tmp_path / 'run'),
                                          ['--config.train.learning_rate=0.01']):
    assert code == 2, err[-3000:]
    ends.append(err.strip().splitlines()[-1])
  # Both refuse; one may leave first and close the collective under the other, whose line then
  # says so instead (both are true and name what to do).
  assert refused in ends, ends
  assert all(e == refused or e.startswith('error: another process of this multi-process run')
             for e in ends), ends


def test_one_process_refusing_stops_the_other_at_once_with_one_line(tmp_path):
  """Process 1 refuses its flags and exits; process 0, in a collective with it, said nothing
  for 5 minutes, then aborted with a C++ stack (and process 1 hung in JAX's exit barrier);
  later it said so only after gloo's 30 s wait for the gone peer."""
  (code0, err0), (code1, err1) = _two_processes_failing(
      str(tmp_path / 'run'), ['--config.train.eval_batches=-1'])
  assert code1 == 2 and err1.strip().splitlines()[-1].startswith(
      'error: train.eval_batches=-1; expected >= 0'), err1[-3000:]
  assert code0 == 2 and err0.strip().splitlines()[-1].startswith(
      'error: another process of this multi-process run stopped or was killed ('), err0[-3000:]
  # Process 0 waits in its first agreement; it reads process 1's line from the coordinator
  # instead of waiting out gloo's key-value timeout for the missing peer.
  assert '(process 1: error: train.eval_batches=-1;' in err0, err0[-3000:]
  assert 'Check failure' not in err0 + err1


LAGGED = """
import json, sys
from pretrain_jax import cli
cli.join_processes(f'127.0.0.1:{sys.argv[1]}', 2, int(sys.argv[2]), 60)
from pretrain_jax.run import agreement
lagged, me, seen = agreement.Lagged(), int(sys.argv[2]), []
for step in range(7):
  if step == 4:
    lagged.reset()
  agreed = lagged.agree([step == 1 and me == 1, me == 0])
  seen.append(None if agreed is None else agreed.tolist())
print(json.dumps(seen))
"""


def test_lagged_agreement_answers_two_calls_late_with_every_process_flags(tmp_path):
  """The stop and save-poll agreement: call n answers with every process's flags of call n - 2
  (process 1's notice at call 1 reaches both at call 3), and a reset starts over."""
  port = free_port()
  procs = [subprocess.Popen([sys.executable, '-c', LAGGED, str(port), str(i)], cwd=ROOT,
                            env=one_device_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  outs = [p.communicate(timeout=300) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
  quiet, noticed = [[False, True], [False, False]], [[False, True], [True, False]]
  for out, _ in outs:   # a reset at call 4: calls 4 and 5 answer nothing yet
    assert json.loads(out.strip().splitlines()[-1]) == [None, None, quiet, noticed, None, None,
                                                        quiet]


@pytest.mark.slow
def test_sigterm_to_one_process_saves_one_step_on_both_and_the_resume_continues(tmp_path):
  """A preemption notice may reach one worker of a slice first: both processes stop after the
  same step with one global checkpoint of it, and a 2-process resume trains on with the losses
  of an uninterrupted run (within the ulps of another reduction order: none here, the same
  host count)."""
  workdir, port = str(tmp_path / 'cut'), free_port()
  procs = [subprocess.Popen(
      [sys.executable, *TRAIN, *SMALL, '--workdir', workdir, '--config.train.steps=100000',
       '--multihost', f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2',
       f'--process_id={i}'],
      cwd=ROOT, env=one_device_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for i in range(2)]
  err0, training = [], threading.Event()

  def read_process_0():
    for line in procs[0].stderr:
      err0.append(line)
      if line.startswith('step 5/'):
        training.set()
  reader = threading.Thread(target=read_process_0, daemon=True)
  reader.start()
  try:
    assert training.wait(timeout=300), ''.join(err0)[-3000:]
    procs[1].send_signal(signal.SIGTERM)              # process 1 only
    out1 = procs[1].communicate(timeout=300)
    out0 = procs[0].communicate(timeout=300)[0]
  finally:
    for p in procs:
      p.kill()
  reader.join(timeout=30)
  assert procs[0].returncode == 0 and procs[1].returncode == 0, (''.join(err0)[-3000:],
                                                                 out1[1][-3000:])
  result = json.loads(out0.strip().splitlines()[-1])
  stopped = result['step']
  assert result['preempted'] and result['checkpoint_steps'] == [stopped], result
  assert f'SIGTERM: saved step {stopped}; exiting' in ''.join(err0)
  second = _two_processes(workdir, steps=stopped + 3)
  assert second['start_step'] == stopped and second['step'] == stopped + 3
  whole = str(tmp_path / 'whole')
  _two_processes(whole, steps=stopped + 3)
  expected, got = _train_losses(whole), _train_losses(workdir)
  assert [got[s] for s in range(1, stopped + 4)] == [expected[s] for s in range(1, stopped + 4)]


@pytest.mark.slow
def test_sigterm_during_a_multi_process_start_up_stops_it(tmp_path):
  """JAX's preemption service installed a C-level SIGTERM handler at jax.distributed start-up
  that only records the notice (for reached_preemption_sync_point, which nothing here calls):
  a SIGTERM before the loop's handler was lost, and the run trained on to its end. It is off;
  process 0 stops as a single process does (exit 143, its LOCK released), process 1 with it."""
  workdir, port = tmp_path / 'run', free_port()
  procs = [subprocess.Popen(
      [sys.executable, *TRAIN, *SMALL, '--workdir', str(workdir), '--config.train.steps=300',
       '--multihost', f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2',
       f'--process_id={i}'],
      cwd=ROOT, env=one_device_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for i in range(2)]
  try:
    lock = workdir / 'LOCK'
    while not lock.exists() and procs[0].poll() is None:
      time.sleep(0.02)
    procs[0].send_signal(signal.SIGTERM)         # joined and holding the lock: starting
    outs = [p.communicate(timeout=300) for p in procs]
  finally:
    for p in procs:
      p.kill()
  err0 = outs[0][1]
  assert procs[0].returncode in (143, 0), err0[-3000:]   # 0: the loop had started and saved
  if procs[0].returncode == 0:
    assert 'SIGTERM: saved step' in err0, err0[-3000:]
  else:
    assert 'SIGTERM before training started' in err0, err0[-3000:]
    assert procs[1].returncode != 0                # its peer is gone
  assert 'step 300/300' not in err0, err0[-3000:]
  assert not lock.exists()
