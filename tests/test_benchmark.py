"""Smoke test of the train-step benchmark harness (no timing assertions: see DESIGN.md)."""
import json
import os
import subprocess
import sys

import pytest

from configs import tiny_gpt, tiny_t5
from pretrain_jax import benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = ('family', 'params', 'step_s', 'tokens_per_s', 'model_flops_per_step', 'peak_flops',
        'mfu', 'compile_s')


def _small(config):
  config.model.update(num_layers=1, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64,
                      vocab_size=256)
  config.data.seq_len = 16
  config.train.batch_size = 2
  return config


def test_harness_record_is_consistent():
  record = benchmark.benchmark_train_step(_small(tiny_t5.get_config()), steps=2, warmup=1,
                                          peak_flops=1e9)
  for key in KEYS:
    assert key in record, key
  assert record['family'] == 't5' and record['peak_flops'] == 1e9
  assert record['mfu'] == pytest.approx(
      record['model_flops_per_step'] / record['step_s'] / record['peak_flops'])
  assert record['tokens_per_s'] == pytest.approx(2 * (16 + record['target_len'])
                                                 / record['step_s'])


def test_measured_peak_is_positive():
  assert benchmark.measure_peak_flops(size=128, repeats=2) > 0


def test_script_prints_json_last_line():
  out = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'scripts', 'benchmark.py'),
       '--config', os.path.join(ROOT, 'configs', 'tiny_gpt.py'), '--steps', '2',
       '--warmup', '0', '--peak_flops', '1e9', '--config.model.num_layers=1',
       '--config.train.batch_size=2', '--config.data.seq_len=16'],
      capture_output=True, text=True, cwd=ROOT, check=True, timeout=300)
  record = json.loads(out.stdout.strip().splitlines()[-1])
  for key in KEYS:
    assert key in record, key
  assert record['family'] == 'gpt' and record['seq_len'] == 16
  assert record['mfu'] == pytest.approx(
      record['model_flops_per_step'] / record['step_s'] / record['peak_flops'])
