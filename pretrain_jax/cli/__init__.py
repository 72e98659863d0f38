"""What every command shares (commands/__init__.py imports it first; each command ends with
`cli.run(main)`): quiet library logs, and a user error (a bad flag, config value or path, a
damaged checkpoint, a held workdir) as one `error: <what, the value, what is expected>` line
and exit 2. `--verbose` restores the libraries' INFO logs and every traceback.

  process.py         glibc malloc and library env settings, applied at import (`process.start`)
  terminal.py        how a command ends: a summary on stderr, one JSON line on stdout
  finetune_flags.py  the flags finetune and transfer share
  config_flag.py     the --config flag: names, kinds, ml_collections' errors as one line
  usage.py           a command's --help: its docstring and flags, required ones marked
"""
import argparse
import asyncio
import functools
import inspect
import logging as py_logging
import os
import sys
import threading
import traceback
import warnings

from absl import app, flags, logging

from pretrain_jax import paths
from pretrain_jax.cli import config_flag, process, usage
from pretrain_jax.cli.config_flag import CONFIG_HELP, config_of  # noqa: F401 (cli.* to commands)

# At import: process.start() must run before any thread starts (glibc's arena limit binds only
# later threads) and before TensorFlow loads (it reads its log settings then).
process.start()

# Exception types that carry a message for the user (the library raises these for bad input).
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError,
               IsADirectoryError, PermissionError, FloatingPointError)
USER_ERROR_NAMES = ('LockHeld', 'CheckpointError', 'CheckpointSaveError', 'UsageError',
                    'PathError', 'PeerError', 'DataReadError')
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
  """argparse.ArgumentParser whose errors are one `error: ...; see --help` line, exit 2, and
  whose usage names the command as typed (`pretrain-jax NAME`, not the module's file)."""

  class Parser(argparse.ArgumentParser):
    def error(self, message):
      _fail(f'error: {message}; see --help')
  name = sys.argv[0].rsplit('/', 1)[-1]
  if name.endswith('.py'):   # `python -m` and the dispatcher set argv[0] to the module's file
    kw.setdefault('prog', f'pretrain-jax {name[:-3]}')
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


def define(define_flags):
  """define_flags() for flags that read a default config file when defined (ml_collections
  applies the command line's overrides then, before parse_flags)."""
  try:
    return define_flags()
  except (AttributeError, KeyError) as e:
    _fail(config_flag.unknown_override(sys.argv, e))


def parse_flags(argv, positional: bool = True):
  """absl's flag parsing (an absl.app flags_parser), with a parse error as one line, exit 2;
  arguments that are not flags are one too unless `positional`. --help prints usage.help_text."""
  if usage.asked(argv):
    print(usage.help_text(), end='')
    sys.exit(0)
  try:
    rest = flags.FLAGS(argv)
  except SystemExit as e:   # absl's --helpfull / --helpxml print the usage, then exit 1
    asked = {'--helpfull', '--helpxml'} & set(argv[1:])
    sys.exit(0 if asked and e.code == 1 else e.code)
  except flags.Error as e:
    traced = config_flag.CONFIG_TRACEBACK in str(e) and 'Traceback' in str(e)
    missing = usage.missing_required() if 'must have a value other than None' in str(e) else []
    _fail(config_flag.config_variant_error(str(e)) if traced else
          f'error: {", ".join(missing)} required; see --help' if missing else
          f'{one_line(e)}; see --helpshort')
  except (AttributeError, KeyError) as e:   # ml_collections: an override of a missing field
    _fail(config_flag.unknown_override(argv, e))
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
  if not positional and len(rest) > 1:
    _fail(f'error: unexpected arguments {rest[1:]}; expected only flags (--name=value); '
          'see --helpshort')
  return rest


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

  def checked(argv):   # JAX loads only once the flags are checked: a refusal takes no seconds
    if not os.environ.get('JAX_COMPILATION_CACHE_DIR'):   # a rerun loads its compiled steps
      import jax  # noqa: PLC0415 (start-up order: cli loads before JAX)

      jax.config.update('jax_compilation_cache_dir', str(paths.cache_dir() / 'jax'))
    return main(argv)
  try:
    argv = config_flag.named_configs(sys.argv if argv is None else list(argv))
  except ValueError as e:
    _fail(one_line(e))
  app.run(lambda argv: call(checked, argv, verbose=flags.FLAGS.verbose), argv=argv,
          flags_parser=functools.partial(parse_flags, positional=positional))
