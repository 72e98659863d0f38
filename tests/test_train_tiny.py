"""The README's main job (scripts/train_tiny.py), shortened: it trains, checkpoints under
<workdir>/<family> (the paths the README's evaluate/generate/fill_mask examples use) and ends
with its JSON line."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_train_tiny_writes_family_workdirs_and_a_json_line(tmp_path):
  workdir = tmp_path / 'tiny'
  out = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'scripts', 'train_tiny.py'), '--workdir', str(workdir),
       '--models', 'tiny_gpt', '--steps', '3'],
      capture_output=True, text=True, cwd=ROOT, check=True, timeout=600)
  result = json.loads(out.stdout.strip().splitlines()[-1])
  (model,) = result['models']
  assert model['name'] == 'tiny_gpt' and model['family'] == 'gpt'
  assert model['step'] == 3 and model['checkpoint_steps'] == [3]
  assert model['workdir'] == str(workdir / 'gpt')
  assert os.path.isdir(workdir / 'gpt' / 'checkpoints' / '3')
  assert 'tiny_gpt' in out.stderr and 'train loss' in out.stderr
