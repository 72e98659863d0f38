r"""Cloud TPU VM slices through `gcloud`: create, ship the code, train, watch, recover, delete.

  pretrain-jax tpu create --name ptj --zone us-west4-a --tpu_type v5litepod-16 --spot
  pretrain-jax tpu setup  --name ptj --zone us-west4-a
  pretrain-jax tpu run    --name ptj --zone us-west4-a --tpu_type v5litepod-16 --spot \
      --watch -- --config gpt2_small --workdir gs://my-bucket/runs/gpt2
  pretrain-jax tpu status|stop|delete --name ptj --zone us-west4-a
  pretrain-jax tpu logs   --name ptj --zone us-west4-a [--worker 1] [--follow]

create makes a TPU VM (or with --queued a queued resource) and waits until it is READY / ACTIVE.
setup ships the committed HEAD (git archive) to every worker, makes ~/pretrain_jax/.venv and
installs requirements.txt plus jax[tpu] of the pinned jax version. run stops anything holding
the TPU, then starts `pretrain-jax train <args after --> --multihost` on every worker under nohup
(log: ~/pretrain_jax_logs/worker.log; with a gs:// --workdir also <workdir>/logs/worker_<i>.log).
run --watch then polls the slice: when it is preempted (or gone) it deletes it, creates it
again, reruns setup and the identical command (train resumes from the workdir's latest
checkpoint), at most --max_retries times with exponential backoff; it returns when training has
exited 0 on every worker. --dry_run prints the commands (one per line) and runs none of them.

Before run starts anything it compiles the run for its accelerator type (--tpu_type, else the
slice's own) with the TPU compiler, on this machine (`pretrain-jax plan`, which needs libtpu:
pip install 'pretrain_jax[tpu]'): a config that does not fit is refused in one line naming the
largest batch that does. --nopreflight skips it. --slices N (with --queued) makes and runs N
slices of --tpu_type as one multislice queued resource (nodes NAME-0 .. NAME-<N-1>), joined
over the data-center network: the batch splits over the slices (the mesh's `dcn` axis).
Progress goes to stderr; stdout ends with one JSON line. Errors are one line: exit 2 for bad
input or a missing gcloud, 1 for a failed gcloud command or a watch that gave up.
"""
import json
import os
import re
import subprocess
import sys

from absl import app, flags

import configs
from pretrain_jax import cli
from pretrain_jax.cli import terminal
from pretrain_jax.cloud import gcloud, launcher

COMMANDS = ('create', 'setup', 'run', 'status', 'logs', 'stop', 'delete')

_NAME = flags.DEFINE_string('name', None, 'TPU VM (and queued resource) name')
_ZONE = flags.DEFINE_string('zone', None, 'e.g. us-west4-a (v5e), us-east5-b (v6e)')
_PROJECT = flags.DEFINE_string('project', '', "GCP project (default: gcloud's configured one)")
_TPU_TYPE = flags.DEFINE_string('tpu_type', '', 'create, run --watch: accelerator type, '
                                'e.g. v5litepod-16, v4-32, v6e-8')
_RUNTIME = flags.DEFINE_string('runtime_version', '', 'TPU VM image (default: by TPU family, '
                               'e.g. v2-alpha-tpuv5-lite for v5litepod)')
_QUEUED = flags.DEFINE_bool('queued', False, 'a queued resource instead of a plain TPU VM')
_SPOT = flags.DEFINE_bool('spot', False, 'Spot capacity (can be preempted at any time)')
_PREEMPTIBLE = flags.DEFINE_bool('preemptible', False, 'preemptible TPU VM (not with --queued)')
_RESERVED = flags.DEFINE_bool('reserved', False, 'with --queued: use a reservation')
_BEST_EFFORT = flags.DEFINE_bool('best_effort', False,
                                 'with --queued: best-effort capacity (gcloud alpha)')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'print the commands, run none of them')
_WATCH = flags.DEFINE_bool('watch', False, 'run: re-create and rerun after preemption, '
                           'return when training exits')
_MAX_RETRIES = flags.DEFINE_integer('max_retries', 3, 'run --watch: re-creations before giving up',
                                    lower_bound=0)
_BACKOFF_S = flags.DEFINE_float('backoff_s', 60, 'run --watch: wait before re-creation i is '
                                'backoff_s * 2**(i-1)', lower_bound=0)
_WATCH_INTERVAL_S = flags.DEFINE_float('watch_interval_s', 60,
                                       'run --watch: seconds between checks', lower_bound=0)
_POLL_INTERVAL_S = flags.DEFINE_float('poll_interval_s', 10, 'create: seconds between describes',
                                      lower_bound=0)
_MAX_POLLS = flags.DEFINE_integer('max_polls', 360, 'create: describes before giving up waiting',
                                  lower_bound=1)
