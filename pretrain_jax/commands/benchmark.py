"""Benchmark the real train step of a config, or of a suite of configs.

  pretrain-jax benchmark --config bench_gpt [--config.model.KEY=VALUE ...]
      [--steps 10] [--peak_flops 0]
  pretrain-jax benchmark --suite gpu [--variants baseline,xla_attention,...] [--models ...]
  pretrain-jax benchmark --suite cpu_smoke     # the gpu suite's configs at tiny shapes

Compiles the train step (donated state, the configured mesh), times `--steps` steps on a
device-resident synthetic batch of the configured shapes, and prints: family, params, step_s
(median), tokens_per_s, model_flops_per_step (pretrain_jax.models.cost.train_flops: matmuls of
forward + backward), peak_flops (large jitted matmuls on the same device and dtype, timed after
every step; datasheet_peak_flops beside it on TPU/GPU), mfu (the median over steps of
model_flops_per_step / step time / the probe beside it; with --peak_flops, that fixed peak),
mfu_datasheet, compile_s and peak memory where the backend reports it. With --config the last
stdout line is that one JSON record.

With --suite (perf/suite.py) every stdout line is one compact JSON record per (model, variant),
and a table of them follows on stderr. A config's `benchmark.xla_flags` and `mem_fraction` are
set before JAX starts its backend (the environment's XLA_FLAGS win for a flag both name).
XLA reads its flags once per process, so variants that need more than one flag set run in one
process per set (the baseline's set first), started here one after another with the same
command line, while this process starts no backend (it would hold the device's memory);
variants of one flag set run in one process, each right after its model's baseline.
"""
import json
import os
import subprocess
import sys

from absl import flags
from ml_collections import config_flags

import configs.bench_common
from pretrain_jax import cli
from pretrain_jax.cli import terminal

_CONFIG = config_flags.DEFINE_config_file('config', None, cli.CONFIG_HELP, lock_config=False)
_SUITE = flags.DEFINE_string('suite', None, 'time a suite of configs in one process: gpu, '
                             'cpu_smoke, cpu (configs/bench_common.py: SUITES) or a comma-'
                             'separated list of config names')
_VARIANTS = flags.DEFINE_list('variants', ['baseline'], 'with --suite: the variants to time '
                              '(perf/suite.py: VARIANTS), or "all"')
_MODELS = flags.DEFINE_list('models', [], 'with --suite: only these of its configs')
_PROFILE = flags.DEFINE_string('profile_dir', None, 'also trace 3 untimed steps of each '
                               'benchmark into this directory (<model>-<variant>/ with --suite)')
_STEPS = flags.DEFINE_integer('steps', None, 'timed steps (default: config.benchmark.steps '
                              'or 10)', lower_bound=1)
_WARMUP = flags.DEFINE_integer('warmup', None, 'untimed steps after compiling (default 2)',
                               lower_bound=0)
_PEAK = flags.DEFINE_float('peak_flops', 0.0, 'use this peak FLOP/s instead of measuring it '
                           '(0: measure)', lower_bound=0.0)


def _start_backend_with(bench_sections, variant_flags: str = '') -> str:
  """Set XLA_FLAGS (and the GPU memory fraction) for the benchmarks before JAX starts its
  backend; returns the XLA_FLAGS this process runs with."""
  from pretrain_jax.perf import suite  # noqa: PLC0415 (after the flag checks)
  wanted = {b.xla_flags for b in bench_sections}
  if len(wanted) > 1:
    raise ValueError(f'the configs name different benchmark.xla_flags {sorted(wanted)}; '
                     'expected one set per process (time them in separate commands)')
  env = os.environ.get('XLA_FLAGS', '')
  merged = suite.merge_xla_flags(wanted.pop() if wanted else '', env, variant_flags)
  fractions = {b.mem_fraction for b in bench_sections if b.mem_fraction}
  from jax._src import xla_bridge  # noqa: PLC0415 (after the flag checks)
  if merged != env or fractions:
    if getattr(xla_bridge, 'backends_are_initialized', lambda: False)():
      raise ValueError(f'XLA_FLAGS={merged!r} came too late: JAX already started its backend; '
                       'expected them set before starting (run the command afresh)')
    os.environ['XLA_FLAGS'] = merged
    if fractions:
      os.environ.setdefault('XLA_PYTHON_CLIENT_MEM_FRACTION', str(max(fractions)))
  return merged


