"""pretrain-jax tpu and pretrain_jax/cloud: argv builders against literals, and a slice's whole life
(create, setup, run, preemption, re-creation, rerun) against a fake `gcloud` on PATH.

Nothing here reaches the network or the real gcloud: the fake is first on PATH, and the
subprocess tests give tpu.py a PATH that holds the fake or nothing.
"""
import ast
import json
import os
import re
import subprocess
import sys
import time

import commands
import pytest
from helpers import ROOT

from pretrain_jax.cloud import gcloud, launcher
from pretrain_jax.commands import tpu as tpu_command
from pretrain_jax.run import lock as lock_lib

ZONE = 'us-west4-a'
VM = gcloud.Slice('ptj', ZONE, 'v5litepod-16', '', 'spot')
QR = gcloud.Slice('ptj', ZONE, 'v5litepod-16', '', 'spot', queued=True)
TRAIN_ARGS = ['--config', 'configs/gpt2_small.py', '--workdir', 'gs://bkt/runs/gpt2']

# A scripted Cloud TPU. State: does the slice exist, how many describes until it is up, which
# life it is in (one per create), whether train.py was launched in this life. Lives up to
# `preempt_lives` are preempted as soon as train.py starts; later lives finish the run.
FAKE_GCLOUD = r'''#!/usr/bin/env -S python3 -S
import json, os, sys
argv = sys.argv[1:]
with open(os.environ['FAKE_GCLOUD_LOG'], 'a') as f:
  f.write(json.dumps(argv) + '\n')
path = os.environ['FAKE_GCLOUD_STATE']
with open(path) as f:
  st = json.load(f)
words = [a for a in argv if not a.startswith('--') and a != 'alpha']
if words[0] == 'storage':   # `storage rm gs://.../LOCK`: the lock object is never there here
  sys.stderr.write('ERROR: (gcloud.storage.rm) The following URLs matched no objects or files\n')
  sys.exit(1)
kind, verb = words[2], words[3]
command = next((a.split('=', 1)[1] for a in argv if a.startswith('--command=')), '')
queued = st['queued']

def fail(message):
  sys.stderr.write(f'ERROR: (gcloud.compute.tpus.{kind}.{verb}) {message}\n')
  sys.exit(1)

if verb == st.get('fail_verb'):
  fail('PERMISSION_DENIED: scripted failure\nsecond line of the tail')
if verb == 'create':
  st.update(exists=True, creating=st['creating_polls'], life=st['life'] + 1, launched=False)
elif verb == 'delete':
  if not st['exists']:
    fail('NOT_FOUND: Resource ptj was not found')
  st['exists'] = False
elif verb == 'describe':
  if not st['exists']:
    fail('NOT_FOUND: Resource ptj was not found')
  primary = kind == ('queued-resources' if queued else 'tpu-vm')
  if primary and st['creating'] > 0:
    st['creating'] -= 1
    state = 'WAITING_FOR_RESOURCES' if queued else 'CREATING'
  elif primary and st['launched'] and st['life'] <= st['preempt_lives']:
    state = 'SUSPENDED' if queued else 'PREEMPTED'
  else:
    state = 'ACTIVE' if queued and primary else 'READY'
  record = {'name': 'ptj', 'state': {'state': state} if kind == 'queued-resources' else state}
  if kind == 'tpu-vm':
    record['networkEndpoints'] = [{'ipAddress': f'10.0.0.{i}'} for i in range(st['workers'])]
  print(json.dumps(record))
elif verb == 'ssh':
  if 'nohup' in command:
    st['launched'] = True
  elif command.startswith('if pgrep'):
    print(('TRAIN=EXIT:0\n' if st['launched'] else 'TRAIN=IDLE\n') * st['workers'], end='')
with open(path, 'w') as f:
  json.dump(st, f)
'''


class Fake:
  """The fake gcloud at `path`: `play(**state)` scripts its life, `calls()` reads its log."""

  def __init__(self, tmp_path):
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    self.path = str(bin_dir / 'gcloud')
    with open(self.path, 'w') as f:
      f.write(FAKE_GCLOUD)
    os.chmod(self.path, 0o755)
    self.log = tmp_path / 'gcloud_log.jsonl'
    self.state = tmp_path / 'gcloud_state.json'
    self.env = dict(os.environ, PATH=f'{bin_dir}{os.pathsep}{os.environ["PATH"]}',
                    FAKE_GCLOUD_LOG=str(self.log), FAKE_GCLOUD_STATE=str(self.state),
                    TMPDIR=str(tmp_path))  # where setup writes its tarball
    self.play()

  def play(self, **changes):
    state = dict(exists=False, creating=0, creating_polls=1, life=0, launched=False,
                 preempt_lives=1, workers=4, queued=False)
    state.update(changes)
    self.state.write_text(json.dumps(state))

  def calls(self):
    if not self.log.exists():
      return []
    return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture()
def fake(tmp_path, monkeypatch):
  """Puts the fake gcloud first on PATH (for this process and the tpu.py subprocesses)."""
  handle = Fake(tmp_path)
  for key in ('PATH', 'FAKE_GCLOUD_LOG', 'FAKE_GCLOUD_STATE'):
    monkeypatch.setenv(key, handle.env[key])
  return handle


