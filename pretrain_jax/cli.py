"""What every script shares: quiet library logs, one-line user errors, `--verbose`.

  from pretrain_jax import cli      # first: process set-up (tuning/process.py) before TF loads
  ...
  if __name__ == '__main__':
    cli.run(main)

A user error (a bad flag or config value, a missing file, a damaged checkpoint, a held workdir)
prints `error: <what, the value, what is expected>` on stderr and exits 2; a genuine internal
failure keeps its traceback. `--verbose` restores the libraries' INFO logs and every traceback.
"""
import os
import re
import sys
import threading
import traceback

from pretrain_jax.tuning import process

# At import, not in run(): every command imports this module first, and process.start() must
# run before any thread starts (glibc's arena limit binds only later threads) and before
# TensorFlow loads (it reads its log settings then).
process.start()

# Exception types that carry a message for the user (the library raises these for bad input).
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError,
               IsADirectoryError, PermissionError, FloatingPointError)
USER_ERROR_NAMES = ('LockHeld', 'CheckpointError', 'CheckpointSaveError', 'UsageError',
                    'PathError', 'PeerError')


def is_user_error(error: BaseException) -> bool:
  return isinstance(error, USER_ERRORS) or type(error).__name__ in USER_ERROR_NAMES


def one_line(error: BaseException) -> str:
  """`error: ...` with the message's lines joined (a long message stays one line)."""
  text = ' '.join(str(error).split()) or type(error).__name__
  return f'error: {text}'


def argument_parser(description: str, **kw):
  """argparse.ArgumentParser whose errors are one `error: ...; see --help` line (exit 2), as
  absl's flags are here, not argparse's usage lines first."""
  import argparse  # pylint: disable=g-import-not-at-top

  class Parser(argparse.ArgumentParser):
    def error(self, message):
      print(f'error: {message}; see --help', file=sys.stderr)
      sys.exit(2)
  return Parser(description=description, **kw)


def quiet(verbose: bool) -> None:
  """absl (orbax, tfds) and Python warnings at ERROR unless verbose."""
  import logging as py_logging  # pylint: disable=g-import-not-at-top
  import warnings  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top
  if verbose:
    logging.set_verbosity(logging.INFO)
    py_logging.getLogger('pretrain_jax').setLevel(py_logging.INFO)   # e.g. each skipped record
    return
  logging.set_verbosity(logging.ERROR)
  for name in ('absl', 'orbax', 'jax', 'tensorflow', 'tensorflow_datasets'):
    py_logging.getLogger(name).setLevel(py_logging.ERROR)
  # A failed checkpoint read (the loop then restores the step before) leaves orbax's other
  # reads' coroutines and futures to report themselves ("Exception ignored in <coroutine ...>",
  # "Event loop is closed", thousands of lines) around the one line that says what happened.
  py_logging.getLogger('asyncio').setLevel(py_logging.CRITICAL)
  sys.unraisablehook = _quiet_unraisable
  warnings.filterwarnings('ignore', category=DeprecationWarning)
  warnings.filterwarnings('ignore', category=UserWarning, module='orbax')


def _quiet_unraisable(unraisable) -> None:
  """sys.unraisablehook without the asyncio leftovers of abandoned library coroutines."""
  import asyncio  # pylint: disable=g-import-not-at-top
  import inspect  # pylint: disable=g-import-not-at-top
  closed = (isinstance(unraisable.exc_value, RuntimeError)
            and 'Event loop is closed' in str(unraisable.exc_value))
  if closed or inspect.iscoroutine(unraisable.object) or isinstance(
      unraisable.object, asyncio.Future):
    return
  sys.__unraisablehook__(unraisable)


def use_cpu_devices(count: int) -> None:
  """Split the host CPU into `count` XLA devices (data parallelism over its cores), as
  XLA_FLAGS=--xla_force_host_platform_device_count does; 0 leaves it alone. Must run before
  JAX starts its backends; a device count already in XLA_FLAGS wins. No effect on GPU/TPU
  backends (they keep their devices)."""
  if not isinstance(count, int) or count < 0:
    raise ValueError(f'cpu_devices={count!r}; expected 0 (leave it) or a device count')
  flags = os.environ.get('XLA_FLAGS', '')
  if count and 'xla_force_host_platform_device_count' not in flags:
    process.keep_freed_memory(count)   # arenas for `count` devices, while no thread took one
    os.environ['XLA_FLAGS'] = f'{flags} --xla_force_host_platform_device_count={count}'.strip()
    import jax  # pylint: disable=g-import-not-at-top
    if jax.default_backend() == 'cpu' and jax.local_device_count() != count:
      raise ValueError(f'cpu_devices={count} came too late: JAX already runs on '
                       f'{jax.local_device_count()} CPU device(s); set XLA_FLAGS='
                       f'--xla_force_host_platform_device_count={count} before starting')


