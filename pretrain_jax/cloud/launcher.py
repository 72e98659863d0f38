"""Runs the gcloud.py commands: create and wait, ship the code, run, watch and recover.

The side effects are two injected callables, so tests drive the whole life of a slice with a fake
`gcloud` and no sleeping: `runner(argv, capture) -> (returncode, stdout, stderr)` and
`sleep(seconds)`. A dry run prints each argv (shell-quoted, one per line) instead of running it.
"""
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from pretrain_jax.cloud import gcloud

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_PROBE_FAILURES = 3  # consecutive failed ssh probes of a READY slice before giving up


class LaunchError(RuntimeError):
  """A failure with a one-line message: a gcloud command failed, or the watch gave up."""


def render(argv) -> str:
  """The argv as one shell line, long arguments shortened (for error messages)."""
  return shlex.join(a if len(a) <= 80 else a[:60] + '...' for a in argv)


def _json(out: str, argv) -> dict:
  """describe's --format=json output ('' in a dry run) as a dict."""
  try:
    value = json.loads(out) if out.strip() else {}
  except json.JSONDecodeError:
    value = None
  if not isinstance(value, dict):
    raise LaunchError(f'`{render(argv)}` printed {out.strip()[:100]!r}; expected a JSON object')
  return value


def subprocess_runner(gcloud_path: str):
  """Runs argv for real; `gcloud` resolves to gcloud_path (found once on PATH)."""

  def run(argv, capture=True):
    argv = [gcloud_path if i == 0 and a == 'gcloud' else a for i, a in enumerate(argv)]
    if not capture:  # logs: stream to the terminal
      return subprocess.run(argv, check=False).returncode, '', ''
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout, done.stderr

  return run


def dry_runner(out=sys.stdout):
  """Prints argv instead of running it; every command "succeeds" with empty output."""

  def run(argv, capture=True):
    del capture
    print(shlex.join(argv), file=out, flush=True)
    return 0, '', ''

  return run


