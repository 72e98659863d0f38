"""The `benchmark` section of the configs/bench_*.py shapes (pretrain_jax/sections.py)."""
import dataclasses
from typing import ClassVar

from pretrain_jax.sections import Section


@dataclasses.dataclass(frozen=True)
class BenchmarkConfig(Section):
  """config.benchmark: how pretrain-jax benchmark times the train step (its flags override)."""
  SECTION: ClassVar[str] = 'benchmark'

  steps: int = 10                   # timed train steps (the median is reported)
  warmup: int = 2                   # untimed steps after compiling
  target_len: int = 0               # T5 decoder length; 0 = what span corruption makes
  xla_flags: str = ''               # XLA_FLAGS the benchmark process starts its backend with
                                    # (set by the command before JAX starts; the environment's
                                    # own XLA_FLAGS win for a flag both name)
  mem_fraction: float = 0.0         # XLA_PYTHON_CLIENT_MEM_FRACTION on GPUs (0 = JAX's default)
  probe_size: int = 0               # side of the matmul peak probe (0 = perf.benchmark's default)

  def validate(self) -> None:
    self.check(self.steps > 0, 'steps', 'a positive number of timed steps')
    self.check(self.warmup >= 0, 'warmup', 'a number of steps >= 0')
    self.check(self.target_len >= 0, 'target_len', '0 (span corruption\'s) or a length')
    self.check(all(f.startswith('--') for f in self.xla_flags.split()), 'xla_flags',
               'XLA flags separated by spaces, each --name=value')
    self.check(0.0 <= self.mem_fraction <= 1.0, 'mem_fraction', 'a fraction in [0, 1] '
               '(0 = JAX\'s default)')
    self.check(self.probe_size >= 0, 'probe_size', '0 (the default) or a matrix side')