def short(argv):
  """['compute', 'tpus', 'tpu-vm', 'ssh', 'ptj', ..., '--command=pkill ...'] ->
  'tpu-vm ssh stop'."""
  words = [a for a in argv if not a.startswith('--') and a != 'alpha']
  if words[0] == 'storage':
    return f'storage {words[1]} {words[2].rsplit("/", 1)[-1]}'
  name = f'{words[2]} {words[3]}'
  command = next((a.split('=', 1)[1] for a in argv if a.startswith('--command=')), '')
  for tag, marker in (('stop', 'pkill'), ('train', 'nohup'), ('probe', 'if pgrep'),
                      ('setup', 'pip install')):
    if command.startswith(marker) or (tag in ('train', 'setup') and marker in command):
      return f'{name} {tag}'
  return name


def tpu_py(args, env, timeout=60):
  return commands.run('tpu', *args, env=env, timeout=timeout)


# -- pure builders -----------------------------------------------------------------------------


def test_create_argv_tpu_vm_and_queued_resource():
  assert gcloud.create_argv(VM) == [
      'gcloud', 'compute', 'tpus', 'tpu-vm', 'create', 'ptj', '--zone=us-west4-a',
      '--accelerator-type=v5litepod-16', '--version=v2-alpha-tpuv5-lite', '--spot']
  assert gcloud.create_argv(gcloud.Slice('a', 'us-central2-b', 'v4-32', 'tpu-vm-v4-base',
                                         'preemptible', project='proj')) == [
      'gcloud', 'compute', 'tpus', 'tpu-vm', 'create', 'a', '--zone=us-central2-b',
      '--project=proj', '--accelerator-type=v4-32', '--version=tpu-vm-v4-base', '--preemptible']
  assert gcloud.create_argv(QR) == [
      'gcloud', 'compute', 'tpus', 'queued-resources', 'create', 'ptj', '--node-id=ptj',
      '--zone=us-west4-a', '--accelerator-type=v5litepod-16',
      '--runtime-version=v2-alpha-tpuv5-lite', '--spot']
  assert gcloud.create_argv(gcloud.Slice('b', 'us-east5-b', 'v6e-8', '', 'reserved', True)) == [
      'gcloud', 'compute', 'tpus', 'queued-resources', 'create', 'b', '--node-id=b',
      '--zone=us-east5-b', '--accelerator-type=v6e-8', '--runtime-version=v2-alpha-tpuv6e',
      '--reserved']
  assert gcloud.create_argv(gcloud.Slice('c', 'z', 'v5p-8', '', 'best_effort', True)) == [
      'gcloud', 'alpha', 'compute', 'tpus', 'queued-resources', 'create', 'c', '--node-id=c',
      '--zone=z', '--accelerator-type=v5p-8', '--runtime-version=v2-alpha-tpuv5',
      '--best-effort']


def test_describe_delete_scp_ssh_argv():
  assert gcloud.describe_argv(VM) == [
      'gcloud', 'compute', 'tpus', 'tpu-vm', 'describe', 'ptj', '--zone=us-west4-a',
      '--format=json']
  assert gcloud.describe_argv(QR) == [
      'gcloud', 'compute', 'tpus', 'queued-resources', 'describe', 'ptj', '--zone=us-west4-a',
      '--format=json']
  assert gcloud.node_describe_argv(QR) == gcloud.describe_argv(VM)
  assert gcloud.delete_argv(VM) == [
      'gcloud', 'compute', 'tpus', 'tpu-vm', 'delete', 'ptj', '--zone=us-west4-a', '--quiet']
  assert gcloud.delete_argv(QR) == [
      'gcloud', 'compute', 'tpus', 'queued-resources', 'delete', 'ptj', '--zone=us-west4-a',
      '--force', '--quiet']
  assert gcloud.scp_argv(VM, '/tmp/a.tar.gz', 'pretrain_jax.tar.gz') == [
      'gcloud', 'compute', 'tpus', 'tpu-vm', 'scp', '/tmp/a.tar.gz', 'ptj:pretrain_jax.tar.gz',
      '--zone=us-west4-a', '--worker=all', '--quiet']
  assert gcloud.ssh_argv(VM, 'tail -n 5 log', worker=2) == [
      'gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', 'ptj', '--zone=us-west4-a', '--worker=2',
      '--quiet', '--command=tail -n 5 log']
  assert gcloud.archive_argv('/repo', '/tmp/t.tar.gz') == [
      'git', '-C', '/repo', 'archive', '--format=tar.gz', '--output=/tmp/t.tar.gz', 'HEAD']