def use_compilation_cache() -> None:
  """JAX's persistent compilation cache in $PRETRAIN_JAX_CACHE/jax (as MaxText keeps one in
  ~/jax_cache): a rerun with the same shapes loads its compiled steps instead of compiling
  them. JAX_COMPILATION_CACHE_DIR, if set, wins."""
  if os.environ.get('JAX_COMPILATION_CACHE_DIR'):
    return
  import jax  # pylint: disable=g-import-not-at-top
  from pretrain_jax import paths  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_compilation_cache_dir', os.path.join(paths.cache_dir(), 'jax'))


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
  """define_flags() for flags whose definition reads a default config file (ml_collections
  applies the command line's overrides then, before run() parses anything): an override of a
  missing field is one error line and exit 2, as in run()."""
  try:
    return define_flags()
  except (AttributeError, KeyError) as e:
    print(unknown_override(sys.argv, e), file=sys.stderr)
    sys.exit(2)


_CONFIG_TRACEBACK = 'Error whilst parsing config file:'


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
  """absl's flag parsing, with a parse error as one `error:` line and exit 2."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  try:
    rest = flags.FLAGS(argv)
  except SystemExit as e:   # absl's --help / --helpfull print the usage, then exit 1
    asked = {'--help', '-h', '-?', '--helpshort', '--helpfull', '--helpxml'} & set(argv[1:])
    sys.exit(0 if asked and e.code == 1 else e.code)
  except flags.Error as e:
    if _CONFIG_TRACEBACK in str(e) and 'Traceback' in str(e):   # get_config's, in the text
      print(config_variant_error(str(e)), file=sys.stderr)
      sys.exit(2)
    cause = e.__cause__ or e.__context__
    detail = f' ({one_line(cause)[7:]})' if cause and str(cause) not in str(e) else ''
    print(f'{one_line(e)}{detail}; see --helpshort', file=sys.stderr)
    sys.exit(2)
  except (AttributeError, KeyError) as e:   # ml_collections: an override of a missing field
    print(unknown_override(argv, e), file=sys.stderr)
    sys.exit(2)
  except SyntaxError as e:                  # --config=FILE that is not Python
    print(f'error: {e.filename}: not a config file ({e.msg}, line {e.lineno}); expected a '
          'Python config file such as configs/tiny_gpt.py', file=sys.stderr)
    sys.exit(2)
  for name in flags.FLAGS:   # ml_collections loads config files lazily: load them now
    flag = flags.FLAGS[name]
    if type(flag).__name__ == '_ConfigFlag' and flag.present:
      try:
        flag.value.keys()  # a config that failed to load raises on first use
        if not hasattr(flag.value, 'unlock'):   # get_config() gave a dict or another mapping
          raise TypeError(f'get_config() returned a {type(flag.value).__name__}, not an '
                          'ml_collections.ConfigDict')
      except Exception as e:  # pylint: disable=broad-except
        path = getattr(flag, 'config_filename', '?')
        reason = ('no such file' if not os.path.exists(path.split(':')[0])
                  else one_line(e.__cause__ or e)[7:])
        print(f'error: --{name}={path}: {reason}; expected a config file such as '
              'configs/tiny_gpt.py (the configs/ directory lists them)', file=sys.stderr)
        sys.exit(2)
  return rest


CONFIG_KINDS = {   # a config file's kind: (the keys that mark it, the commands that read it)
    'fine-tuning': (('init', 'mode', 'task'), 'finetune, transfer'),   # (has model/data/train)
    'chapter experiment': (('corpus', 'gpt', 'bert'), 'shakespeare'),
    'pre-training': (('model', 'data', 'train'), 'train, describe, benchmark'),
}


def _a(kind: str) -> str:
  return f'{"an" if kind[0] in "aeiou" else "a"} {kind}'


def config_of(holder, kind: str):
  """The config a DEFINE_config_file flag loaded, refused (ValueError: one `error:` line) when
  it is another kind than the command reads, e.g. `describe --config configs/finetune.py`."""
  config = holder.value
  actual = next((k for k, (keys, _) in CONFIG_KINDS.items() if all(x in config for x in keys)),
                None)
  if actual == kind:
    return config
  from absl import flags  # pylint: disable=g-import-not-at-top
  path = getattr(flags.FLAGS[holder.name], 'config_filename', None) or '?'
  what = (f'{_a(actual)} config (read by {CONFIG_KINDS[actual][1]})' if actual else
          'not a config of any command (no ' + ', '.join(
              k for k in CONFIG_KINDS[kind][0] if k not in config) + ' section)')
  raise ValueError(f'--{holder.name}={path} is {what}; expected {_a(kind)} config (read by '
                   f'{CONFIG_KINDS[kind][1]}; docs/training.md lists them)')


def join_processes(address, num_processes, process_id, timeout_s: float) -> None:
  """jax.distributed.initialize with a deadline of our own. JAX waits its
  `initialization_timeout` for every process, then aborts the interpreter in C++ (a 40-line
  native stack naming RegisterTask, no Python error, nothing a user can act on). A watchdog
  says what was waited for and exits 2 first; JAX's own deadline is set a minute later."""
  import jax  # pylint: disable=g-import-not-at-top
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
    os._exit(2)  # pylint: disable=protected-access  (JAX's wait cannot be interrupted)

  threading.Thread(target=watchdog, name='join_processes_watchdog', daemon=True).start()
  # JAX's preemption service puts a C-level SIGTERM handler in place that only records the
  # notice for multihost_utils.reached_preemption_sync_point, which nothing here calls, so a
  # SIGTERM during start-up would be lost. The loop's handler (save, stop, agreed over the
  # processes) and the start-up one (release the lock, exit 143) serve it.
  jax.config.update('jax_enable_preemption_service', False)
  try:
    jax.distributed.initialize(address, num_processes, process_id,
                               initialization_timeout=int(timeout_s) + 60)
  finally:
    joined.set()
  _JOINED.append(True)


