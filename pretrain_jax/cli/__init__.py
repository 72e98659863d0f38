"""What every command shares (commands/__init__.py imports it first; each command ends with
`cli.run(main)`): quiet library logs, and a user error (a bad flag, config value or path, a
damaged checkpoint, a held workdir) as one `error: <what, the value, what is expected>` line
and exit 2. `--verbose` restores the libraries' INFO logs and every traceback.

  process.py         glibc malloc and library env settings, applied at import (`process.start`)
  terminal.py        how a command ends: a summary on stderr, one JSON line on stdout
  finetune_flags.py  the flags finetune and transfer share
"""
import argparse
import asyncio
import inspect
import logging as py_logging
import os
import re
import sys
import threading
import traceback
import warnings

from absl import app, flags, logging

import configs
from pretrain_jax import paths
from pretrain_jax.cli import process

# At import: process.start() must run before any thread starts (glibc's arena limit binds only
# later threads) and before TensorFlow loads (it reads its log settings then).
process.start()

# Exception types that carry a message for the user (the library raises these for bad input).
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError,
               IsADirectoryError, PermissionError, FloatingPointError)
USER_ERROR_NAMES = ('LockHeld', 'CheckpointError', 'CheckpointSaveError', 'UsageError',
                    'PathError', 'PeerError')
CONFIG_HELP = 'a config name (gpt2_small) or file (configs/NAME.py)'
CONFIG_KINDS = {   # a config file's kind: (the keys that mark it, the commands that read it)
    'fine-tuning': (('init', 'mode', 'task'), 'finetune, transfer'),   # (has model/data/train)
    'chapter experiment': (('corpus', 'gpt', 'bert'), 'shakespeare'),
    'pre-training': (('model', 'data', 'train'), 'train, describe, benchmark'),
}
_CONFIG_TRACEBACK = 'Error whilst parsing config file:'   # ml_collections: get_config raised
_JOINED = []   # non-empty once join_processes succeeded: this process is one of several
_ANNOUNCE = []   # share_stops's announce(line): tells the other processes this one stops
_STOPPING = threading.Lock()   # held by whichever of an error and a peer's notice stops first
_PEER_GONE = ('Connection reset by peer', 'Connection closed by peer',   # gloo's (CPU) texts:
              'Gloo context initialization failed')  # a peer gone before the first collective


def is_user_error(error: BaseException) -> bool:
  return isinstance(error, USER_ERRORS) or type(error).__name__ in USER_ERROR_NAMES


def one_line(error: BaseException) -> str:
  """`error: ...` with the message's lines joined (a long message stays one line)."""
  return f'error: {" ".join(str(error).split()) or type(error).__name__}'


def _fail(line: str) -> None:
  """A bad command line, found before main runs: the line on stderr, exit 2."""
  print(line, file=sys.stderr)
  sys.exit(2)


def argument_parser(description: str, **kw):
  """argparse.ArgumentParser whose errors are one `error: ...; see --help` line, exit 2."""

  class Parser(argparse.ArgumentParser):
    def error(self, message):
      _fail(f'error: {message}; see --help')
  return Parser(description=description, **kw)


def quiet(verbose: bool) -> None:
  """absl (orbax, tfds) and Python warnings at ERROR unless verbose."""
  if verbose:
    logging.set_verbosity(logging.INFO)
    py_logging.getLogger('pretrain_jax').setLevel(py_logging.INFO)   # e.g. each skipped record
    return
  logging.set_verbosity(logging.ERROR)
  for name in ('absl', 'orbax', 'jax', 'tensorflow', 'tensorflow_datasets'):
    py_logging.getLogger(name).setLevel(py_logging.ERROR)
  # A failed checkpoint read leaves orbax's other reads' coroutines and futures to report
  # themselves (thousands of lines) around the one line that says what happened.
  py_logging.getLogger('asyncio').setLevel(py_logging.CRITICAL)
  sys.unraisablehook = _quiet_unraisable
  warnings.filterwarnings('ignore', category=DeprecationWarning)
  warnings.filterwarnings('ignore', category=UserWarning, module='orbax')