_WORKER = flags.DEFINE_integer('worker', 0, 'logs: which worker', lower_bound=0)
_FOLLOW = flags.DEFINE_bool('follow', False, 'logs: keep streaming (tail -F)')
_LINES = flags.DEFINE_integer('lines', 100, 'logs: lines of history', lower_bound=0)
_PYTHON = flags.DEFINE_string('python', 'python3', 'setup: the workers\' python for the venv')
_SLICES = flags.DEFINE_integer('slices', 1, 'with --queued: slices of --tpu_type in one '
                               'multislice queued resource', lower_bound=1)
_PREFLIGHT = flags.DEFINE_bool('preflight', True, 'run: compile the run for the accelerator '
                               'type first and refuse a config that does not fit')

TRAIN_ARGS = []  # what follows `--` on the command line


def provisioning() -> str:
  chosen = [name for name, flag in (('spot', _SPOT), ('preemptible', _PREEMPTIBLE),
                                    ('reserved', _RESERVED), ('best_effort', _BEST_EFFORT))
            if flag.value]
  if len(chosen) > 1:
    raise ValueError(f'choose at most one of --spot, --preemptible, --reserved, --best_effort; '
                     f'got {", ".join("--" + c for c in chosen)}')
  return chosen[0] if chosen else 'on_demand'


def run_command(command: str, argv) -> dict:
  if command not in COMMANDS:
    raise ValueError(f'unknown command {command!r}; expected one of {", ".join(COMMANDS)}')
  if argv:
    raise ValueError(f'unexpected arguments {argv}; the arguments of pretrain-jax train go '
                     'after --')
  if TRAIN_ARGS and command != 'run':
    raise ValueError(f'only run takes arguments after --; got {TRAIN_ARGS} for {command}')
  tpu = gcloud.Slice(_NAME.value, _ZONE.value, _TPU_TYPE.value, _RUNTIME.value, provisioning(),
                     _QUEUED.value, _PROJECT.value, _SLICES.value)
  if command == 'create' or (command == 'run' and _WATCH.value):
    gcloud.check_slice(tpu)  # the whole recipe: --watch may have to create it again
  else:
    gcloud.check_target(tpu)
    if tpu.multislice and not tpu.queued:
      raise ValueError(f'--slices={tpu.slices} needs --queued (multislice runs on one queued '
                       'resource)')
  if command == 'run':   # before any gcloud command: run first stops what the slice runs
    check_train_args(TRAIN_ARGS)
  runner = (launcher.dry_runner() if _DRY_RUN.value
            else launcher.subprocess_runner(launcher.find_gcloud()))
  job = launcher.Launcher(
      tpu, runner, dry_run=_DRY_RUN.value, poll_interval_s=_POLL_INTERVAL_S.value,
      max_polls=_MAX_POLLS.value, watch_interval_s=_WATCH_INTERVAL_S.value,
      max_retries=_MAX_RETRIES.value, backoff_s=_BACKOFF_S.value, python=_PYTHON.value,
      preflight=preflight(TRAIN_ARGS, tpu.slices) if _PREFLIGHT.value else None)
  if command == 'run':
    return job.run(TRAIN_ARGS, watch=_WATCH.value)
  if command == 'logs':
    return job.logs(_WORKER.value, _FOLLOW.value, _LINES.value)
  return getattr(job, command)()


def _run(argv):
  if len(argv) < 2:
    print(f'error: expected a command, one of {", ".join(COMMANDS)}', file=sys.stderr)
    sys.exit(2)
  try:
    result = run_command(argv[1], argv[2:])
  except ValueError as e:  # bad input
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  except launcher.LaunchError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2 if 'not found on PATH' in str(e) else 1)
  except KeyboardInterrupt:
    sys.exit(130)
  if _DRY_RUN.value:
    result['dry_run'] = True
  terminal.finish(result)


