import importlib
import importlib.util
import os
import shutil
import subprocess
import sys

import filelock
import jax
import pytest

import configs.tiny_bert
import configs.tiny_gpt
from configs import common
from pretrain_jax import data
from pretrain_jax.cli import process
from pretrain_jax.data.config import DataConfig
from pretrain_jax.run import loop

# pretrain_jax and configs come from the installed package (pip install -e '.[test]'); the
# tests' own helpers (modeling.py) from here.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import commands
import modeling


def pytest_configure(config):
  """The default set compiles with commands.FAST_COMPILE_XLA_FLAGS, in its own processes and
  the commands they start: its tests check what tiny programs compute and print, where XLA:CPU's
  optimizing build costs more than it saves. The slow set (`-m slow`: the README's commands, the
  main job's models end to end) compiles as users' runs do. Flags already in XLA_FLAGS come
  after, so they win. JAX's platform is chosen as the commands choose it (cli/process.py)."""
  # As every command does: with libtpu installed, a CPU-only host runs on the CPU. jax, imported
  # above, read JAX_PLATFORMS before process.start set it, so its config takes the choice too.
  platforms = process.choose_platform()
  if platforms:
    jax.config.update('jax_platforms', platforms)
  if config.getoption('markexpr') == 'not slow':
    os.environ['XLA_FLAGS'] = ' '.join(
        filter(None, [commands.FAST_COMPILE_XLA_FLAGS, os.environ.get('XLA_FLAGS')]))


@pytest.fixture(scope='session')
def libtpu_python() -> str:
  """A Python with libtpu, the TPU compiler, for checks that compile ahead of time for a TPU
  topology (no TPU attached): this one, or $PRETRAIN_JAX_LIBTPU_PYTHON. Fails, naming both,
  where neither has it (requirements-test.txt installs it)."""
  if importlib.util.find_spec('libtpu') is not None:
    return sys.executable
  other = os.environ.get('PRETRAIN_JAX_LIBTPU_PYTHON')
  if other and subprocess.run([other, '-c', 'import libtpu'], capture_output=True,
                              check=False).returncode == 0:
    return other
  pytest.fail(f'libtpu (the TPU compiler) is not installed for {sys.executable}, and '
              f'PRETRAIN_JAX_LIBTPU_PYTHON={other!r} names no Python that has it; expected '
              '`pip install -r requirements-test.txt`, or that variable set')


def session_dir(tmp_path_factory, worker_id):
  """A directory every pytest-xdist worker of this session shares (the parent of their temp
  directories), so work done once per session is done by one worker."""
  root = tmp_path_factory.getbasetemp()
  return root if worker_id == 'master' else root.parent


