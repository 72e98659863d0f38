"""The benchmark suite (pretrain-jax benchmark --suite): the GPU suite's code at tiny shapes on
CPU, its variants, its records and its errors (no timing assertions: see DESIGN.md)."""
import json
import os

import commands
import pytest

import configs.bench_common
from configs import bench_gpu_bert, bench_gpu_gpt, bench_gpu_t5, tiny_gpt
from pretrain_jax.data.config import DataConfig
from pretrain_jax.objectives import span_corruption
from pretrain_jax.perf import benchmark, suite
from pretrain_jax.perf.config import BenchmarkConfig

KEYS = ('model', 'variant', 'family', 'params', 'batch_size', 'seq_len', 'tokens_per_s',
        'step_ms', 'mfu', 'mfu_datasheet', 'peak_flops', 'model_flops_per_step', 'step_bytes',
        'compile_s', 'loss', 'device', 'xla_flags', 'vs_baseline')


def _benchmark(*args):
  # the cheapest XLA:CPU build: these tests check the records and processes, not the speed
  env = dict(os.environ, XLA_FLAGS=commands.FAST_COMPILE_XLA_FLAGS)
  return commands.run('benchmark', *args, env=env, timeout=600)


def _records(out):
  lines = out.stdout.strip().splitlines()
  assert lines and all(line.startswith('{') for line in lines), out.stdout + out.stderr
  for line in lines:
    assert len(line.encode()) < 1024, line          # compact: one short line per model
  return [json.loads(line) for line in lines]


def _sane(record):
  for key in KEYS:
    assert key in record, key
  assert 'error' not in record
  assert record['tokens_per_s'] > 0 and record['step_ms'] > 0
  # Against the matmul probe timed beside each step (not a datasheet peak), a shared machine's
  # load can land on the probe more than on the step and lift a ratio past 1; a unit slip (ms
  # for s, TFLOP/s for FLOP/s) is off by 1000x.
  assert 0 < record['mfu'] < 5
  assert record['mfu_datasheet'] is None or 0 < record['mfu_datasheet'] <= 1
  tokens = record['batch_size'] * (record['seq_len'] + record.get('target_len', 0))
  assert record['tokens_per_s'] == pytest.approx(tokens / record['step_ms'] * 1e3, rel=2e-3)


@pytest.mark.slow   # a benchmark of each family
def test_cpu_smoke_suite_writes_one_line_per_model_and_a_table():
  out = _benchmark('--suite', 'cpu_smoke')
  assert out.returncode == 0, out.stderr
  records = _records(out)
  assert [r['model'] for r in records] == list(configs.bench_common.SUITES['gpu'])
  assert [r['family'] for r in records] == ['gpt', 'bert', 't5']
  for record in records:
    _sane(record)
    assert record['variant'] == 'baseline' and record['vs_baseline'] == 1.0
    assert record['device'] == 'cpu' and record['mfu_datasheet'] is None
    assert record['seq_len'] == 64 and record['dtype'] == 'bfloat16'
    assert record['attention_impl'] == 'xla'        # the configs' cudnn, run as xla off GPUs
    # the GPU configs' flags were set before JAX started, then the environment's (the command
    # line set none)
    assert record['xla_flags'] == (configs.bench_common.GPU_XLA_FLAGS + ' '
                                   + commands.FAST_COMPILE_XLA_FLAGS)
  assert records[2]['target_len'] == span_corruption.target_length(64)[1]
  table = out.stderr.strip().splitlines()[-4:]
  assert table[0].split()[:3] == ['model', 'variant', 'tokens/s']
  assert [row.split()[0] for row in table[1:]] == [r['model'] for r in records]