def _quiet_unraisable(unraisable) -> None:
  """sys.unraisablehook without the asyncio leftovers of abandoned library coroutines."""
  error, leftover = unraisable.exc_value, unraisable.object
  if not (isinstance(error, RuntimeError) and 'Event loop is closed' in str(error)
          or inspect.iscoroutine(leftover) or isinstance(leftover, asyncio.Future)):
    sys.__unraisablehook__(unraisable)


def use_cpu_devices(count: int) -> None:
  """Splits the host CPU into `count` XLA devices (0: leave it), before JAX starts its backends;
  a device count already in XLA_FLAGS wins, and GPU/TPU backends keep their devices."""
  if not isinstance(count, int) or count < 0:
    raise ValueError(f'cpu_devices={count!r}; expected 0 (leave it) or a device count')
  xla_flags = os.environ.get('XLA_FLAGS', '')
  if count and 'xla_force_host_platform_device_count' not in xla_flags:
    process.keep_freed_memory(count)   # arenas for `count` devices, while no thread took one
    os.environ['XLA_FLAGS'] = (f'{xla_flags} --xla_force_host_platform_device_count={count}'
                               .strip())
    import jax  # noqa: PLC0415 (start-up order: cli loads before JAX)
    if jax.default_backend() == 'cpu' and jax.local_device_count() != count:
      raise ValueError(f'cpu_devices={count} came too late: JAX already runs on '
                       f'{jax.local_device_count()} CPU device(s); set XLA_FLAGS='
                       f'--xla_force_host_platform_device_count={count} before starting')


def unknown_override(argv, error) -> str:
  """One line for ml_collections' error on `--config.a.b=v` when the config has no `b`:
  the flag as given, the missing field and ml_collections' suggestion, if any."""
  text = str(error).replace('\\n', ' ')
  found = re.search(r"'([^'\\ ]+)", text)
  field = found.group(1) if found else '?'
  hint = re.search(r'Did you mean "([^"]+)"', text)
  given = next((a for a in argv[1:] if a.startswith('--') and
                field in a.split('=', 1)[0].lstrip('-').split('.')[1:]), field)
  return (f'error: {given}: the config has no field {field!r}'
          + (f' (did you mean {hint.group(1)!r}?)' if hint else '')
          + '; expected a key that the config file defines')


def define(define_flags):
  """define_flags() for flags that read a default config file when defined (ml_collections
  applies the command line's overrides then, before parse_flags)."""
  try:
    return define_flags()
  except (AttributeError, KeyError) as e:
    _fail(unknown_override(sys.argv, e))


def config_variant_error(text: str) -> str:
  """ml_collections' 'flag --config=FILE:ARG: Error whilst parsing config file: Traceback ...
  TypeError: ...' -> one line: the flag and the last line of the traceback (the error)."""
  flag = text.split(': ' + _CONFIG_TRACEBACK)[0].removeprefix('flag ')
  error = [line.strip() for line in text.splitlines() if line.strip()][-1]
  if 'get_config() takes 0 positional arguments' in error:
    error = ("this config file takes no ':variant'; expected "
             f"{flag.split('=', 1)[0]}={flag.split('=', 1)[-1].rsplit(':', 1)[0]}")
  else:
    error = error.split(': ', 1)[-1] if re.match(r'[\w.]+(Error|Exception): ', error) else error
  return f'error: {flag}: {error}'