def check_train_args(args) -> None:
  """What would fail on every worker after the setup, refused here: tpu's own flags after
  `--`, no --config or a config file the repository lacks, a workdir outside Cloud Storage (the
  workers share nothing else, and a preempted worker loses its disk), and whatever train's
  own parsing refuses (unknown flags, overrides of missing fields, values that do not parse or
  that the config's sections refuse):
  `pretrain-jax train ARGS --multihost --check_args` runs here first.
  """
  own = {v.name for v in globals().values() if isinstance(v, flags.FlagHolder)}
  ours = sorted({a.split('=', 1)[0] for a in args if a.startswith('--') and (
      a[2:].split('=', 1)[0] in own or a[2:].removeprefix('no') in own)})
  if ours:
    raise ValueError(f'{", ".join(ours)} after -- would go to pretrain-jax train; expected '
                     "tpu's own flags before -- (e.g. run --watch -- --config ...)")
  workdir, config_arg = gcloud.workdir_of(args), gcloud.flag_of(args, 'config')
  if not workdir or not config_arg:
    raise ValueError(f'pretrain-jax train arguments {args} need --config and --workdir; e.g. -- '
                     '--config gpt2_small --workdir gs://my-bucket/runs/gpt2')
  bucket = workdir[5:].split('/', 1)[0] if workdir.startswith('gs://') else ''
  if not bucket:
    raise ValueError(f'--workdir {workdir} is not in a Cloud Storage bucket; expected '
                     'gs://BUCKET/... (the workers share only Cloud Storage, and a preempted '
                     'worker loses its disk)')
  if not re.fullmatch(r'[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]', bucket):
    raise ValueError(f'--workdir {workdir}: {bucket!r} is not a valid Cloud Storage bucket '
                     'name; expected 3-222 lowercase letters, digits, -, _ and ., starting and '
                     'ending with a letter or digit')
  path = config_arg.partition(':')[0]
  if not os.path.exists(os.path.join(launcher.REPO_ROOT, path)) and path in configs.config_names():
    path = os.path.join('configs', f'{path}.py')   # a named config: the shipped configs/ file
  full = path if os.path.isabs(path) else os.path.join(launcher.REPO_ROOT, path)
  root = os.path.abspath(launcher.REPO_ROOT)
  if not os.path.isfile(full) or os.path.commonpath([root, os.path.abspath(full)]) != root:
    raise ValueError(f'--config {config_arg}: no such file in {launcher.REPO_ROOT}; expected a '
                     'config the repository ships, such as configs/gpt2_small.py or gpt2_small')
  status = subprocess.run(['git', '-C', root, 'status', '--porcelain', '--ignored', '--',
                           os.path.relpath(full, root)], capture_output=True, text=True,
                          check=False).stdout[:2]   # '' when committed as it is
  if status in ('??', '!!'):
    raise ValueError(f'--config {config_arg} is not committed; setup ships the committed HEAD, '
                     'so the workers would not have it: commit it (then run setup again)')
  if status.strip():
    raise ValueError(f'--config {config_arg} has uncommitted changes; setup ships the committed '
                     'HEAD, so the workers would run its committed version: commit them (then '
                     'run setup again)')
  check = subprocess.run(
      [sys.executable, '-m', 'pretrain_jax.commands.train', *args, '--multihost',
       '--check_args'], cwd=launcher.REPO_ROOT, capture_output=True, text=True, check=False)
  if check.returncode:
    why = (check.stderr.strip().splitlines() or [f'exit {check.returncode}'])[-1]
    raise ValueError(f'pretrain-jax train refuses these arguments: {why.removeprefix("error: ")}')


def plan_args(train_args) -> list:
  """The arguments of pretrain-jax train that pretrain-jax plan reads: --config and its
  --config.FIELD overrides."""
  out, take = [], False
  for arg in train_args:
    if take:
      out.append(arg)
    take = arg == '--config' or (arg.startswith('--config.') and '=' not in arg)
    if arg == '--config' or arg.startswith(('--config=', '--config.')):
      out.append(arg)
  return out


def preflight(train_args, slices: int):
  """The launcher's check of an accelerator type: `pretrain-jax plan` of the run for it, here;
  refuses (ValueError) a run that does not fit, naming the largest batch that does."""
  def check(tpu_type: str) -> None:
    if not tpu_type:
      print('preflight: skipped, the accelerator type is not known yet (pass --tpu_type)',
            file=sys.stderr, flush=True)
      return
    argv = [sys.executable, '-m', 'pretrain_jax.commands.plan', *plan_args(train_args),
            f'--topology={tpu_type}', f'--slices={slices}', '--fit_if_refused']
    print(f'preflight: compiling the run for {slices} x {tpu_type} (pretrain-jax plan) ...',
          file=sys.stderr, flush=True)
    done = subprocess.run(argv, cwd=launcher.REPO_ROOT, capture_output=True, text=True,
                          check=False)
    if done.returncode:
      why = (done.stderr.strip().splitlines() or [f'exit {done.returncode}'])[-1]
      raise ValueError(f'preflight: pretrain-jax plan could not compile the run for {tpu_type}: '
                       f'{why.removeprefix("error: ")} (--nopreflight skips this check)')
    result = json.loads(done.stdout.strip().splitlines()[-1])
    per_chip = result.get('hbm_bytes_per_chip')
    if result['fits']:
      print(f'preflight: fits {slices} x {tpu_type} at batch {result["batch_size"]} '
            f'({per_chip / 2**30:.2f} GiB per chip)', file=sys.stderr, flush=True)
      return
    best = result.get('max_batch_size', 0)
    fix = (f'the largest that fits is {best} (--config.train.batch_size={best})' if best else
           'no batch fits: shard the model (config.mesh.fsdp / tensor), remat, or a larger chip')
    raise ValueError(f'train.batch_size={result["batch_size"]} does not fit {slices} x '
                     f'{tpu_type} (the TPU compiler ran out of HBM); {fix}; --nopreflight '
                     'skips this check')
  return check


def split_train_args(args):
  """sys.argv -> (tpu's own argv, the train arguments after the first `--`)."""
  if '--' not in args:
    return list(args), []
  i = args.index('--')
  return list(args[:i]), list(args[i + 1:])


def main(argv=None) -> None:
  own, TRAIN_ARGS[:] = split_train_args(sys.argv if argv is None else argv)
  app.run(_run, argv=own, flags_parser=cli.parse_flags)


if __name__ == '__main__':
  main()