def test_tpu_types_and_slice_checks():
  for tpu_type in ('v2-8', 'v2-512', 'v3-2048', 'v4-8', 'v4-4096', 'v5litepod-1',
                   'v5litepod-16', 'v5litepod-256', 'v5p-8', 'v6e-1', 'v6e-256'):
    gcloud.tpu_family(tpu_type)
  for bad in ('v5e-16', 'v4-12', 'v5litepod-2', 'v7-8', 'tpu', ''):
    with pytest.raises(ValueError, match=rf'--tpu_type {re.escape(repr(bad))}.*v2-\{{8,32'):
      gcloud.tpu_family(bad)
  zone = 'us-west4-a'
  with pytest.raises(ValueError, match='needs --queued'):
    gcloud.check_slice(gcloud.Slice('a', zone, 'v4-8', provisioning='reserved'))
  with pytest.raises(ValueError, match='takes --spot'):
    gcloud.check_slice(gcloud.Slice('a', zone, 'v4-8', provisioning='preemptible', queued=True))
  for name in ('My_TPU', 'a b', 'x' * 64, 'ends-'):
    with pytest.raises(ValueError, match=f"bad --name '{name}'"):
      gcloud.check_slice(gcloud.Slice(name, zone, 'v4-8'))
  gcloud.check_target(gcloud.Slice('x' * 63, 'northamerica-northeast1-a'))
  for bad_zone in ('z', 'us west4-a', 'us-west4-a --project=evil', ''):
    with pytest.raises(ValueError, match=f"bad --zone '{bad_zone}'; expected a Cloud TPU zone"):
      gcloud.check_target(gcloud.Slice('a', bad_zone))


def test_states_workers_and_pinned_jax():
  assert gcloud.slice_state({'state': 'READY'}, queued=False) == 'READY'
  assert gcloud.slice_state({'state': {'state': 'SUSPENDED'}}, queued=True) == 'SUSPENDED'
  assert gcloud.worker_count({'networkEndpoints': [{}, {}, {}, {}]}) == 4
  with pytest.raises(ValueError, match='no networkEndpoints'):
    gcloud.worker_count({'name': 'ptj'})
  assert gcloud.pinned_jax_version('# x\njax==0.4.35\njaxlib==0.4.35\n') == '0.4.35'
  with open(os.path.join(ROOT, 'requirements.txt')) as f:
    text = f.read()
  assert f'jax=={gcloud.pinned_jax_version(text)}\n' in text
  with pytest.raises(ValueError, match='pins no jax version'):
    gcloud.pinned_jax_version('flax==0.1\n')


def test_worker_commands():
  command = gcloud.train_command(TRAIN_ARGS)
  assert command.count('--multihost') == 1
  assert gcloud.train_command(TRAIN_ARGS + ['--multihost']) == command
  assert 'nohup bash -c ' in command and command.endswith('< /dev/null &')
  assert ('.venv/bin/python -m pretrain_jax.commands.train --config configs/gpt2_small.py '
          '--workdir gs://bkt/runs/gpt2 --multihost >> "$HOME/pretrain_jax_logs/worker.log" '
          '2>&1') in command
  assert 'gcloud storage cp "$HOME/pretrain_jax_logs/worker.log" ' \
         'gs://bkt/runs/gpt2/logs/worker_$W.log' in command
  assert 'gcloud storage' not in gcloud.train_command(['--config', 'c.py', '--workdir', '/tmp/w'])
  # pkill -f / pgrep -f must not match the ssh shell that runs them (it would kill itself).
  for own in (gcloud.stop_command(), gcloud.probe_command()):
    assert 'pretrain_jax.commands.train' not in own
    assert re.search(gcloud.TRAIN_PATTERN,
                     '.venv/bin/python -m pretrain_jax.commands.train --multihost')
    assert not re.search(gcloud.TRAIN_PATTERN,
                         'bash -c W=1; .venv/bin/python -m pretrain_jax.commands.train --x')
    # nor a trainer that another python runs (this test's own suite starts such trainers)
    assert not re.search(gcloud.TRAIN_PATTERN,
                         f'{sys.executable} -m pretrain_jax.commands.train --x')


def test_stop_signals_the_trainer_and_its_wrapper_records_the_exit(tmp_path):
  """On a worker (here: this machine, in a scratch HOME): stop_command's pkill reaches the
  trainer, not the nohup wrapper that train_command starts, which then writes EXIT (the log
  shipping runs there too). The wrapper's own command line holds 'pretrain_jax.commands.train'."""
  home, code = tmp_path / 'home', tmp_path / 'home' / gcloud.CODE_DIR
  (code / 'pretrain_jax' / 'commands').mkdir(parents=True)
  (code / '.venv' / 'bin').mkdir(parents=True)
  os.symlink(sys.executable, code / '.venv' / 'bin' / 'python')
  for package in ('pretrain_jax', 'pretrain_jax/commands'):   # the shipped code's stand-in
    (code / package / '__init__.py').write_text('')
  (code / 'pretrain_jax' / 'commands' / 'train.py').write_text(
      'import signal, sys, time\n'
      'signal.signal(signal.SIGTERM, lambda *_: (print("saved", flush=True), sys.exit(0)))\n'
      'print("training", flush=True)\ntime.sleep(60)\n')
  stubs = tmp_path / 'stubs'   # this machine's TPU devices are none of stop_command's business
  stubs.mkdir()
  for name in ('sudo', 'curl'):
    (stubs / name).write_text('#!/bin/sh\nexit 1\n')
    (stubs / name).chmod(0o755)
  env = dict(os.environ, HOME=str(home), PATH=f'{stubs}:{os.environ["PATH"]}')
  subprocess.run(['bash', '-c', gcloud.train_command(['--config', 'c.py', '--workdir', '/w'])],
                 env=env, check=True, timeout=30)
  logs = home / gcloud.LOG_DIR
  for _ in range(600):   # (a loaded machine can take many seconds to start Python)
    # the trainer's own line, not the wrapper's "training starts" written before it starts
    if 'training' in ((logs / 'worker.log').read_text().splitlines()
                      if (logs / 'worker.log').exists() else ()):
      break
    time.sleep(0.1)
  def probe():
    return subprocess.run(['bash', '-c', gcloud.probe_command()], env=env, check=True,
                          capture_output=True, text=True).stdout
  assert gcloud.parse_probe(probe()) == ['RUNNING']
  subprocess.run(['bash', '-c', gcloud.stop_command(grace_s=10)], env=env, timeout=60,
                 check=False, capture_output=True)
  for _ in range(300):
    if (logs / 'EXIT').exists():
      break
    time.sleep(0.1)
  assert (logs / 'EXIT').read_text().strip() == '0'
  assert gcloud.parse_probe(probe()) == [0]
  assert 'saved' in (logs / 'worker.log').read_text()
  assert "'jax[tpu]==0.10.2' -f https://storage.googleapis.com/jax-releases/libtpu_releases" \
         in gcloud.setup_command('0.10.2')
  assert 'apt-get install -y -q python3.11-venv' in gcloud.setup_command('0.10.2', 'python3.11')
  with pytest.raises(ValueError, match="bad --python 'python; rm'"):
    gcloud.setup_command('0.10.2', 'python; rm')
  assert gcloud.parse_probe('TRAIN=RUNNING\nTRAIN=EXIT:0\nnoise\nTRAIN=EXIT:-9\nTRAIN=IDLE\n') \
         == ['RUNNING', 0, -9, 'IDLE']
  assert gcloud.workdir_of(['--workdir=gs://a']) == 'gs://a'