@pytest.mark.slow   # benchmarks in processes of their own
def test_variants_run_beside_the_baseline_and_in_their_own_process():
  out = _benchmark('--suite', 'cpu_smoke', '--models', 'bench_gpu_gpt',
                   '--variants', 'chunked_ce,no_command_buffers,baseline,host_feed,prefetch')
  assert out.returncode == 0, out.stderr
  records = {r['variant']: r for r in _records(out)}
  # the baseline first, then this process's variants, then the one with XLA flags of its own
  assert list(records) == ['baseline', 'chunked_ce', 'host_feed', 'prefetch',
                           'no_command_buffers']
  for record in records.values():
    _sane(record)
    assert record['model'] == 'bench_gpu_gpt'
    assert record['vs_baseline'] == pytest.approx(
        record['tokens_per_s'] / records['baseline']['tokens_per_s'], rel=2e-3)
  assert records['chunked_ce']['loss_chunk_len'] == 16 and records['baseline'][
      'loss_chunk_len'] == 0
  assert records['host_feed']['feed'] == 'host' and records['prefetch']['feed'] == 'prefetch'
  # the same step on the same batch: the feed and a GPU-only flag change no value on CPU
  assert records['host_feed']['loss'] == records['prefetch']['loss'] == records['baseline'][
      'loss']
  assert records['no_command_buffers']['loss'] == records['baseline']['loss']
  assert records['chunked_ce']['loss'] == pytest.approx(records['baseline']['loss'], rel=1e-2)
  suite_flags = configs.bench_common.GPU_XLA_FLAGS + ' ' + commands.FAST_COMPILE_XLA_FLAGS
  assert records['no_command_buffers']['xla_flags'] == (
      suite_flags + ' --xla_gpu_enable_command_buffer=')
  assert records['baseline']['xla_flags'] == suite_flags


@pytest.mark.parametrize('args, named', [
    (['--suite', 'nosuch'], 'nosuch'),
    (['--suite', 'cpu_smoke', '--models', 'bench_gpt'], 'bench_gpt'),
    (['--suite', 'cpu_smoke', '--variants', 'warp_speed'], 'warp_speed'),
    (['--suite', 'cpu_smoke', '--config', 'bench_gpt'], '--config'),
    ([], '--suite'),
])
def test_bad_suite_arguments_are_one_line_errors(args, named):
  out = _benchmark(*args)
  assert out.returncode == 2 and out.stdout == ''
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: ') and named in lines[0]


def test_a_failing_model_is_a_record_and_the_suite_goes_on():
  bad = configs.bench_common.smoke(bench_gpu_gpt.get_config())
  bad.train.loss_chunk_len = -1
  records = list(suite.run([('bad', bad)], ['baseline', 'remat'], peak_flops=1e9))
  assert [r['variant'] for r in records] == ['baseline', 'remat']
  for record in records:
    assert 'loss_chunk_len' in record['error'] and 'tokens_per_s' not in record
  assert 'error' in suite.compact(records[0])
  assert 'error' in suite.table(records).splitlines()[1]


def test_merge_xla_flags_later_layers_win():
  assert suite.merge_xla_flags('--a=1 --b=2', '', '--b=3 --c=') == '--a=1 --b=3 --c='
  assert suite.merge_xla_flags('', None) == ''


def test_with_variant_copies_and_follows_the_shapes():
  config = tiny_gpt.get_config()
  chunked = suite.with_variant(config, 'chunked_ce')
  assert chunked.train.loss_chunk_len == config.data.seq_len // 4
  assert config.train.loss_chunk_len == 0                  # the original is untouched
  assert suite.with_variant(config, 'remat').model.remat == 'minimal'
  with pytest.raises(ValueError, match="'warp_speed'"):
    suite.with_variant(config, 'warp_speed')


def test_compact_rounds_and_renames():
  record = suite.compact({'model': 'm', 'variant': 'baseline', 'step_s': 0.123456789,
                          'tokens_per_s': 123456.789, 'mfu': 0.4444444, 'unlisted': 1})
  assert record == {'model': 'm', 'variant': 'baseline', 'tokens_per_s': 123500.0,
                    'step_ms': 123.5, 'mfu': 0.4444}
  records = suite.add_ratios([{'model': 'm', 'variant': 'baseline', 'tokens_per_s': 200.0},
                              {'model': 'm', 'variant': 'x', 'tokens_per_s': 250.0},
                              {'model': 'n', 'variant': 'x', 'tokens_per_s': 250.0}])
  assert [r.get('vs_baseline') for r in records] == [1.0, 1.25, None]


