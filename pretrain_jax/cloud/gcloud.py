"""Pure builders: `gcloud` argv lists for a Cloud TPU slice and the shell commands its workers run.

Nothing here runs anything; launcher.py does. A slice is either a TPU VM (`tpu-vm create`) or a
queued resource (`queued-resources create`, whose node has the same name). Every worker of the
slice runs the same command (`ssh --worker=all`); a worker finds its own index in the metadata
server (`agent-worker-number`), so the command stays identical across workers and reruns.

Worked example (a queued, spot v5e-16 in us-west4-a):

  create_argv(Slice('ptj', 'us-west4-a', 'v5litepod-16', 'v2-alpha-tpuv5-lite', 'spot', True))
  == ['gcloud', 'compute', 'tpus', 'queued-resources', 'create', 'ptj', '--node-id=ptj',
      '--zone=us-west4-a', '--accelerator-type=v5litepod-16',
      '--runtime-version=v2-alpha-tpuv5-lite', '--spot']

Several slices (multislice, over the data-center network) are one queued resource whose nodes
are NAME-0 .. NAME-<N-1> (`--node-count`, `--node-prefix`), as the Cloud TPU multislice guide
makes them; ssh and scp then go through `queued-resources ssh|scp --node=all --worker=all`.
"""
import dataclasses
import re
import shlex

from pretrain_jax import chips

# Accelerator types by family: the sizes (TensorCores for v2-v4 and v5p, chips for v5e/v6e)
# that Cloud TPU sells as one slice (pretrain_jax/chips.py, the one table of chip facts).
KNOWN_TYPES = {c.family: c.sizes for c in chips.CHIPS}
# The TPU VM image each family boots by default (--runtime_version overrides it).
DEFAULT_RUNTIME = {
    'v2': 'tpu-ubuntu2204-base', 'v3': 'tpu-ubuntu2204-base', 'v4': 'tpu-ubuntu2204-base',
    'v5litepod': 'v2-alpha-tpuv5-lite', 'v5p': 'v2-alpha-tpuv5', 'v6e': 'v2-alpha-tpuv6e',
}
PROVISIONING = ('on_demand', 'spot', 'preemptible', 'reserved', 'best_effort')
READY_STATES = frozenset({'READY', 'ACTIVE'})
# States after which the slice never comes back by itself: delete it and create it again.
LOST_STATES = frozenset({'PREEMPTED', 'TERMINATED', 'SUSPENDING', 'SUSPENDED', 'FAILED',
                         'NOT_FOUND'})

CODE_DIR = 'pretrain_jax'  # on every worker, relative to the ssh user's home
LOG_DIR = 'pretrain_jax_logs'
TARBALL = 'pretrain_jax.tar.gz'
LIBTPU_RELEASES = 'https://storage.googleapis.com/jax-releases/libtpu_releases.html'
# The regex matches the command line of the trainer train_command starts (`.venv/bin/python -m
# pretrain_jax.commands.train ...`, relative to the code directory) and nothing else: not a
# shell whose command line holds it (train_command's wrapper, which records the exit code and
# ships the log, or the ssh shell running pkill), nor a trainer some other python runs.
TRAIN_PATTERN = '^[.]venv/bin/python -m pretrain_jax[.]commands[.]train '
WORKER_NUMBER_URL = ('http://metadata.google.internal/computeMetadata/v1/instance/attributes/'
                     'agent-worker-number')


@dataclasses.dataclass(frozen=True)
class Slice:
  name: str
  zone: str
  tpu_type: str = ''  # only create needs it
  runtime_version: str = ''
  provisioning: str = 'on_demand'  # one of PROVISIONING
  queued: bool = False  # a queued resource rather than a plain TPU VM
  project: str = ''  # '' = gcloud's configured project
  slices: int = 1  # > 1: a multislice queued resource of that many nodes of tpu_type

  @property
  def multislice(self) -> bool:
    return self.slices > 1


def known_types_text() -> str:
  return chips.known_types_text()


