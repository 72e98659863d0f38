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

  def validate(self) -> None:
    self.check(self.steps > 0, 'steps', 'a positive number of timed steps')
    self.check(self.warmup >= 0, 'warmup', 'a number of steps >= 0')
    self.check(self.target_len >= 0, 'target_len', '0 (span corruption\'s) or a length')
