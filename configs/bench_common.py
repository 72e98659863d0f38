"""The `benchmark` section of the configs/bench_*.py shapes (read by pretrain_jax.perf.benchmark;
its fields are documented in pretrain_jax/perf/config.py)."""
import ml_collections

from configs import common
from pretrain_jax.perf.config import BenchmarkConfig


def bench_section(target_len: int = 0) -> ml_collections.ConfigDict:
  return common.section(BenchmarkConfig(target_len=target_len))