def test_package_imports_only_the_standard_library():
  package = os.path.join(ROOT, 'pretrain_jax', 'cloud')
  for name in os.listdir(package):
    if name.endswith('.py'):
      with open(os.path.join(package, name)) as f:
        tree = ast.parse(f.read())
      for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
          modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [f'{node.module}.{a.name}' if node.module == 'pretrain_jax'
                           else node.module for a in node.names])
          for module in modules:   # and the chip table, which is the standard library only
            assert (module.split('.')[0] in sys.stdlib_module_names
                    or module.startswith('pretrain_jax.cloud')
                    or module == 'pretrain_jax.chips'), (name, module)


# -- a slice's life against the fake gcloud ----------------------------------------------------


def make_launcher(fake, tpu=VM, sleeps=None, **kwargs):
  sleeps = [] if sleeps is None else sleeps
  return launcher.Launcher(tpu, launcher.subprocess_runner(fake.path), sleep=sleeps.append,
                           poll_interval_s=5, watch_interval_s=7, backoff_s=30,
                           tarball_dir=str(fake.log.parent), log=lambda msg: None, **kwargs)


def test_create_setup_run_watch_survives_a_preemption(fake):
  sleeps = []
  job = make_launcher(fake, sleeps=sleeps, max_retries=2)
  assert job.create() == {'name': 'ptj', 'state': 'READY', 'workers': 4}
  assert job.setup()['jax'] == 'jax[tpu]==0.10.2'
  result = job.run(TRAIN_ARGS, watch=True)
  assert result == {'name': 'ptj', 'args': TRAIN_ARGS, 'recreations': 1, 'workers': 4,
                    'status': 'finished'}
  calls = fake.calls()
  assert [short(c) for c in calls] == [
      'tpu-vm create', 'tpu-vm describe', 'tpu-vm describe',  # CREATING, READY
      'tpu-vm scp', 'tpu-vm ssh setup',
      'tpu-vm describe', 'tpu-vm ssh stop', 'tpu-vm ssh train',  # run: READY, 4 workers
      'tpu-vm describe',  # PREEMPTED
      'tpu-vm delete', 'storage rm LOCK',  # the lost trainer's workdir lock
      'tpu-vm create', 'tpu-vm describe', 'tpu-vm describe',
      'tpu-vm scp', 'tpu-vm ssh setup', 'tpu-vm ssh stop', 'tpu-vm ssh train',
      'tpu-vm describe', 'tpu-vm ssh probe']  # READY, TRAIN=EXIT:0 on 4 workers
  assert calls[0] == gcloud.create_argv(VM)[1:] and calls[11] == calls[0]
  assert calls[9] == gcloud.delete_argv(VM)[1:]
  assert calls[10] == ['storage', 'rm', 'gs://bkt/runs/gpt2/LOCK', '--quiet']
  assert gcloud.LOCK_FILE == lock_lib.LOCK_FILE
  assert calls[3] == ['compute', 'tpus', 'tpu-vm', 'scp',
                      os.path.join(str(fake.log.parent), 'pretrain_jax-ptj.tar.gz'),
                      'ptj:pretrain_jax.tar.gz', '--zone=us-west4-a', '--worker=all', '--quiet']
  launches = [c for c in calls if short(c) == 'tpu-vm ssh train']
  assert launches[0] == launches[1] == gcloud.ssh_argv(VM, gcloud.train_command(TRAIN_ARGS))[1:]
  # create polls 5 s apart; the watch checks every 7 s; re-creation 1 waits backoff_s.
  assert sleeps == [5, 7, 30, 5, 7]


def test_worker_count_comes_from_describe(fake):
  fake.play(workers=2)
  assert make_launcher(fake).create()['workers'] == 2


