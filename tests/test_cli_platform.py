"""Where JAX runs: on the CPU, quietly, on a host with libtpu (the test requirements' TPU
compiler) but no accelerator; left to JAX wherever a TPU or GPU may be (cli/process.py)."""
import os
import subprocess
import sys

import jax
import pytest
from helpers import ROOT

from pretrain_jax.cli import process


def test_a_cpu_run_with_libtpu_installed_is_quiet():
  """libtpu on a host without a TPU: a command's JAX runs on the CPU without a word from
  libtpu's start-up (it warned about the TPU runtime it could not find)."""
  script = 'import pretrain_jax.cli, jax; print(jax.devices()[0].platform)'
  env = {k: v for k, v in os.environ.items() if k != 'JAX_PLATFORMS'}
  done = subprocess.run([sys.executable, '-c', script], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=300, check=False)
  assert done.returncode == 0 and done.stdout.strip() == 'cpu'
  assert done.stderr == ''


def test_the_tests_own_jax_runs_where_the_commands_would():
  """The test process imported jax before cli/process.py chose the platform: conftest gives
  jax the choice too, so an in-process test does not start libtpu's TPU runtime either."""
  assert (jax.config.jax_platforms or '') == os.environ.get('JAX_PLATFORMS', '')


@pytest.mark.parametrize('files, platforms', [
    ((), 'cpu'),
    (('dev/accel0',), ''),                                 # a TPU v4 VM
    (('dev/vfio/0',), ''),                                 # a TPU v5e VM
    (('dev/nvidia0',), ''),
    (('sys/bus/pci/devices/0000:00:04.0/vendor=0x1ae0',), ''),   # a Google PCI device
    (('sys/bus/pci/devices/0000:00:04.0/vendor=0x8086',), 'cpu'),
])
def test_jax_runs_on_the_cpu_only_where_no_accelerator_may_be(tmp_path, monkeypatch, files,
                                                              platforms):
  for spec in files:
    path, _, text = spec.partition('=')
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text(text)
  monkeypatch.delenv('JAX_PLATFORMS', raising=False)
  monkeypatch.setattr(process, 'libtpu_installed', lambda: True)
  assert process.choose_platform(str(tmp_path)) == platforms
  monkeypatch.setenv('JAX_PLATFORMS', 'tpu')
  assert process.choose_platform(str(tmp_path)) == 'tpu'      # the user's choice wins
