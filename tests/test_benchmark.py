"""Smoke test of the train-step benchmark harness (no timing assertions: see DESIGN.md)."""
import json
import os

import commands
import numpy as np
import pytest
from flax import traverse_util
from helpers import ROOT

from configs import bench_common, bench_gpu_t5, tiny_gpt
from pretrain_jax.perf import benchmark
from pretrain_jax.training.synthetic import SyntheticDataset

KEYS = ('family', 'params', 'step_s', 'tokens_per_s', 'model_flops_per_step', 'peak_flops',
        'mfu', 'compile_s')


def smoke_flags(module) -> list:
  """--config.KEY=VALUE for each field that bench_common.smoke changes in `module`'s config."""
  full = traverse_util.flatten_dict(module.get_config().to_dict(), sep='.')
  smoke = traverse_util.flatten_dict(bench_common.smoke(module.get_config()).to_dict(), sep='.')
  return [f'--config.{key}={value}' for key, value in smoke.items() if full.get(key) != value]


def test_harness_record_is_consistent():
  # the suite's T5 at tiny shapes, as `benchmark --config` prints benchmark_train_step's record
  # (the step test_benchmark_suite's suite and profile tests compile: one compile per session)
  out = commands.run('benchmark', '--config', os.path.join(ROOT, 'configs', 'bench_gpu_t5.py'),
                     *smoke_flags(bench_gpu_t5), '--steps', '2', '--warmup', '1',
                     '--peak_flops', '1e9', timeout=300,
                     env=dict(os.environ, XLA_FLAGS=commands.FAST_COMPILE_XLA_FLAGS))
  assert out.returncode == 0, out.stderr[-3000:]
  record = json.loads(out.stdout.strip().splitlines()[-1])
  assert (record['seq_len'], record['batch_size'], record['steps']) == (64, 2, 2)
  for key in KEYS:
    assert key in record, key
  assert record['family'] == 't5' and record['peak_flops'] == 1e9
  assert record['mfu'] == pytest.approx(
      record['model_flops_per_step'] / record['step_s'] / record['peak_flops'])
  assert record['tokens_per_s'] == pytest.approx(2 * (64 + record['target_len'])
                                                 / record['step_s'])


def test_measured_peak_is_positive():
  assert benchmark.measure_peak_flops(size=128, repeats=2) > 0


def test_script_prints_json_last_line():
  out = commands.run(
      'benchmark', '--config', os.path.join(ROOT, 'configs', 'tiny_gpt.py'), '--steps', '2',
       '--warmup', '0', '--peak_flops', '1e9', '--config.model.num_layers=1',
       '--config.train.batch_size=2', '--config.data.seq_len=16',
       # a GPU config on this CPU: was a 70-line 'cuDNN is not detected'; runs as 'xla'
       '--config.model.attention_impl=cudnn', '--config.model.dtype=bfloat16',
       '--config.model.attention_dropout_rate=0', timeout=300,
      env=dict(os.environ, XLA_FLAGS=commands.FAST_COMPILE_XLA_FLAGS))   # checks no speed
  assert out.returncode == 0, out.stderr[-3000:]
  record = json.loads(out.stdout.strip().splitlines()[-1])
  for key in KEYS:
    assert key in record, key
  assert record['family'] == 'gpt' and record['seq_len'] == 16
  assert record['attention_impl'] == 'xla' and record['dtype'] == 'bfloat16'
  assert record['mfu'] == pytest.approx(
      record['model_flops_per_step'] / record['step_s'] / record['peak_flops'])


def test_benchmark_batch_repeats_ids_like_text():
  config = tiny_gpt.get_config()
  config.train.batch_size, config.data.seq_len = 8, 128
  batch = benchmark.synthetic_batch(config)
  ids = batch['inputs']
  vocab = config.model.vocab_size
  assert ids.min() >= 3 and ids.max() < vocab
  counts = np.bincount(ids.ravel(), minlength=vocab)
  assert counts.max() / ids.size > 0.05      # Zipf(1.1): the top id is ~9% of the tokens
  assert np.count_nonzero(counts) > 50       # ... and the tail is long
  with pytest.raises(ValueError, match='zipf=1.0'):
    SyntheticDataset('gpt', vocab_size=vocab, seq_len=8, batch_size=1, zipf=1.0)
