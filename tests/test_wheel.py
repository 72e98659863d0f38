"""A non-editable install works from any directory: build a wheel of this source, install it
into a fresh virtual environment, and run the commands from an empty directory.

The fresh environment reuses this one's third-party packages (a .pth line naming its
site-packages) so the test downloads nothing; only pretrain_jax and configs come from the wheel,
which the test checks before running anything."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest
from helpers import ROOT

SOURCE = ('pretrain_jax', 'configs', 'pyproject.toml', 'README.md', 'requirements.txt',
          'requirements-test.txt', 'requirements-tpu.txt', 'requirements-gpu.txt')


def _run(argv, cwd, env, timeout=900) -> subprocess.CompletedProcess:
  done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                        check=False)
  assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-3000:])
  return done


@pytest.fixture(scope='module')
def installed(tmp_path_factory):
  """(bin directory of a fresh venv with the wheel installed, an empty working dir, env)."""
  tmp = tmp_path_factory.mktemp('wheel')
  src = tmp / 'src'
  src.mkdir()
  for name in SOURCE:   # a copy, so the build leaves nothing in the checkout
    path = os.path.join(ROOT, name)
    if os.path.isdir(path):
      shutil.copytree(path, src / name, ignore=shutil.ignore_patterns('__pycache__'))
    else:
      shutil.copy(path, src / name)
  env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'VIRTUAL_ENV')}
  _run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation',
        str(src), '-w', str(tmp / 'dist')], tmp, env)
  wheel, = (tmp / 'dist').glob('pretrain_jax-*.whl')
  venv = tmp / 'venv'
  _run([sys.executable, '-m', 'venv', str(venv)], tmp, env)
  _run([str(venv / 'bin' / 'pip'), 'install', '-q', '--no-deps', '--no-index', str(wheel)], tmp,
       env)
  site = _run([str(venv / 'bin' / 'python'), '-c', 'import sysconfig; print(sysconfig.'
               'get_paths()["purelib"])'], tmp, env).stdout.strip()
  with open(os.path.join(site, '_dependencies.pth'), 'w', encoding='utf-8') as f:
    f.write(sysconfig.get_paths()['purelib'] + '\n')   # this venv's packages, after the wheel's
  work = tmp / 'empty'
  work.mkdir()
  env['PRETRAIN_JAX_CACHE'] = str(tmp / 'cache')
  return venv / 'bin', work, env


@pytest.mark.slow   # ~2 min: builds and installs a wheel, trains a tiny GPT for 2 steps
def test_the_wheel_runs_its_commands_from_an_empty_directory(installed):
  bin_dir, work, env = installed
  where = _run([str(bin_dir / 'python'), '-c', 'import configs, pretrain_jax.commands.train as t; '
                'print(configs.__file__); print(t.__file__)'], work, env).stdout.split()
  venv = os.path.dirname(str(bin_dir))
  assert all(path.startswith(venv) for path in where), where   # the wheel's, not the checkout's
  cli = str(bin_dir / 'pretrain-jax')
  listed = _run([cli, '--help'], work, env).stdout
  for command in ('train_tiny', 'train', 'evaluate', 'generate', 'fill_mask', 'describe',
                  'finetune', 'transfer', 'convert_hf', 'train_tokenizer', 'tpu', 'benchmark',
                  'benchmark_data', 'shakespeare'):
    assert f'\n  {command} ' in listed, (command, listed)
  described = json.loads(_run([cli, 'describe', '--config', 'gpt2_small'], work,
                              env).stdout.splitlines()[-1])
  assert described['family'] == 'gpt' and 124_000_000 < described['params'] < 125_000_000
  trained = json.loads(_run([cli, 'train_tiny', '--workdir', 'runs/tiny', '--models', 'tiny_gpt',
                             '--steps', '2', '--probe_sentences', '0', '--eval_batches', '1'],
                            work, env).stdout.splitlines()[-1])
  assert trained['models'][0]['step'] == 2
  assert os.path.isdir(work / 'runs' / 'tiny' / 'gpt' / 'checkpoints' / '2')
  evaluated = json.loads(_run([cli, 'evaluate', '--workdir', 'runs/tiny/gpt', '--batches', '1'],
                              work, env).stdout.splitlines()[-1])
  assert evaluated['step'] == 2 and evaluated['lm_loss'] > 0
  assert sorted(os.listdir(work)) == ['runs']   # nothing else written where it ran