_JOINED = []   # non-empty once join_processes succeeded: this process is one of several
_PEER_GONE = ('Connection reset by peer', 'Connection closed by peer',   # gloo's (CPU) texts:
              'Gloo context initialization failed')  # a peer gone before the first collective


def _exit(code: int) -> None:
  """sys.exit, except in a multi-process run: there JAX's exit handler waits (5 minutes) for
  every process to reach it, then aborts in C++, so one host's error would hold the whole
  slice. The error is printed; leave at once and the other processes' collectives fail at
  once."""
  if not _JOINED:
    sys.exit(code)
  sys.stdout.flush()
  sys.stderr.flush()
  from pretrain_jax import paths  # pylint: disable=g-import-not-at-top
  paths.remove_staged()           # what an atexit handler would have done
  os._exit(code)  # pylint: disable=protected-access


def peer_gone(error: BaseException) -> bool:
  """A collective of a multi-process run failed because another process stopped."""
  return bool(_JOINED) and any(s in str(error) for s in _PEER_GONE)


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
  except Exception as e:  # pylint: disable=broad-except
    if peer_gone(e) and not verbose:
      why = ' '.join(str(e).split())[:300]
      print(f'error: another process of this multi-process run stopped or was killed ({why}); '
            'see its log, then rerun the same command on every host: it resumes from the '
            'newest complete checkpoint', file=sys.stderr, flush=True)
      _exit(2)
    if verbose or not is_user_error(e):
      if _JOINED:
        traceback.print_exc()
        _exit(1)
      raise
    print(one_line(e), file=sys.stderr, flush=True)
    _exit(2)


def run(main, argv=None, positional: bool = False) -> None:
  """absl.app.run(main) on argv (default sys.argv) with quiet logs, `--verbose`, named configs
  (`--config gpt2_small`) and one-line user errors (exit 2). Arguments that are not flags are
  refused unless `positional` (main reads them): absl hands them to main, where `del argv`
  dropped them without a word (`[--sizes 200,0]` pasted from a usage line, a flag without its
  dashes)."""
  from absl import app, flags  # pylint: disable=g-import-not-at-top
  if 'verbose' not in flags.FLAGS:
    flags.DEFINE_bool('verbose', False, 'show library logs and full tracebacks')
  use_compilation_cache()

  def parse(argv):
    rest = parse_flags(argv)
    if not positional and len(rest) > 1:
      print(f'error: unexpected arguments {rest[1:]}; expected only flags (--name=value); '
            'see --helpshort', file=sys.stderr)
      sys.exit(2)
    return rest
  app.run(lambda argv: call(main, argv, verbose=flags.FLAGS.verbose),
          argv=named_configs(sys.argv if argv is None else list(argv)), flags_parser=parse)


CONFIG_FLAGS = ('--config',)   # the flags that take a config file (or a packaged config's name)
CONFIG_HELP = 'a config name (gpt2_small) or file (configs/NAME.py)'


def config_names() -> list:
  """The configs this install ships (configs/<name>.py), by name."""
  import configs  # pylint: disable=g-import-not-at-top
  folder = os.path.dirname(configs.__file__)
  return sorted(f[:-3] for f in os.listdir(folder)
                if f.endswith('.py') and not f.startswith('_') and 'common' not in f)


def config_path(name: str) -> str:
  """configs/<name>.py of this install (a wheel ships them inside the package set)."""
  import configs  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.dirname(configs.__file__), f'{name}.py')
  if not os.path.isfile(path):
    raise ValueError(f'no config named {name!r}; expected a config file path or one of '
                     f'{", ".join(config_names())}')
  return path


def named_configs(argv: list) -> list:
  """argv with `--config NAME[:variant]` (no such file, a bare name) as the packaged config's
  path, so `--config gpt2_small` and `--config configs/gpt2_small.py` both work anywhere."""
  out = list(argv)
  for i, arg in enumerate(out):
    flag, eq, value = arg.partition('=')
    if flag not in CONFIG_FLAGS:
      continue
    j = i if eq else i + 1
    if not eq and j >= len(out):
      break
    value = value if eq else out[j]
    name, colon, variant = value.partition(':')
    if os.path.exists(name) or not re.fullmatch(r'[A-Za-z_]\w*', name):
      continue
    try:
      path = config_path(name) + colon + variant
    except ValueError as e:
      print(one_line(e).replace('error: ', f'error: {flag}={value}: '), file=sys.stderr)
      sys.exit(2)
    out[j] = f'{flag}={path}' if eq else path
  return out
