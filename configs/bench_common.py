"""The `benchmark` section of the configs/bench_*.py shapes (read by pretrain_jax.perf.benchmark)."""
import ml_collections


def bench_section(target_len: int = 0) -> ml_collections.ConfigDict:
  b = ml_collections.ConfigDict()
  b.steps = 10                      # timed train steps (the median is reported)
  b.warmup = 2                      # untimed steps after compiling
  b.target_len = target_len         # T5 decoder length; 0 = what span corruption makes
  return b