@pytest.fixture(scope='session', autouse=True)
def compilation_cache(tmp_path_factory, worker_id):
  """One JAX persistent compilation cache for the session, its workers and the commands the
  tests start (JAX_COMPILATION_CACHE_DIR wins over the CLI's $PRETRAIN_JAX_CACHE/jax): many
  tests compile the same tiny steps, and each run of the loop jits its steps anew. A cached
  executable is the one a compile gives (the key is the program, its options and devices).
  A trivial compile fixes the cache for the process before any test module sets its own."""
  if os.environ.get('PRETRAIN_JAX_TEST_CACHE') == '0':
    yield None
    return
  path = str(session_dir(tmp_path_factory, worker_id) / 'jax_cache')
  saved = {k: os.environ.get(k) for k in ('JAX_COMPILATION_CACHE_DIR',
                                          'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS')}
  os.environ.update(JAX_COMPILATION_CACHE_DIR=path, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0')
  jax.config.update('jax_compilation_cache_dir', path)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.jit(lambda x: x + 1)(0)
  yield path
  for key, value in saved.items():
    if value is None:
      os.environ.pop(key, None)
    else:
      os.environ[key] = value


@pytest.fixture(scope='session', autouse=True)
def host_cache(tmp_path_factory, worker_id):
  """The session's PRETRAIN_JAX_CACHE where a test sets none: a directory of the session's,
  never the user's ~/.cache/pretrain_jax, so a run neither reads what an earlier one prepared
  nor leaves data behind (a fresh machine and a used one run the same tests). Modules that set
  their own (data_cache, module_cache) restore this one after them."""
  with pytest.MonkeyPatch.context() as patch:
    path = session_dir(tmp_path_factory, worker_id) / 'host_cache'
    patch.setenv('PRETRAIN_JAX_CACHE', str(path))
    yield str(path)


def once_per_session(tmp_path_factory, worker_id, name: str, build) -> str:
  """`build(path)` run once per session, by whichever worker asks first, into a directory all
  workers share; the others wait on its lock and get the same path. A build that failed
  leaves nothing behind, so the next worker that asks builds again (and fails alike)."""
  path = session_dir(tmp_path_factory, worker_id) / name
  with filelock.FileLock(f'{path}.lock'):
    done = path.parent / f'{name}.done'
    if not done.exists():
      shutil.rmtree(path, ignore_errors=True)
      try:
        build(str(path))
      except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
      done.touch()
  return str(path)


def main_job_model(tmp_path_factory, worker_id, family: str) -> str:
  """The main job's tiny `family` model (configs/tiny_<family>.py, as pretrain-jax train_tiny
  trains it), trained once per session with its own data cache; read it, never write to it
  (copy it first)."""
  def build(path):
    config = importlib.import_module(f'configs.tiny_{family}').get_config()
    with pytest.MonkeyPatch.context() as patch:
      patch.setenv('PRETRAIN_JAX_CACHE', f'{path}_cache')
      loop.train_and_evaluate(config, path)
  return once_per_session(tmp_path_factory, worker_id, f'main_job_{family}', build)


@pytest.fixture(scope='session')
def gpt_init(tmp_path_factory, worker_id):
  """The main job's tiny GPT (400 steps)."""
  return main_job_model(tmp_path_factory, worker_id, 'gpt')


@pytest.fixture(scope='session')
def bert_init(tmp_path_factory, worker_id):
  """The main job's tiny BERT (400 steps, ALiBi)."""
  return main_job_model(tmp_path_factory, worker_id, 'bert')


@pytest.fixture(scope='session')
def t5_init(tmp_path_factory, worker_id):
  """The main job's tiny T5 (250 steps)."""
  return main_job_model(tmp_path_factory, worker_id, 't5')


@pytest.fixture(scope='session')
def gpt_workdir(tmp_path_factory, worker_id):
  """A small GPT (configs/tiny_gpt.py, modeling.small) trained 6 steps, once per
  session; tests read it (or copy it). Its data cache, `<workdir>_cache`, holds tiny_gpt's
  tokenizer and the prepared embedded corpus, so commands run with it as PRETRAIN_JAX_CACHE
  train no tokenizer."""
  def build(path):
    with pytest.MonkeyPatch.context() as patch:
      patch.setenv('PRETRAIN_JAX_CACHE', f'{path}_cache')
      loop.train_and_evaluate(modeling.small(configs.tiny_gpt.get_config()), path)
  return once_per_session(tmp_path_factory, worker_id, 'small_gpt_6_steps', build)


@pytest.fixture(scope='session')
def bert_nsp_workdir(gpt_workdir, tmp_path_factory, worker_id):
  """A small BERT with NSP (configs/tiny_bert.py, modeling.small) trained 3 steps, once per
  session, with gpt_workdir's data cache; read it, never write to it."""
  def build(path):
    config = modeling.small(configs.tiny_bert.get_config(), steps=3)
    config.model.nsp = config.data.nsp = True
    with pytest.MonkeyPatch.context() as patch:
      patch.setenv('PRETRAIN_JAX_CACHE', f'{gpt_workdir}_cache')
      loop.train_and_evaluate(config, path)
  return once_per_session(tmp_path_factory, worker_id, 'small_bert_nsp_3_steps', build)


@pytest.fixture(scope='module')
def data_cache(tmp_path_factory, worker_id):
  """A PRETRAIN_JAX_CACHE that the session's workers share, set for one test module and
  restored after it; yields its path. Built once per session: the tokenizer of
  common.data_config('clm', 64) and the embedded corpus prepared for both splits, so no module
  trains or prepares them again (a module may add data of its own files: another key)."""
  def build(path):
    with pytest.MonkeyPatch.context() as patch:
      patch.setenv('PRETRAIN_JAX_CACHE', path)
      dc = DataConfig.from_config(common.data_config('clm', 64))
      tokenizer = data.load_tokenizer(dc)
      for split in ('train', 'validation'):
        next(data.make_dataset(dc, tokenizer, split=split, batch_size=8))
  path = once_per_session(tmp_path_factory, worker_id, 'data_cache', build)
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv('PRETRAIN_JAX_CACHE', path)
    yield path


@pytest.fixture(scope='module')
def module_cache(tmp_path_factory):
  """A fresh PRETRAIN_JAX_CACHE (corpora, tokenizers, compilation cache) shared by one test
  module and restored after it; yields its path."""
  with pytest.MonkeyPatch.context() as patch:
    path = str(tmp_path_factory.mktemp('cache'))
    patch.setenv('PRETRAIN_JAX_CACHE', path)
    yield path