def test_queued_resource_create_and_suspension(fake):
  fake.play(queued=True)
  job = make_launcher(fake, tpu=QR, max_retries=1)
  job.create()
  result = job.run(TRAIN_ARGS, watch=True)
  assert result['status'] == 'finished' and result['workers'] == 4
  assert [short(c) for c in fake.calls()][:4] == [
      'queued-resources create', 'queued-resources describe', 'queued-resources describe',
      'tpu-vm describe']  # WAITING_FOR_RESOURCES, ACTIVE, then the node's endpoints
  assert gcloud.delete_argv(QR)[1:] in fake.calls()  # after SUSPENDED


def test_watch_gives_up_after_max_retries(fake):
  fake.play(preempt_lives=100)
  sleeps = []
  job = make_launcher(fake, sleeps=sleeps, max_retries=2)
  job.create()
  with pytest.raises(launcher.LaunchError, match=r'gave up: slice ptj is PREEMPTED .*'
                                                 r'--max_retries=2'):
    job.run(TRAIN_ARGS, watch=True)
  assert [short(c) for c in fake.calls()].count('tpu-vm create') == 3
  assert [s for s in sleeps if s not in (5, 7)] == [30, 60]  # exponential backoff


def test_cli_watch_gives_up_with_one_line_and_nonzero_exit(fake):
  fake.play(preempt_lives=100)
  flags = ['--name', 'ptj', '--zone', ZONE, '--tpu_type', 'v5litepod-16', '--spot',
           '--poll_interval_s', '0', '--watch_interval_s', '0', '--backoff_s', '0',
           '--nopreflight']
  assert tpu_py(['create'] + flags, fake.env).returncode == 0
  done = tpu_py(['run', '--watch', '--max_retries', '1'] + flags + ['--'] + TRAIN_ARGS,
                fake.env)
  assert done.returncode == 1
  last = done.stderr.strip().splitlines()[-1]
  assert last.startswith('error: gave up: slice ptj is PREEMPTED') and '--max_retries=1' in last
  assert 'Traceback' not in done.stderr and done.stdout == ''


def test_dry_run_prints_commands_and_runs_none(fake):
  done = tpu_py(['run', '--name', 'ptj', '--zone', ZONE, '--dry_run', '--'] + TRAIN_ARGS,
                fake.env)
  assert done.returncode == 0, done.stderr
  lines = done.stdout.strip().splitlines()
  assert lines[:-1] == [
      'gcloud compute tpus tpu-vm describe ptj --zone=us-west4-a --format=json',
      launcher.shlex.join(gcloud.ssh_argv(VM, gcloud.stop_command())),
      launcher.shlex.join(gcloud.ssh_argv(VM, gcloud.train_command(TRAIN_ARGS)))]
  assert json.loads(lines[-1])['dry_run'] is True
  done = tpu_py(['setup', '--name', 'ptj', '--zone', ZONE, '--dry_run'], fake.env)
  assert [line.split()[0] for line in done.stdout.strip().splitlines()[:-1]] == ['git', 'gcloud',
                                                                           'gcloud']
  assert fake.calls() == []


def test_gcloud_missing_is_one_line_exit_2(tmp_path):
  empty = tmp_path / 'empty'
  empty.mkdir()
  done = tpu_py(['status', '--name', 'ptj', '--zone', ZONE], dict(os.environ, PATH=str(empty)))
  assert done.returncode == 2
  assert done.stderr.strip().splitlines() == [
      'error: gcloud not found on PATH; install the Google Cloud CLI '
      '(https://cloud.google.com/sdk/docs/install) and run `gcloud init`']


def test_unknown_tpu_type_lists_the_known_ones(fake):
  done = tpu_py(['create', '--name', 'ptj', '--zone', ZONE, '--tpu_type', 'v5e-16'], fake.env)
  assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
  assert "error: unknown --tpu_type 'v5e-16'" in done.stderr and 'v5litepod' in done.stderr
  assert 'v5litepod-{1,4,8,16,32,64,128,256}' in done.stderr and 'v6e-{1,4,8' in done.stderr
  assert fake.calls() == []


def test_gcloud_failure_names_the_command_and_its_stderr(fake):
  fake.play(fail_verb='scp')
  done = tpu_py(['setup', '--name', 'ptj', '--zone', ZONE], fake.env)
  assert done.returncode == 1 and 'Traceback' not in done.stderr
  line, = [x for x in done.stderr.strip().splitlines() if x.startswith('error:')]
  assert line.startswith('error: `gcloud compute tpus tpu-vm scp ')
  assert line.endswith('failed (exit 1): ERROR: (gcloud.compute.tpus.tpu-vm.scp) '
                       'PERMISSION_DENIED: scripted failure second line of the tail')


