"""A fine-tune's config (configs/finetune.py) as one frozen dataclass (pretrain_jax/sections.py).

Built once, at the top of finetune / run_transfer, before anything loads: every number and the
mode are checked here. The model section is the checkpoint's (run.build_config); of it, the
config may set only the `ModelOverrides`, as t5x and Hugging Face fine-tunes set dropout.
"""
import dataclasses
from typing import ClassVar

from pretrain_jax.data.config import TaskConfig, TaskDataConfig
from pretrain_jax.sections import Section
from pretrain_jax.training.config import LoraConfig, MeshConfig, TrainConfig

MODES = ('full', 'linear_probe', 'scratch', 'lora')


@dataclasses.dataclass(frozen=True)
class ModelOverrides(Section):
  """config.model of a fine-tune: None keeps the checkpoint's value."""
  SECTION: ClassVar[str] = 'model'

  dropout_rate: float | None = None            # hidden dropout while fine-tuning
  attention_dropout_rate: float | None = None  # dropout on attention probabilities

  @classmethod
  def from_config(cls, section) -> 'ModelOverrides':
    names = [f.name for f in dataclasses.fields(cls)]
    values = dict(section.to_dict() if hasattr(section, 'to_dict') else section)
    for key, value in values.items():
      if key not in names and value is not None:
        raise ValueError(f'model.{key}={value!r}: the architecture comes from the checkpoint; '
                         f'expected only {", ".join("model." + k for k in names)}')
    return super().from_config({k: v for k, v in values.items() if k in names})

  def validate(self) -> None:
    for name in ('dropout_rate', 'attention_dropout_rate'):
      value = getattr(self, name)
      self.check(value is None or 0 <= value < 1, name, 'None (the checkpoint\'s) or a rate in '
                 '[0, 1)')


@dataclasses.dataclass(frozen=True)
class FinetuneConfig(Section):
  """The whole fine-tuning config: what to start from, how, on which task."""
  train: TrainConfig                # as pre-training's (configs/finetune.py: a short recipe)
  init: str = ''                    # training workdir, checkpoints/<step> dir, or HF directory
  mode: str = 'full'                # 'full', 'linear_probe' (frozen backbone), 'scratch' or
                                    # 'lora' (frozen backbone + rank-r updates: config.lora)
  probe_learning_rate: float = 1e-3  # linear_probe's peak learning rate (a head alone takes a
                                    # larger one); 0 = train.learning_rate
  task: TaskConfig = TaskConfig()  # the labelled task (data/config.py)
  data: TaskDataConfig = TaskDataConfig()  # its example lengths and order (data/config.py)
  model: ModelOverrides = ModelOverrides()  # what may differ from the checkpoint's model
  lora: LoraConfig = LoraConfig()  # mode 'lora': rank, alpha, targets (training/lora.py)
  mesh: MeshConfig = MeshConfig()  # as pre-training's (training/config.py)

  def validate(self) -> None:
    self.check(self.mode in MODES, 'mode', f'one of {MODES}')
    self.check(self.probe_learning_rate >= 0, 'probe_learning_rate',
               '0 (train.learning_rate) or a positive rate')