def tpu_family(tpu_type: str) -> str:
  """'v5litepod-16' -> 'v5litepod' (gcloud's spelling only); ValueError naming the known types
  for anything else."""
  match = re.fullmatch(r'(v\w+?)-(\d+)', tpu_type or '')
  if not match or int(match.group(2)) not in KNOWN_TYPES.get(match.group(1), ()):
    hint = ' (v5e is spelled v5litepod)' if tpu_type.startswith('v5e') else ''
    raise ValueError(f'unknown --tpu_type {tpu_type!r}{hint}; expected one of '
                     f'{known_types_text()}')
  return match.group(1)


def check_target(s: Slice) -> None:
  """ValueError for a name or zone no Cloud TPU can have (every command names both)."""
  if not re.fullmatch(r'[a-z]([-a-z0-9]{0,61}[a-z0-9])?', s.name or ''):
    raise ValueError(f'bad --name {s.name!r}; expected up to 63 lowercase letters, digits and '
                     'dashes, starting with a letter and not ending with a dash')
  if not re.fullmatch(r'[a-z]+-[a-z]+[0-9]+-[a-z]', s.zone or ''):
    raise ValueError(f'bad --zone {s.zone!r}; expected a Cloud TPU zone such as us-west4-a')


def check_slice(s: Slice) -> None:
  """ValueError for a name, zone, type or provisioning model that create would reject."""
  check_target(s)
  tpu_family(s.tpu_type)
  if s.provisioning not in PROVISIONING:
    raise ValueError(f'unknown provisioning {s.provisioning!r}; expected one of {PROVISIONING}')
  if s.queued and s.provisioning == 'preemptible':
    raise ValueError('--preemptible is for plain TPU VMs; a queued resource takes --spot')
  if not s.queued and s.provisioning in ('reserved', 'best_effort'):
    raise ValueError(f'--{s.provisioning} needs --queued (a queued resource)')
  if s.slices < 1 or (s.multislice and not s.queued):
    raise ValueError(f'--slices={s.slices}; expected 1, or several with --queued (multislice '
                     'runs on one queued resource)')


def _tail(s: Slice) -> list:
  return [f'--zone={s.zone}'] + ([f'--project={s.project}'] if s.project else [])


def create_argv(s: Slice) -> list:
  runtime = s.runtime_version or DEFAULT_RUNTIME[tpu_family(s.tpu_type)]
  if s.queued:
    # --best-effort exists only in the alpha track of gcloud.
    track = ['gcloud', 'alpha'] if s.provisioning == 'best_effort' else ['gcloud']
    flag = {'spot': ['--spot'], 'reserved': ['--reserved'],
            'best_effort': ['--best-effort']}.get(s.provisioning, [])
    nodes = ([f'--node-count={s.slices}', f'--node-prefix={s.name}'] if s.multislice
             else [f'--node-id={s.name}'])
    return (track + ['compute', 'tpus', 'queued-resources', 'create', s.name] + nodes + _tail(s) +
            [f'--accelerator-type={s.tpu_type}', f'--runtime-version={runtime}'] + flag)
  flag = {'spot': ['--spot'], 'preemptible': ['--preemptible']}.get(s.provisioning, [])
  return (['gcloud', 'compute', 'tpus', 'tpu-vm', 'create', s.name] + _tail(s) +
          [f'--accelerator-type={s.tpu_type}', f'--version={runtime}'] + flag)


def describe_argv(s: Slice) -> list:
  """The slice's own record: the queued resource, or the TPU VM."""
  kind = 'queued-resources' if s.queued else 'tpu-vm'
  return ['gcloud', 'compute', 'tpus', kind, 'describe', s.name] + _tail(s) + ['--format=json']


def node_describe_argv(s: Slice) -> list:
  """The TPU VM record (networkEndpoints: one per worker), also for a queued resource's node
  (the first slice's, NAME-0, of a multislice one: every slice has as many workers)."""
  node = f'{s.name}-0' if s.multislice else s.name
  return ['gcloud', 'compute', 'tpus', 'tpu-vm', 'describe', node] + _tail(s) + ['--format=json']


def accelerator_type(description: dict) -> str:
  """The accelerator type in a TPU VM's or a queued resource's record ('' when absent)."""
  if isinstance(description.get('acceleratorType'), str):
    return description['acceleratorType']
  specs = (description.get('tpu') or {}).get('nodeSpec') or [{}]
  node = (specs[0] or {}).get('node') or {}
  return node.get('acceleratorType', '') if isinstance(node, dict) else ''