def test_worker_commands_parse_and_the_train_command_runs_detached(tmp_path):
  """The launch command under a real bash, with stand-ins for the venv's python, curl, gcloud."""
  for command in (gcloud.setup_command('0.10.2'), gcloud.stop_command(), gcloud.probe_command(),
                  gcloud.train_command(TRAIN_ARGS), gcloud.logs_command(True)):
    assert subprocess.run(['bash', '-n', '-c', command], check=False).returncode == 0, command
  home, stubs = tmp_path / 'home', tmp_path / 'stubs'
  (home / 'pretrain_jax' / '.venv' / 'bin').mkdir(parents=True)
  stubs.mkdir()
  record = tmp_path / 'record.txt'
  for path, body in ((home / 'pretrain_jax' / '.venv' / 'bin' / 'python',
                      f'echo "python $*" >> {record}; echo step 1 of 1; exit 0'),
                     (stubs / 'curl', 'echo 3'),  # the metadata server: worker 3
                     (stubs / 'gcloud', f'echo "gcloud $*" >> {record}')):
    path.write_text(f'#!/bin/sh\n{body}\n')
    path.chmod(0o755)
  env = dict(os.environ, HOME=str(home), PATH=f'{stubs}{os.pathsep}{os.environ["PATH"]}')
  done = subprocess.run(['bash', '-c', gcloud.train_command(TRAIN_ARGS)], env=env, timeout=10,
                        capture_output=True, text=True, check=False)
  assert done.returncode == 0 and done.stdout == ''  # returns at once: the job is detached
  exit_file = home / 'pretrain_jax_logs' / 'EXIT'
  for _ in range(100):
    if exit_file.exists() and exit_file.read_text().strip():
      break
    subprocess.run(['sleep', '0.1'], check=True)
  assert exit_file.read_text() == '0\n'
  log = (home / 'pretrain_jax_logs' / 'worker.log').read_text()
  assert 'worker 3: training starts' in log and log.endswith('step 1 of 1\n')
  assert record.read_text().splitlines() == [
      'python -m pretrain_jax.commands.train --config configs/gpt2_small.py --workdir '
      'gs://bkt/runs/gpt2 --multihost',
      f'gcloud storage cp {home}/pretrain_jax_logs/worker.log '
      'gs://bkt/runs/gpt2/logs/worker_3.log']


def test_recreation_that_fails_counts_as_a_retry(fake):
  fake.play(exists=True, life=1, launched=True, fail_verb='create')  # preempted, no capacity
  sleeps = []
  with pytest.raises(launcher.LaunchError, match=r'gave up: slice ptj .*tpu-vm create '
                                                 r'.*PERMISSION_DENIED'):
    make_launcher(fake, sleeps=sleeps, max_retries=3).run(TRAIN_ARGS, watch=True)
  assert [short(c) for c in fake.calls()].count('tpu-vm create') == 3
  assert sleeps == [30, 60, 120]


def test_status_logs_stop_delete(fake):
  job = make_launcher(fake)
  assert job.status() == {'name': 'ptj', 'state': 'NOT_FOUND'}
  job.create()
  assert job.status() == {'name': 'ptj', 'state': 'READY', 'workers': 4, 'train': ['IDLE'] * 4}
  assert job.logs(worker=1, follow=True) == {'name': 'ptj', 'worker': 1}
  assert job.stop() == {'name': 'ptj', 'stopped': True}
  assert job.delete() == {'name': 'ptj', 'deleted': True, 'was_missing': False}
  assert job.delete()['was_missing'] is True
  calls = fake.calls()
  assert [short(c) for c in calls[-4:]] == ['tpu-vm ssh', 'tpu-vm ssh stop', 'tpu-vm delete',
                                            'tpu-vm delete']
  assert calls[-4] == ['compute', 'tpus', 'tpu-vm', 'ssh', 'ptj', '--zone=us-west4-a',
                       '--worker=1', '--quiet',
                       '--command=tail -n 100 -F ~/pretrain_jax_logs/worker.log']


def test_describe_output_that_is_not_json_is_one_clear_error():
  job = launcher.Launcher(VM, lambda argv, capture: (0, 'Listed 0 items.\n', ''))
  with pytest.raises(launcher.LaunchError, match=r"^`gcloud .*describe ptj .* printed 'Listed 0 "
                                                 r"items.'"):
    job.describe()


def test_run_refuses_a_config_setup_would_not_ship(fake, tmp_path):
  """setup ships the committed HEAD: an untracked config (or one outside the repository) would
  be missing on every worker."""
  os.makedirs(os.path.join(ROOT, 'runs'), exist_ok=True)
  untracked = os.path.join(ROOT, 'runs', f'untracked_{os.getpid()}.py')   # runs/ is ignored
  with open(os.path.join(ROOT, 'configs', 'tiny_gpt.py')) as f, open(untracked, 'w') as g:
    g.write(f.read())
  (tmp_path / 'mine.py').write_text(open(untracked).read())   # exists, outside the repository
  try:
    for config, message in ((os.path.relpath(untracked, ROOT), 'is not committed; setup ships'),
                            (str(tmp_path / 'mine.py'), 'no such file in')):
      done = tpu_py(['run', '--name', 'ptj', '--zone', ZONE, '--', '--config', config,
                     '--workdir', 'gs://bkt/r'], fake.env)
      assert done.returncode == 2 and message in done.stderr, done.stderr
  finally:
    os.remove(untracked)
  assert fake.calls() == []