@dataclasses.dataclass
class Launcher:
  tpu: gcloud.Slice
  runner: callable
  sleep: callable = time.sleep
  dry_run: bool = False
  poll_interval_s: float = 10.0  # between describes while a slice is being created
  max_polls: int = 360  # describes before create gives up waiting
  watch_interval_s: float = 60.0  # between checks of a running job
  max_retries: int = 3  # re-creations after preemption before run --watch gives up
  backoff_s: float = 60.0  # wait before re-creation i: backoff_s * 2**(i - 1)
  python: str = 'python3'  # on the workers, to make the venv
  repo_root: str = REPO_ROOT
  tarball_dir: str = ''  # where setup writes the tarball ('' = the system temp dir)
  log: callable = lambda msg: print(msg, file=sys.stderr, flush=True)
  # run: preflight(accelerator type) before anything starts; raises to refuse the run
  # (commands/tpu.py compiles the run for that type with `pretrain-jax plan`).
  preflight: callable = None

  # -- one gcloud call ---------------------------------------------------------------------

  def _call(self, argv, ok_not_found=False, capture=True) -> str:
    rc, out, err = self.runner(argv, capture)
    if rc == 0:
      return out
    if ok_not_found and 'NOT_FOUND' in err:
      return None
    tail = ' '.join(err.strip().splitlines()[-2:])[-300:] or '(no stderr)'
    raise LaunchError(f'`{render(argv)}` failed (exit {rc}): {tail}')

  def describe(self):
    """(state, description); state NOT_FOUND when the slice does not exist."""
    out = self._call(gcloud.describe_argv(self.tpu), ok_not_found=True)
    if out is None:
      return 'NOT_FOUND', {}
    description = _json(out, gcloud.describe_argv(self.tpu))
    return gcloud.slice_state(description, self.tpu.queued), description

  def workers(self, description) -> int:
    if self.tpu.queued:  # the queued resource's record has no endpoints; its node has
      out = self._call(gcloud.node_describe_argv(self.tpu))
      description = _json(out, gcloud.node_describe_argv(self.tpu))
    if self.dry_run:
      return None
    try:
      return gcloud.worker_count(description) * self.tpu.slices
    except ValueError as e:
      raise LaunchError(str(e)) from None

  # -- subcommands ---------------------------------------------------------------------------

  def create(self) -> dict:
    self._call(gcloud.create_argv(self.tpu))
    workers = self.wait_ready()
    return {'name': self.tpu.name, 'state': 'READY', 'workers': workers}

  def wait_ready(self) -> int:
    """Describes every poll_interval_s until READY / ACTIVE; returns the worker count."""
    state = ''
    for i in range(self.max_polls):
      if i:
        self.sleep(self.poll_interval_s)
      state, description = self.describe()
      if self.dry_run or state in gcloud.READY_STATES:
        return self.workers(description)
      if state in gcloud.LOST_STATES:
        raise LaunchError(f'slice {self.tpu.name} became {state} while waiting for it to be '
                          'READY or ACTIVE')
      self.log(f'{self.tpu.name}: {state or "no state yet"} ({i + 1}/{self.max_polls})')
    raise LaunchError(f'slice {self.tpu.name} still {state or "without a state"} after '
                      f'{self.max_polls} polls {self.poll_interval_s:g} s apart; expected READY '
                      'or ACTIVE (raise --max_polls to wait longer)')

  def setup(self) -> dict:
    """Ships HEAD as a tarball to every worker, makes a venv, installs the pinned jax[tpu]."""
    if not os.path.exists(os.path.join(self.repo_root, '.git')):
      raise LaunchError(f'setup ships the committed HEAD of a git clone, and {self.repo_root} is '
                        'not one; expected pretrain-jax installed from a clone (pip install -e '
                        'CLONE), whose code and configs the workers then run')
    with open(os.path.join(self.repo_root, 'requirements.txt')) as f:
      try:
        jax_version = gcloud.pinned_jax_version(f.read())
      except ValueError as e:
        raise LaunchError(str(e)) from None
    if not self.dry_run:
      self._warn_if_dirty()
    tarball = os.path.join(self.tarball_dir or tempfile.gettempdir(),
                           f'pretrain_jax-{self.tpu.name}.tar.gz')
    self._call(gcloud.archive_argv(self.repo_root, tarball))
    self._call(gcloud.scp_argv(self.tpu, tarball, gcloud.TARBALL))
    self._call(gcloud.ssh_argv(self.tpu, gcloud.setup_command(jax_version, self.python)))
    return {'name': self.tpu.name, 'setup': 'done', 'jax': f'jax[tpu]=={jax_version}'}

  def _warn_if_dirty(self):
    done = subprocess.run(['git', '-C', self.repo_root, 'status', '--porcelain',
                           '--untracked-files=no'], capture_output=True, text=True, check=False)
    if done.returncode == 0 and done.stdout.strip():
      self.log(f'warning: uncommitted changes in {self.repo_root} are not shipped; setup ships '
               'the committed HEAD')

  def launch(self, train_args):
    """Frees the TPU on every worker, then starts training (--multihost) detached on each."""
    self._call(gcloud.ssh_argv(self.tpu, gcloud.stop_command()))
    self._call(gcloud.ssh_argv(self.tpu, gcloud.train_command(train_args,
                                                              self.tpu.multislice)))

  def probe(self) -> list:
    return gcloud.parse_probe(self._call(gcloud.ssh_argv(self.tpu, gcloud.probe_command())))

  def run(self, train_args, watch=False) -> dict:
    """Starts training on every worker; with watch, also recovers it until it finishes."""
    if not train_args:
      raise LaunchError('run needs the arguments of pretrain-jax train after --, e.g. -- --config '
                        'configs/gpt2_small.py --workdir gs://my-bucket/runs/gpt2')
    if self.preflight is not None and self.tpu.tpu_type:
      self.preflight(self.tpu.tpu_type)
    state, description = self.describe()
    if not self.dry_run and state not in gcloud.READY_STATES and not (
        watch and state in gcloud.LOST_STATES):
      raise LaunchError(f'slice {self.tpu.name} is {state}; expected READY or ACTIVE '
                        '(create it first)')
    if self.preflight is not None and not self.tpu.tpu_type:
      self.preflight(gcloud.accelerator_type(description))   # the running slice's type
    result = {'name': self.tpu.name, 'args': list(train_args), 'recreations': 0}
    if state in gcloud.READY_STATES or self.dry_run:
      result['workers'] = self.workers(description)
      self.launch(train_args)
    else:
      self.recreate(result, state, train_args)
    if not watch or self.dry_run:
      return dict(result, status='launched')
    return self.watch(train_args, result)

  def recreate(self, result: dict, state: str, train_args) -> None:
    """Deletes the lost slice, creates it again, sets it up and reruns the same command.

    A failed attempt (e.g. no Spot capacity right now) counts as a re-creation and is retried
    after the next backoff; result['recreations'] and result['workers'] are updated.
    """
    while True:
      attempt = result['recreations'] = result['recreations'] + 1
      if attempt > self.max_retries:
        raise LaunchError(f'gave up: slice {self.tpu.name} is {state} again after '
                          f'{self.max_retries} re-creations (--max_retries={self.max_retries})')
      wait = self.backoff_s * 2**(attempt - 1)
      self.log(f'{self.tpu.name} is {state}: re-creation {attempt}/{self.max_retries} in '
               f'{wait:g} s')
      self.sleep(wait)
      try:
        self._call(gcloud.delete_argv(self.tpu), ok_not_found=True)
        self._release_lock(train_args)
        self._call(gcloud.create_argv(self.tpu))
        result['workers'] = self.wait_ready()
        self.setup()
        self.launch(train_args)
        return
      except LaunchError as e:
        self.log(f'warning: re-creation {attempt} failed: {e}')
        state = f'not back (last error: {e})'

  def _release_lock(self, train_args) -> None:
    """The deleted slice took its trainers with it, and one held the workdir's LOCK: removed
    here, or the new slice's trainer would be refused until that heartbeat is stale (10 min)."""
    workdir = gcloud.workdir_of(train_args)
    if not workdir.startswith('gs://'):
      return
    rc, _, err = self.runner(gcloud.unlock_argv(workdir), True)
    if rc == 0:
      self.log(f'removed the lost slice\'s lock {gcloud.lock_path(workdir)}')
    elif 'matched no objects' not in err:
      self.log(f'warning: could not remove {gcloud.lock_path(workdir)}: '
               f'{" ".join(err.strip().splitlines()[-1:])[-200:]}')

  def watch(self, train_args, result) -> dict:
    """Polls until training exits on every worker; re-creates the slice when it is lost.

    Failed describes and probes (a flaky API or ssh) are retried; MAX_PROBE_FAILURES in a row
    end the watch.
    """
    failures = 0
    while True:
      self.sleep(self.watch_interval_s)
      try:
        state, _ = self.describe()
        if state in gcloud.LOST_STATES:
          self.recreate(result, state, train_args)
          failures = 0
          continue
        if state not in gcloud.READY_STATES:
          self.log(f'{self.tpu.name}: {state}')
          continue
        found = self.probe()
        if 'RUNNING' in found:
          failures = 0
          continue
        if len(found) != result['workers']:
          raise LaunchError(f'{len(found)} of {result["workers"]} workers answered the probe '
                            f'({found})')
      except LaunchError as e:
        if str(e).startswith('gave up'):
          raise
        failures += 1
        if failures >= MAX_PROBE_FAILURES:
          raise LaunchError(f'{failures} failed checks in a row, the last: {e}') from None
        self.log(f'warning: {e}')
        continue
      if all(code == 0 for code in found):
        return dict(result, status='finished')
      raise LaunchError(f'training stopped on a healthy slice (per worker: {found}; IDLE = '
                        'killed without an exit code); not rerunning it, see '
                        '`pretrain-jax tpu logs`')

  def status(self) -> dict:
    state, description = self.describe()
    result = {'name': self.tpu.name, 'state': state}
    if state in gcloud.READY_STATES and not self.dry_run:
      result['workers'] = self.workers(description)
      result['train'] = self.probe()
    return result

  def stop(self) -> dict:
    self._call(gcloud.ssh_argv(self.tpu, gcloud.stop_command()))
    return {'name': self.tpu.name, 'stopped': True}

  def delete(self) -> dict:
    gone = self._call(gcloud.delete_argv(self.tpu), ok_not_found=True) is None
    return {'name': self.tpu.name, 'deleted': True, 'was_missing': gone}

  def logs(self, worker=0, follow=False, lines=100) -> dict:
    self._call(gcloud.ssh_argv(self.tpu, gcloud.logs_command(follow, lines), worker=worker,
                               node=0), capture=False)
    return {'name': self.tpu.name, 'worker': worker}


def find_gcloud():
  """gcloud's path on PATH, or LaunchError with the fix."""
  path = shutil.which('gcloud')
  if not path:
    raise LaunchError('gcloud not found on PATH; install the Google Cloud CLI '
                      '(https://cloud.google.com/sdk/docs/install) and run `gcloud init`')
  return path