def _run_config():
  from pretrain_jax.perf import benchmark  # noqa: PLC0415 (after the flag checks)
  config = cli.config_of(_CONFIG, 'pre-training')
  bench = benchmark.benchmark_section(config)
  _start_backend_with([bench])
  record = benchmark.benchmark_train_step(
      config, steps=_STEPS.value if _STEPS.value is not None else bench.steps,
      warmup=_WARMUP.value if _WARMUP.value is not None else bench.warmup,
      peak_flops=_PEAK.value or None, probe_size=bench.probe_size, profile_dir=_PROFILE.value)
  terminal.finish(record)


def _argv_for(variants: list) -> list:
  """This command line with `--variants` replaced by `variants` (a child process's)."""
  out, skip = [], False
  for arg in sys.argv[1:]:
    if skip:
      skip = False
      continue
    if arg == '--variants':
      skip = True
      continue
    if not arg.startswith('--variants='):
      out.append(arg)
  return [sys.executable, '-m', 'pretrain_jax.commands.benchmark', *out,
          '--variants=' + ','.join(variants)]


_CHILD = 'PRETRAIN_JAX_BENCHMARK_CHILD'   # set in a child process: its parent prints the table


def _child(variants: list, models: list):
  """Yield the records of `variants` timed in a process of their own, as its lines come; a
  process that ends without its lines yields an error record for each it owed."""
  with subprocess.Popen(_argv_for(variants), stdout=subprocess.PIPE, text=True,
                        env={**os.environ, _CHILD: '1'}) as proc:
    done = set()
    for line in proc.stdout:
      if line.startswith('{'):
        record = json.loads(line)
        done.add((record.get('model'), record.get('variant')))
        yield record
  for model in models:
    for v in variants:
      if (model, v) not in done:
        yield {'model': model, 'variant': v,
               'error': f'its process exited {proc.returncode} before it (its stderr above)'}


def _error_line(error: Exception) -> str:
  """A failed benchmark's record text: the error's one line (--verbose: its traceback)."""
  if flags.FLAGS.verbose:
    raise error
  text = cli.one_line(error)[len('error: '):]
  return (text if cli.is_user_error(error) else f'{type(error).__name__}: {text}')[:300]


def _run_suite():
  from pretrain_jax.perf import benchmark, suite  # noqa: PLC0415 (after the flag checks)
  if _CONFIG.value is not None:
    raise ValueError('--config and --suite were both given; expected one of them')
  entries = configs.bench_common.suite(_SUITE.value)
  names = [n for n, _ in entries]
  unknown = [m for m in _MODELS.value if m not in names]
  if unknown:
    raise ValueError(f'--models names {unknown}; expected configs of --suite={_SUITE.value}: '
                     f'{names}')
  entries = [(n, c) for n, c in entries if not _MODELS.value or n in _MODELS.value]
  variants = list(suite.VARIANTS) if _VARIANTS.value == ['all'] else _VARIANTS.value
  variants = sorted(dict.fromkeys(variants), key=lambda v: v != 'baseline')  # baseline first
  records = []

  def emit(record):
    records.append(record)
    suite.add_ratios(records)
    print(terminal.dumps(suite.compact(record), separators=(',', ':')), flush=True)
  flag_sets = {suite.variant(v).xla_flags for v in variants}
  if len(flag_sets) == 1:          # one XLA flag set: all of them in this process
    xla_flags = _start_backend_with([benchmark.benchmark_section(c) for _, c in entries],
                                    flag_sets.pop())
    for record in suite.run(entries, variants, steps=_STEPS.value, warmup=_WARMUP.value,
                            peak_flops=_PEAK.value or None, xla_flags=xla_flags,
                            on_error=_error_line, profile_dir=_PROFILE.value):
      emit(record)
  else:
    # One process per flag set, one after another, while this one starts no backend (it would
    # hold the device's memory while they run).
    groups = {}
    for v in variants:
      groups.setdefault(suite.variant(v).xla_flags, []).append(v)
    for group in groups.values():
      for record in _child(group, [n for n, _ in entries]):
        emit(record)
  if not os.environ.get(_CHILD):
    print(suite.table(suite.compact(r) for r in records), file=sys.stderr, flush=True)
  failed = [f"{r['model']}/{r['variant']}" for r in records if 'error' in r]
  if failed:
    raise ValueError(f'{len(failed)} of {len(records)} benchmarks failed ({", ".join(failed)}); '
                     'expected every one to run: see their error lines')


def _run(argv):
  del argv
  if _SUITE.value:
    _run_suite()
  elif _CONFIG.value is None:
    raise ValueError('no --config or --suite; expected one (--config bench_gpt, --suite gpu)')
  else:
    _run_config()


def main(argv=None) -> None:
  cli.run(_run, argv)


if __name__ == '__main__':
  main()