LOCK_FILE = 'LOCK'   # the workdir lock's object (pretrain_jax.run.lock.LOCK_FILE)


def lock_path(workdir: str) -> str:
  return f'{workdir.rstrip("/")}/{LOCK_FILE}'


def unlock_argv(workdir: str) -> list:
  """Removes a gs:// workdir's LOCK (a deleted slice's trainer can no longer release it)."""
  return ['gcloud', 'storage', 'rm', lock_path(workdir), '--quiet']


def delete_argv(s: Slice) -> list:
  if s.queued:  # --force deletes the node along with the request
    return ['gcloud', 'compute', 'tpus', 'queued-resources', 'delete', s.name] + _tail(s) + [
        '--force', '--quiet']
  return ['gcloud', 'compute', 'tpus', 'tpu-vm', 'delete', s.name] + _tail(s) + ['--quiet']


# --quiet: no prompts (the first ssh makes a key without a passphrase), since launcher.py
# captures gcloud's output and a prompt there would hang unseen.
def _on(s: Slice, verb: str, worker, node) -> tuple:
  """(the command's words, its target flags): a TPU VM's, or every node's of a multislice."""
  if s.multislice:
    return (['gcloud', 'compute', 'tpus', 'queued-resources', verb],
            [f'--node={node}', f'--worker={worker}'])
  return ['gcloud', 'compute', 'tpus', 'tpu-vm', verb], [f'--worker={worker}']


def scp_argv(s: Slice, local: str, remote: str, worker='all') -> list:
  words, target = _on(s, 'scp', worker, 'all')
  return words + [local, f'{s.name}:{remote}'] + _tail(s) + target + ['--quiet']


def ssh_argv(s: Slice, command: str, worker='all', node='all') -> list:
  """`command` on `worker` (of `node`, the slice's index, in a multislice) or all of them."""
  words, target = _on(s, 'ssh', worker, node)
  return words + [s.name] + _tail(s) + target + ['--quiet', f'--command={command}']


def archive_argv(repo_root: str, tarball: str) -> list:
  """The committed tree (HEAD) as a tarball: what setup ships."""
  return ['git', '-C', repo_root, 'archive', '--format=tar.gz', f'--output={tarball}', 'HEAD']


def slice_state(description: dict, queued: bool) -> str:
  """`state` of a TPU VM, `state.state` of a queued resource ('' when absent)."""
  state = description.get('state', '')
  if queued and isinstance(state, dict):
    state = state.get('state', '')
  return state if isinstance(state, str) else ''


def worker_count(node: dict) -> int:
  """One worker (host) per network endpoint of the TPU VM record."""
  endpoints = node.get('networkEndpoints') or []
  if not endpoints:
    raise ValueError(f'TPU VM {node.get("name", "?")!r} lists no networkEndpoints; expected one '
                     'per worker (is it READY?)')
  return len(endpoints)


def pinned_jax_version(requirements_text: str) -> str:
  """The version in requirements.txt's `jax==X` line, for jax[tpu]==X on the workers."""
  match = re.search(r'^\s*jax\s*==\s*([\w.]+)\s*$', requirements_text, re.MULTILINE)
  if not match:
    raise ValueError('requirements.txt pins no jax version; expected a line like jax==0.10.2')
  return match.group(1)


def setup_command(jax_version: str, python='python3') -> str:
  """Unpack the tarball over the code dir (keeping .venv), make the venv, install jax[tpu]."""
  if not re.fullmatch(r'python3(\.\d+)?', python):
    raise ValueError(f'bad --python {python!r}; expected python3 or python3.X (e.g. python3.11)')
  venv = f'{python} -m venv .venv'
  return ' && '.join([
      f'mkdir -p ~/{CODE_DIR}',
      f'find ~/{CODE_DIR} -mindepth 1 -maxdepth 1 ! -name .venv -exec rm -rf {{}} +',
      f'tar -xzf ~/{TARBALL} -C ~/{CODE_DIR}',
      f'cd ~/{CODE_DIR}',
      # TPU VM images may lack the venv module (Ubuntu packages it as python3[.X]-venv).
      f'({venv} || (sudo apt-get update -q && sudo apt-get install -y -q {python}-venv && '
      f'{venv} --clear))',
      '.venv/bin/pip install -q -r requirements.txt',
      f'.venv/bin/pip install -q {shlex.quote(f"jax[tpu]=={jax_version}")} '
      f'-f {LIBTPU_RELEASES}',
  ])


