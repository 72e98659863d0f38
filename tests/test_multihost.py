"""Two local processes on JAX's multi-controller runtime (gloo collectives) simulate a 2-host
slice: scripts/train.py trains with each host reading its own share, process 0 alone writes
logs, the checkpoint is one global checkpoint, and a single process resumes from it."""
import json
import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, 'scripts', 'train.py')
SMALL = ['--config', os.path.join(ROOT, 'configs', 'tiny_gpt.py'), '--config.train.batch_size=4',
         '--config.data.seq_len=32', '--config.model.num_layers=1', '--config.train.log_every=1',
         '--config.train.eval_every=0', '--config.train.checkpoint_every=100']


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _env():
  env = dict(os.environ)
  env.pop('XLA_FLAGS', None)        # one CPU device per process
  return env


def _two_processes(workdir: str, steps: int):
  port = _free_port()
  procs = [subprocess.Popen(
      [sys.executable, TRAIN, *SMALL, '--workdir', workdir, f'--config.train.steps={steps}',
       '--multihost', f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2',
       f'--process_id={i}'], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True) for i in range(2)]
  outs = [p.communicate(timeout=600) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  assert not [l for l in outs[1][0].splitlines() if l.startswith('{')]  # process 0 alone
  assert "'data': 2" in outs[0][1]                    # one mesh over both processes
  return json.loads(outs[0][0].strip().splitlines()[-1])


@pytest.mark.slow
def test_two_processes_train_resume_and_a_single_process_evaluates(tmp_path):
  workdir = str(tmp_path / 'run')
  result = _two_processes(workdir, steps=3)
  assert result['step'] == 3 and result['checkpoint_steps'] == [3]
  lines = [json.loads(l) for l in open(os.path.join(workdir, 'metrics.jsonl'))]
  assert [l['step'] for l in lines if l['split'] == 'train'] == [1, 2, 3]  # written once

  resumed = _two_processes(workdir, steps=5)
  assert resumed['start_step'] == 3 and resumed['step'] == 5

  # One process cannot take over two hosts' data positions: a clear error, nothing written.
  single = subprocess.run(
      [sys.executable, TRAIN, *SMALL, '--workdir', workdir, '--config.train.steps=7'],
      cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
  assert single.returncode != 0 and 'saved by 2 processes' in single.stderr
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['3', '5']

  # ... but any single process loads the global checkpoint for evaluation.
  evaluated = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'scripts', 'evaluate.py'), '--workdir', workdir],
      cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  record = json.loads(evaluated.stdout.strip().splitlines()[-1])
  assert record['step'] == 5 and 0 < record['loss'] < 20