def parse_flags(argv):
  """absl's flag parsing (an absl.app flags_parser), with a parse error as one line, exit 2."""
  try:
    rest = flags.FLAGS(argv)
  except SystemExit as e:   # absl's --help / --helpfull print the usage, then exit 1
    asked = {'--help', '-h', '-?', '--helpshort', '--helpfull', '--helpxml'} & set(argv[1:])
    sys.exit(0 if asked and e.code == 1 else e.code)
  except flags.Error as e:
    traced = _CONFIG_TRACEBACK in str(e) and 'Traceback' in str(e)
    _fail(config_variant_error(str(e)) if traced else f'{one_line(e)}; see --helpshort')
  except (AttributeError, KeyError) as e:   # ml_collections: an override of a missing field
    _fail(unknown_override(argv, e))
  except SyntaxError as e:                  # --config=FILE that is not Python
    _fail(f'error: {e.filename}: not a config file ({e.msg}, line {e.lineno}); expected a '
          'Python config file such as configs/tiny_gpt.py')
  for name in flags.FLAGS:   # ml_collections defers a config file's load error to first use
    flag = flags.FLAGS[name]
    if type(flag).__name__ != '_ConfigFlag' or not flag.present:
      continue
    try:
      if not hasattr(flag.value, 'unlock'):   # a file that failed to load raises OSError here
        raise TypeError(f'get_config() returned a {type(flag.value).__name__}, not an '
                        'ml_collections.ConfigDict')
    except Exception as e:
      path = flag.config_filename
      found = os.path.exists(path.split(':')[0])  # noqa: TID251 (config files are local modules)
      reason = one_line(e.__cause__ or e)[7:] if found else 'no such file'
      _fail(f'error: --{name}={path}: {reason}; expected a config file such as '
            'configs/tiny_gpt.py (the configs/ directory lists them)')
  return rest


def config_of(holder, kind: str):
  """The config a DEFINE_config_file flag loaded; a ValueError when it is of another kind than
  the command reads (e.g. `describe --config configs/finetune.py`)."""
  config = holder.value
  actual = next((k for k, (keys, _) in CONFIG_KINDS.items() if all(x in config for x in keys)),
                None)
  if actual == kind:
    return config
  what = (f'a {actual} config (read by {CONFIG_KINDS[actual][1]})' if actual else
          'not a config of any command (no ' + ', '.join(
              k for k in CONFIG_KINDS[kind][0] if k not in config) + ' section)')
  raise ValueError(f'--{holder.name}={flags.FLAGS[holder.name].config_filename} is {what}; '
                   f'expected a {kind} config (read by {CONFIG_KINDS[kind][1]}; '
                   'docs/training.md lists them)')


def join_processes(address, num_processes, process_id, timeout_s: float) -> None:
  """jax.distributed.initialize with a deadline of our own: at its own, JAX aborts in C++ (a
  native stack, nothing a user can act on). The watchdog says what was waited for, exits 2."""
  import jax  # noqa: PLC0415 (start-up order: cli loads before JAX)
  joined = threading.Event()

  def watchdog():
    if joined.wait(timeout_s):
      return
    count = f'not all {num_processes} processes' if num_processes else 'not every process'
    where = f'the coordinator {address}' if address else 'the detected coordinator'
    print(f'error: --multihost: {count} joined {where} within {timeout_s:g} s '
          '(--init_timeout); expected the same command running on every host, with the same '
          '--coordinator_address and --num_processes, each --process_id once, and the '
          "coordinator's port reachable from every host", file=sys.stderr, flush=True)
    os._exit(2)  # JAX's wait cannot be interrupted

  threading.Thread(target=watchdog, name='join_processes_watchdog', daemon=True).start()
  # JAX's preemption service installs a C-level SIGTERM handler that only records the notice
  # for a sync point nothing here reaches: the loop's and the start-up handlers serve SIGTERM.
  jax.config.update('jax_enable_preemption_service', False)
  try:
    jax.distributed.initialize(address, num_processes, process_id,
                               initialization_timeout=int(timeout_s) + 60)
  finally:
    joined.set()
  _JOINED.append(True)


def share_stops(announce, watch) -> None:
  """In a multi-process run: `announce(line)` leaves this process's error line for the others
  before it exits, and `watch(fn)` has another process's line end this one's wait (fn prints
  it and exits 2): a peer refusing its flags stops the run at once, not after gloo's timeout."""
  _ANNOUNCE[:] = [announce]
  watch(_peer_stopped)


