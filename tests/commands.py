"""Commands run as `python -m pretrain_jax.commands.NAME ARGS` runs them, without paying the
libraries' import (JAX, Flax, orbax, TensorFlow: seconds of CPU) in every test that runs one.

One server process per pytest worker imports what the commands import, then forks a child per
command: the child takes the command's working directory, environment, sys.argv and sys.path as
`python -m` sets them, writes to its own stdout and stderr files, runs the command's module as
__main__ and exits as the interpreter would (but for its last garbage collection: see _child).
`run` returns a subprocess.CompletedProcess. A command whose environment changes what loads at
import (JAX_*, TF_*, malloc settings, PYTHON*) runs in a plain subprocess instead. The
server has started no JAX backend and no thread of JAX's or TensorFlow's, so its children start
clean: each command's devices and compiles are its own.
"""
import atexit
import gc
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback

from helpers import ROOT

# Environment variables read when a library loads (or by glibc, or by Python at start): a
# command given other values than the server's must start a process of its own. (XLA_FLAGS is
# read when a backend starts, in the child.)
AT_IMPORT = ('JAX_', 'TF_', 'TPU_', 'CUDA_', 'PRETRAIN_JAX_MALLOC', 'MALLOC_', 'GLIBC_', 'LD_',
             'PYTHON', 'OMP_', 'OPENBLAS_', 'MKL_')
# What every command's start sets unless given (cli/process.start): a test process that has
# imported pretrain_jax.cli holds them, the server's environment may not.
PROCESS_DEFAULTS = {'TF_CPP_MIN_LOG_LEVEL': '3', 'TF_ENABLE_ONEDNN_OPTS': '0'}
# XLA:CPU's cheapest build of a program (LLVM -O0, the classic elemental emitters, which
# compile faster than the MLIR fusion emitters, and one LLVM module per program, as splitting
# it for parallel codegen costs more CPU than it saves on the tests' small programs): for a
# process whose test checks what it prints or partitions, not how fast its code runs.
# XLA_FLAGS is read when a backend starts, so a command given them still runs in the fork
# server.
FAST_COMPILE_XLA_FLAGS = ('--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false '
                          '--xla_cpu_parallel_codegen_split_count=1')
_server = {}


def _import_env(env: dict) -> dict:
  return {k: v for k, v in {**PROCESS_DEFAULTS, **env}.items() if k.startswith(AT_IMPORT)}


def _start():
  proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], cwd=ROOT,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, env=dict(os.environ))
  ready = _line(proc, 600)
  assert ready == 'ready', f'the command server did not start ({ready!r})'
  _server.update(proc=proc, env=_import_env(os.environ))
  atexit.register(_stop)
  return proc


def _line(proc, timeout):
  """The server's next line (unbuffered, so that a wait with a timeout sees what is there), or
  None after `timeout` seconds."""
  fd, line = proc.stdout.fileno(), b''
  while not line.endswith(b'\n'):
    if not select.select([fd], [], [], timeout)[0]:
      return None
    byte = os.read(fd, 1)
    if not byte:
      raise RuntimeError('the command server stopped')
    line += byte
  return line.decode().strip()


def _stop():
  proc = _server.pop('proc', None)
  if proc is not None:
    proc.stdin.close()
    proc.wait(timeout=60)


def run(command: str, *args, cwd=ROOT, env=None, timeout=600) -> subprocess.CompletedProcess:
  """`python -m <module> *args` in `cwd` with `env` (default: this process's), where the module
  is pretrain_jax.commands.<command> (or `command` itself if it names a module: 'pretrain_jax'
  for the dispatcher). Never raises on a non-zero exit; raises subprocess.TimeoutExpired, and
  ValueError where a command that exited 0 ends with a JSON line that is not strict JSON."""
  module = command if command.startswith('pretrain_jax') else f'pretrain_jax.commands.{command}'
  env = dict(os.environ if env is None else env)
  argv = [sys.executable, '-m', module, *map(str, args)]
  if 'proc' in _server and _server['proc'].poll() is not None:
    _server.clear()
  proc = _server.get('proc') or _start()
  if _import_env(env) != _server['env']:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
  else:
    done = _served(proc, module, argv, cwd, env, timeout)
  last = (done.stdout.strip().splitlines() or [''])[-1]
  if done.returncode == 0 and last.startswith('{'):   # every command's last line: strict JSON
    strict_json(last)
  return done


def _served(proc, module, argv, cwd, env, timeout) -> subprocess.CompletedProcess:
  with tempfile.TemporaryDirectory() as tmp:
    out, err = os.path.join(tmp, 'out'), os.path.join(tmp, 'err')
    proc.stdin.write((json.dumps({'module': module, 'args': list(argv[3:]), 'cwd': str(cwd),
                                  'env': env, 'stdout': out, 'stderr': err}) + '\n').encode())
    proc.stdin.flush()
    pid = int(_line(proc, 60))
    code = _line(proc, timeout)
    if code is None:
      os.kill(pid, signal.SIGKILL)    # not reaped yet: the server waits for it
      _line(proc, 60)
      raise subprocess.TimeoutExpired(argv, timeout)
    code = int(code)
    def read(path):
      return open(path, encoding='utf-8', errors='replace').read()
    return subprocess.CompletedProcess(argv, code, read(out), read(err))


def strict_json(text: str):
  """json.loads refusing NaN and Infinity, which are not JSON (jq refuses them)."""
  def refuse(constant):
    raise ValueError(f'{constant} is not JSON: {text[:200]}')
  return json.loads(text, parse_constant=refuse)


def _child(request: dict) -> None:
  """In the forked child: become `python -m module args`, then exit as the interpreter does
  (an uncaught exception's traceback and exit 1, SystemExit's code, threads joined, atexit
  handlers run), but for its last garbage collection and module teardown: with the libraries
  loaded they cost a second or more. What a process prints only then (an object's __del__
  failing at exit) is not in the child's stderr: a test of that runs a plain subprocess."""
  try:
    os.chdir(request['cwd'])
    os.environ.clear()
    os.environ.update(request['env'])
    # (importing pretrain_jax.cli runs process.start: in the child only, with its environment)
    from pretrain_jax.cli import process  # noqa: PLC0415 (start-up order)
    process.start()        # what importing pretrain_jax.cli does in a fresh process
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                            (1, request['stdout'], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, request['stderr'], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
      opened = os.open(path, flags)
      os.dup2(opened, fd)
      os.close(opened)
    sys.argv = [request['module'], *request['args']]
    sys.path[0] = os.getcwd()      # as `python -m` sets it
  except BaseException:
    traceback.print_exc()
    os._exit(70)
  code = 0
  try:
    runpy.run_module(request['module'], run_name='__main__', alter_sys=True)
  except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
      code = e.code or 0
    else:
      print(e.code, file=sys.stderr)
      code = 1
  except BaseException:
    traceback.print_exc()
    code = 1
  threading._shutdown()
  atexit._run_exitfuncs()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


def serve() -> None:
  """The server: import what the commands import, then one forked child per request line."""
  sys.path[0] = ROOT         # not this folder: a command's sys.path[0] is its working directory

  gc.freeze()                # the children's collections skip what is loaded already
  print('ready', flush=True)
  for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      _child(request)
    print(pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)


if __name__ == '__main__':
  serve()