@pytest.mark.parametrize('flag, message', [
    ('--watch_interval_s=-1', 'error: flag --watch_interval_s=-1: '),
    ('--backoff_s=-5', 'error: flag --backoff_s=-5: '),
    ('--max_polls=0', 'error: flag --max_polls=0: '),
    ('--max_polls=abc', 'error: flag --max_polls=abc: '),
    ('--nosuchflag', "error: Unknown command line flag 'nosuchflag'"),
])
def test_bad_tpu_flags_are_one_line_before_any_gcloud_command(fake, flag, message):
  done = tpu_py(['run', '--name', 'ptj', '--zone', ZONE, '--tpu_type', 'v4-8', '--watch', flag,
                 '--'] + TRAIN_ARGS, fake.env)
  assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
  assert done.stderr.startswith(message), done.stderr
  assert fake.calls() == []


@pytest.mark.parametrize('train_args, message', [
    (['--config', 'configs/gpt2_smal.py', '--workdir', 'gs://bkt/r'],
     'error: --config configs/gpt2_smal.py: no such file in '),
    (['--config', 'configs/gpt2_small.py', '--workdir', 'runs/local'],
     'error: --workdir runs/local is not in a Cloud Storage bucket'),
    (['--config', 'configs/gpt2_small.py', '--workdir', 'gs://'],
     'error: --workdir gs:// is not in a Cloud Storage bucket'),
    # the README's placeholder: "expected gs://BUCKET/...", which it was given
    (['--config', 'configs/gpt2_small.py', '--workdir', 'gs://BUCKET/runs/gpt2'],
     "error: --workdir gs://BUCKET/runs/gpt2: 'BUCKET' is not a valid"),
    (TRAIN_ARGS + ['--config.model.vocab_sise=50304'],
     ('pretrain-jax train refuses', '--config.model.vocab_sise=50304', "'vocab_size'")),
    (TRAIN_ARGS + ['--config.train.steps=abc'],
     ('pretrain-jax train refuses', '--config.train.steps=abc:')),
    (TRAIN_ARGS + ['--nosuchflag=1'],
     ('pretrain-jax train refuses', "'nosuchflag'")),
    (TRAIN_ARGS + ['--watch', '--max_retries=2', '--nospot'],
     'error: --max_retries, --nospot, --watch after --'),
    (['--workdir', 'gs://bkt/r'], 'need --config and --workdir'),
])
def test_run_refuses_train_arguments_that_would_fail_on_every_worker(fake, train_args, message):
  done = tpu_py(['run', '--name', 'ptj', '--zone', ZONE, '--'] + train_args, fake.env)
  assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
  for part in (message,) if isinstance(message, str) else message:
    assert part in done.stderr, done.stderr
  assert fake.calls() == []                       # refused before any gcloud command
  ok = tpu_py(['run', '--name', 'ptj', '--zone', ZONE, '--dry_run', '--'] + TRAIN_ARGS
              + ['--config.model.vocab_size=50304'], fake.env)
  assert ok.returncode == 0, ok.stderr


def test_run_refuses_a_committed_config_with_uncommitted_edits(tmp_path, monkeypatch):
  """The workers would run the committed version of an edited config: refused, naming it. A
  scratch repository stands in for the project's, so no tracked file of this one is touched."""
  repo = tmp_path / 'repo'
  (repo / 'configs').mkdir(parents=True)
  config = repo / 'configs' / 'mine.py'
  config.write_text(open(os.path.join(ROOT, 'configs', 'tiny_gpt.py')).read())
  git = ['git', '-C', str(repo), '-c', 'user.name=t', '-c', 'user.email=t@t']
  for argv in (['init', '-q'], ['add', 'configs/mine.py'], ['commit', '-q', '-m', 'config']):
    subprocess.run(git + argv, check=True)
  monkeypatch.setattr(launcher, 'REPO_ROOT', str(repo))
  args = ['--config', 'configs/mine.py', '--workdir', 'gs://bkt/r']
  config.write_text(config.read_text() + '\n# edited\n')
  with pytest.raises(ValueError, match=r'^--config configs/mine\.py .*uncommitted'):
    tpu_command.check_train_args(args)
  subprocess.run(git + ['commit', '-q', '-am', 'edit'], check=True)
  ran, real_run = [], subprocess.run   # committed as it is: on to train.py's own parsing
  monkeypatch.setattr(tpu_command.subprocess, 'run', lambda argv, **kw: (
      ran.append(argv), subprocess.CompletedProcess(argv, 0, '', ''))[1]
      if argv[0] == sys.executable else real_run(argv, **kw))
  tpu_command.check_train_args(args)
  assert ran and ran[0][-2:] == ['--multihost', '--check_args']


# -- multislice and the preflight ------------------------------------------------------------

MS = gcloud.Slice('ptj', ZONE, 'v5litepod-16', '', 'spot', queued=True, slices=2)


