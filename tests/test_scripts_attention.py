"""scripts/attention_memory.py and attention_speed.py build the real train step (they are
measurement tools outside the package, so nothing else would notice an API they fall behind)."""
import importlib.util
import json
import os

import pytest
from helpers import ROOT

from configs import tiny_t5

pytestmark = pytest.mark.slow


def script(name: str):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, 'scripts', f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_attention_memory_reads_a_peak_that_grows_with_the_batch():
  memory = script('attention_memory')
  one, two = (memory.step_bytes(tiny_t5.get_config(), b) for b in (1, 2))
  assert two['peak'] > one['peak'] > 0 and one['temp'] > 0


def test_attention_speed_prints_one_line_per_implementation(capsys):
  script('attention_speed').main(['--config', 'tiny_gpt', '--impls', 'reference,xla',
                                  '--rounds', '1'])
  line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert set(line['step_s']) == {'reference', 'xla'}
  assert line['ratio_to_reference']['reference'] == 1