def test_gpu_configs_are_the_best_known_h100_settings():
  gpt, bert, t5 = (c.get_config() for c in (bench_gpu_gpt, bench_gpu_bert, bench_gpu_t5))
  assert (gpt.model.vocab_size, gpt.data.seq_len, gpt.train.batch_size) == (50304, 1024, 96)
  assert (bert.model.vocab_size, bert.data.seq_len, bert.train.batch_size) == (30592, 512, 128)
  assert bert.model.nsp and bert.data.nsp
  assert (t5.data.seq_len, t5.train.batch_size, t5.model.scan_layers) == (512, 128, True)
  assert benchmark.target_length(DataConfig.from_config(t5.data),
                                 BenchmarkConfig.from_config(t5.benchmark)) == 114
  for c in (gpt, bert, t5):
    assert c.model.dtype == 'bfloat16' and c.model.attention_impl == 'cudnn'
    assert c.model.attention_dropout_rate == 0.0 and c.model.remat == 'none'
    assert c.benchmark.xla_flags == '--xla_gpu_enable_triton_gemm=false'
    assert c.model.vocab_size % 128 == 0


def test_benchmark_section_refuses_flags_without_dashes():
  with pytest.raises(ValueError, match='benchmark.xla_flags'):
    BenchmarkConfig(xla_flags='xla_gpu_enable_triton_gemm=false')
  with pytest.raises(ValueError, match='benchmark.mem_fraction'):
    BenchmarkConfig(mem_fraction=1.5)


def test_an_unknown_feed_is_refused():
  """(The feeds run as variants: test_variants_run_beside_the_baseline_and_in_their_own_process.)"""
  config = configs.bench_common.smoke(bench_gpu_gpt.get_config())
  with pytest.raises(ValueError, match="feed='pipe'"):
    benchmark.benchmark_train_step(config, steps=1, warmup=0, peak_flops=1e9, feed='pipe')


def test_profile_dir_traces_each_benchmark(tmp_path):
  # the suite's T5 step (test_benchmark's harness test compiles it too)
  out = _benchmark('--suite', 'cpu_smoke', '--models', 'bench_gpu_t5', '--steps', '1',
                   '--warmup', '0', '--peak_flops', '1e9', '--profile_dir', tmp_path)
  assert out.returncode == 0, out.stderr
  [record] = _records(out)
  assert 'error' not in record and record['profile'] == str(tmp_path / 'bench_gpu_t5-baseline')
  traces = [p.name for p in (tmp_path / 'bench_gpu_t5-baseline').rglob('*') if p.is_file()]
  assert any(n.endswith('.xplane.pb') for n in traces), traces
  assert 'perfetto_trace.json.gz' in traces


def test_suites_name_their_configs():
  gpu = configs.bench_common.suite('gpu')
  smoke = configs.bench_common.suite('cpu_smoke')
  assert [n for n, _ in gpu] == [n for n, _ in smoke] == list(configs.bench_common.SUITES['gpu'])
  assert [c.model.num_layers for _, c in gpu] == [12, 12, 12]
  assert [c.model.num_layers for _, c in smoke] == [1, 1, 1]
  assert [c.benchmark.xla_flags for _, c in smoke] == [c.benchmark.xla_flags for _, c in gpu]
  listed = configs.bench_common.suite('bench_gpt,bench_t5')
  assert [(n, c.model.family) for n, c in listed] == [('bench_gpt', 'gpt'), ('bench_t5', 't5')]
  with pytest.raises(ValueError, match="'bench_common'"):
    configs.bench_common.suite('bench_common')