def stop_command(grace_s=60) -> str:
  """SIGTERM the trainer (it saves a checkpoint), then free the TPU from anything holding it."""
  return '; '.join([
      f"pkill -TERM -f '{TRAIN_PATTERN}'",
      f"for i in $(seq {grace_s}); do pgrep -f '{TRAIN_PATTERN}' > /dev/null || break; "
      'sleep 1; done',
      f"pkill -KILL -f '{TRAIN_PATTERN}'",
      'sudo lsof -t /dev/accel* /dev/vfio/* 2> /dev/null | xargs -r sudo kill -9',
      'sudo rm -f /tmp/libtpu_lockfile',
      'true',
  ])


def workdir_of(train_args) -> str:
  """The value of --workdir in the train command's arguments ('' when absent)."""
  return flag_of(train_args, 'workdir')


def flag_of(train_args, name: str) -> str:
  """The value of --name (`--name V` or `--name=V`) in the train command's arguments ('' when
  absent)."""
  for i, arg in enumerate(train_args):
    if arg.startswith(f'--{name}='):
      return arg.split('=', 1)[1]
    if arg == f'--{name}' and i + 1 < len(train_args):
      return train_args[i + 1]
  return ''


def train_command(train_args, multislice: bool = False) -> str:
  """Start `pretrain-jax train --multihost` detached (nohup: survives the ssh session).

  Its output goes to ~/pretrain_jax_logs/worker.log, its exit code to .../EXIT. With a gs://
  --workdir, the log is also copied to <workdir>/logs/worker_<i>.log every minute and at exit
  (`multislice`: worker_<hostname>.log, as every slice numbers its workers from 0).
  """
  args = list(train_args) + ([] if '--multihost' in train_args else ['--multihost'])
  log, exit_file = f'$HOME/{LOG_DIR}/worker.log', f'$HOME/{LOG_DIR}/EXIT'
  workdir = workdir_of(train_args)
  ship = ''
  if workdir.startswith('gs://'):
    who = '$(hostname)' if multislice else '$W'
    dest = shlex.quote(workdir.rstrip('/') + '/logs') + f'/worker_{who}.log'
    copy = f'gcloud storage cp "{log}" {dest} > /dev/null 2>&1'
    ship = f'( while sleep 60; do {copy}; done ) & SHIP=$!; '
  script = (
      f'W=$(curl -sf -H Metadata-Flavor:Google {WORKER_NUMBER_URL} || echo 0); {ship}'
      f'echo "== $(date -u) worker $W: training starts" >> "{log}"; '
      f'PYTHONUNBUFFERED=1 .venv/bin/python -m pretrain_jax.commands.train {shlex.join(args)} '
      f'>> "{log}" 2>&1; '
      'CODE=$?; ' + (f'pkill -P $SHIP; kill $SHIP 2> /dev/null; {copy}; ' if ship else '')
      + f'echo $CODE > "{exit_file}"')
  return (f'mkdir -p ~/{LOG_DIR} && cd ~/{CODE_DIR} && rm -f ~/{LOG_DIR}/EXIT && '
          f'nohup bash -c {shlex.quote(script)} > /dev/null 2>&1 < /dev/null &')


def probe_command() -> str:
  """Prints TRAIN=RUNNING, TRAIN=EXIT:<code> or TRAIN=IDLE (never started) on each worker."""
  return (f"if pgrep -f '{TRAIN_PATTERN}' > /dev/null; then echo TRAIN=RUNNING; "
          f'elif [ -f ~/{LOG_DIR}/EXIT ]; then echo TRAIN=EXIT:$(cat ~/{LOG_DIR}/EXIT); '
          'else echo TRAIN=IDLE; fi')


def parse_probe(stdout: str) -> list:
  """probe_command's output from all workers -> ['RUNNING' | 'IDLE' | exit code (int), ...]."""
  found = re.findall(r'TRAIN=(RUNNING|IDLE|EXIT:(-?\d+))', stdout)
  return [int(code) if code else word for word, code in found]


def logs_command(follow=False, lines=100) -> str:
  return f'tail -n {int(lines)} {"-F " if follow else ""}~/{LOG_DIR}/worker.log'
