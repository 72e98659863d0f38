"""Benchmark the real train step of a config; the last stdout line is one JSON record.

  pretrain-jax benchmark --config bench_gpt [--config.model.KEY=VALUE ...]
      [--steps 10] [--peak_flops 0]

Compiles the train step (donated state, the configured mesh), times `--steps` steps on a
device-resident synthetic batch of the configured shapes, and prints: family, params, step_s
(median), tokens_per_s, model_flops_per_step (pretrain_jax.models.flops.train_flops: matmuls of
forward + backward), peak_flops (large jitted matmuls on the same device and dtype, timed after
every step; datasheet_peak_flops beside it on TPU/GPU), mfu (the median over steps of
model_flops_per_step / step time / the probe beside it; with --peak_flops, that fixed peak),
compile_s and peak memory where the backend reports it. No XLA flags are set.
"""
import json

from pretrain_jax import cli  # pylint: disable=g-bad-import-order  (first: quiets TF)
from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, cli.CONFIG_HELP, lock_config=False)
_STEPS = flags.DEFINE_integer('steps', None, 'timed steps (default: config.benchmark.steps '
                              'or 10)', lower_bound=1)
_WARMUP = flags.DEFINE_integer('warmup', None, 'untimed steps after compiling (default 2)',
                               lower_bound=0)
_PEAK = flags.DEFINE_float('peak_flops', 0.0, 'use this peak FLOP/s instead of measuring it '
                           '(0: measure)', lower_bound=0.0)


def _run(argv):
  del argv
  from pretrain_jax.perf import benchmark
  config = cli.config_of(_CONFIG, 'pre-training')
  bench = benchmark.benchmark_section(config)
  record = benchmark.benchmark_train_step(
      config, steps=_STEPS.value if _STEPS.value is not None else bench.steps,
      warmup=_WARMUP.value if _WARMUP.value is not None else bench.warmup,
      peak_flops=_PEAK.value or None)
  print(json.dumps(record), flush=True)


def main(argv=None) -> None:
  flags.mark_flags_as_required(['config'])
  cli.run(_run, argv)


if __name__ == '__main__':
  main()