def test_multislice_is_one_queued_resource_of_n_nodes():
  assert gcloud.create_argv(MS) == [
      'gcloud', 'compute', 'tpus', 'queued-resources', 'create', 'ptj', '--node-count=2',
      '--node-prefix=ptj', '--zone=us-west4-a', '--accelerator-type=v5litepod-16',
      '--runtime-version=v2-alpha-tpuv5-lite', '--spot']
  assert gcloud.node_describe_argv(MS)[5] == 'ptj-0'     # every slice has as many workers
  assert gcloud.ssh_argv(MS, 'true') == [
      'gcloud', 'compute', 'tpus', 'queued-resources', 'ssh', 'ptj', '--zone=us-west4-a',
      '--node=all', '--worker=all', '--quiet', '--command=true']
  assert gcloud.ssh_argv(MS, 'tail x', worker=1, node=0)[7:9] == ['--node=0', '--worker=1']
  assert gcloud.scp_argv(MS, '/t.tgz', 'p.tgz') == [
      'gcloud', 'compute', 'tpus', 'queued-resources', 'scp', '/t.tgz', 'ptj:p.tgz',
      '--zone=us-west4-a', '--node=all', '--worker=all', '--quiet']
  assert gcloud.delete_argv(MS) == gcloud.delete_argv(QR)   # --force takes every node
  # each slice numbers its workers from 0: their logs in the bucket go by host name
  assert '/worker_$(hostname).log' in gcloud.train_command(TRAIN_ARGS, multislice=True)
  with pytest.raises(ValueError, match='--slices=2; expected 1, or several with --queued'):
    gcloud.check_slice(gcloud.Slice('ptj', ZONE, 'v4-32', slices=2))
  assert gcloud.accelerator_type({'acceleratorType': 'v4-8'}) == 'v4-8'
  assert gcloud.accelerator_type(
      {'tpu': {'nodeSpec': [{'node': {'acceleratorType': 'v6e-16'}}]}}) == 'v6e-16'
  assert gcloud.accelerator_type({}) == ''


def test_multislice_dry_run_shows_the_gcloud_lines_for_n_slices(fake):
  flags = ['--name', 'ptj', '--zone', ZONE, '--tpu_type', 'v5litepod-16', '--spot', '--queued',
           '--slices', '2', '--dry_run']
  def lines(done):
    return done.stdout.strip().splitlines()[:-1]
  done = tpu_py(['create'] + flags, fake.env)
  assert done.returncode == 0, done.stderr
  assert lines(done) == [launcher.shlex.join(gcloud.create_argv(MS)),
                         launcher.shlex.join(gcloud.describe_argv(MS)),
                         launcher.shlex.join(gcloud.node_describe_argv(MS))]
  done = tpu_py(['run', '--nopreflight'] + flags + ['--'] + TRAIN_ARGS, fake.env)
  assert done.returncode == 0, done.stderr
  assert lines(done)[-2:] == [
      launcher.shlex.join(gcloud.ssh_argv(MS, gcloud.stop_command())),
      launcher.shlex.join(gcloud.ssh_argv(MS, gcloud.train_command(TRAIN_ARGS, True)))]
  assert fake.calls() == []


def test_plan_reads_the_train_arguments_that_shape_the_step():
  from pretrain_jax.commands import tpu  # noqa: PLC0415  (absl flags, as the test above)
  assert tpu.plan_args(['--config', 'gpt2_small', '--workdir', 'gs://b/r', '--multihost',
                        '--config.model.dtype=bfloat16', '--config.train.batch_size', '64',
                        '--config=x']) == [
      '--config', 'gpt2_small', '--config.model.dtype=bfloat16', '--config.train.batch_size',
      '64', '--config=x']


def test_preflight_refuses_a_run_that_fits_no_batch_before_any_gcloud_command(fake):
  """A model whose state alone outgrows a v5e chip's HBM: the dry run stops at the preflight
  (one compile) with one line, and no gcloud command is printed or run."""
  too_big = ['--config', 'tiny_gpt', '--workdir', 'gs://bkt/r', '--config.model.num_layers=1',
             '--config.model.vocab_size=2000000', '--config.model.emb_dim=1024',
             '--config.train.batch_size=1']
  done = tpu_py(['run', '--name', 'ptj', '--zone', ZONE, '--tpu_type', 'v5litepod-1',
                 '--dry_run', '--'] + too_big, fake.env, timeout=600)
  assert done.returncode == 2, done.stderr
  errors = [line for line in done.stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1 and 'Traceback' not in done.stderr
  assert errors[0].startswith('error: train.batch_size=1 does not fit 1 x v5litepod-1')
  assert 'no batch fits' in errors[0] and '--nopreflight' in errors[0]
  assert done.stdout == '' and fake.calls() == []


@pytest.mark.slow
def test_preflight_names_the_largest_batch_that_fits_and_it_fits(fake):
  """The refusal names --fit's batch; the plan of that batch fits and of the next does not."""
  big = ['--config', 'tiny_gpt', '--config.model.num_layers=1',
         '--config.model.vocab_size=1200000', '--config.data.seq_len=1536',
         '--config.model.max_len=1536', '--config.train.fused_loss=False']   # f32 logits
  done = tpu_py(['run', '--name', 'ptj', '--zone', ZONE, '--tpu_type', 'v5litepod-1',
                 '--dry_run', '--'] + big + ['--workdir', 'gs://bkt/r',
                                             '--config.train.batch_size=2'],
                fake.env, timeout=900)
  assert done.returncode == 2 and fake.calls() == [], done.stderr
  line = done.stderr.strip().splitlines()[-1]
  best = int(re.search(r'the largest that fits is (\d+) ', line).group(1))
  assert line.startswith('error: train.batch_size=2 does not fit 1 x v5litepod-1') and best == 1
  for batch, fits in ((best, True), (best + 1, False)):
    done = commands.run('plan', *big, '--topology', 'v5e-1', '--noeval',
                        f'--config.train.batch_size={batch}', timeout=900)
    assert json.loads(done.stdout.strip().splitlines()[-1])['fits'] is fits, done.stderr