def _gone(reason: str) -> str:
  return ('error: another process of this multi-process run stopped or was killed '
          f'({" ".join(reason.split())[:300]}); see its log, then rerun the same command '
          'on every host: it resumes from the newest complete checkpoint')


def _peer_stopped(notice: str) -> None:
  """From the watching thread: the main thread waits in a collective that cannot be left."""
  if _STOPPING.acquire(blocking=False):   # else this process is stopping with its own error
    print(_gone(notice), file=sys.stderr, flush=True)
    _exit(2)


def _exit(code: int) -> None:
  """sys.exit; once several processes joined, os._exit: JAX's exit handler would wait minutes
  for every process, so one host's error would hold the slice (the others' collectives fail)."""
  if not _JOINED:
    sys.exit(code)
  sys.stdout.flush()
  sys.stderr.flush()
  paths.remove_staged()           # what the atexit handler would have done
  os._exit(code)


def call(fn, *args, verbose: bool = False):
  """fn(*args) with quiet logs; a user error becomes one `error:` line and exit 2."""
  quiet(verbose)
  try:
    return fn(*args)
  except SystemExit as e:   # in a multi-process run, not through JAX's exit barrier either
    if _JOINED:
      _exit(0 if e.code is None else e.code if isinstance(e.code, int) else 1)
    raise
  except KeyboardInterrupt:
    if verbose:
      raise
    print('interrupted (Ctrl-C)', file=sys.stderr, flush=True)
    _exit(130)
  except Exception as e:
    gone = bool(_JOINED) and any(s in str(e) for s in _PEER_GONE)   # a collective's peer
    if verbose or not (gone or is_user_error(e)):
      if not _JOINED:
        raise
      traceback.print_exc()
      _exit(1)
    line = _gone(str(e)) if gone else one_line(e)
    if _JOINED:   # a peer's notice being printed exits this process first
      _STOPPING.acquire()
    print(line, file=sys.stderr, flush=True)
    if _ANNOUNCE and not gone:
      _ANNOUNCE[0](line)
    _exit(2)


def run(main, argv=None, positional: bool = False) -> None:
  """absl.app.run(main) on argv (default sys.argv) with quiet logs, `--verbose`, named configs
  and one-line user errors. Arguments that are not flags are refused unless `positional` (main
  reads them): absl hands them to main, where `del argv` dropped them without a word."""
  if 'verbose' not in flags.FLAGS:
    flags.DEFINE_bool('verbose', False, 'show library logs and full tracebacks')
  if not os.environ.get('JAX_COMPILATION_CACHE_DIR'):   # a rerun loads its compiled steps
    import jax  # noqa: PLC0415 (start-up order: cli loads before JAX)

    jax.config.update('jax_compilation_cache_dir', str(paths.cache_dir() / 'jax'))

  def parse(argv):
    rest = parse_flags(argv)
    if not positional and len(rest) > 1:
      _fail(f'error: unexpected arguments {rest[1:]}; expected only flags (--name=value); '
            'see --helpshort')
    return rest
  app.run(lambda argv: call(main, argv, verbose=flags.FLAGS.verbose),
          argv=named_configs(sys.argv if argv is None else list(argv)), flags_parser=parse)


def named_configs(argv: list) -> list:
  """argv with `--config NAME[:variant]` (a bare name, no such file) as the packaged config's
  path, so `--config gpt2_small` and `--config configs/gpt2_small.py` both work anywhere."""
  out = list(argv)
  for i, arg in enumerate(out):
    if arg.startswith('--config='):
      j, flag = i, '--config='
    elif arg == '--config' and i + 1 < len(out):
      j, flag = i + 1, ''
    else:
      continue
    value = out[j].removeprefix(flag)
    name, colon, variant = value.partition(':')
    if (os.path.exists(name)  # noqa: TID251 (config files are local modules)
        or not re.fullmatch(r'[A-Za-z_]\w*', name)):
      continue
    try:
      out[j] = flag + configs.config_path(name) + colon + variant
    except ValueError as e:
      _fail(one_line(e).replace('error: ', f'error: --config={value}: '))
  return out
