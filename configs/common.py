"""Shared pieces of every config: data, training and mesh sections.

Each configs/<name>.py builds its `model` section and calls these for the rest, setting only
what differs. The sections are built from the library's dataclasses, whose field defaults are
the one place a default lives and whose field comments document each key:
pretrain_jax/data/config.py (`DataConfig`), pretrain_jax/training/config.py (`TrainConfig`,
`MeshConfig`). Override anything from the command line:
`--config.train.steps=100 --config.data.seq_len=64`.
"""
import typing

import ml_collections
from ml_collections import config_dict

from pretrain_jax.data.config import DataConfig
from pretrain_jax.sections import Section
from pretrain_jax.training.config import MeshConfig, TrainConfig


def section(values: Section) -> ml_collections.ConfigDict:
  """A Section's values as a ConfigDict; a field left None becomes a placeholder of its type,
  so `--config.x.y=` still parses a value for it."""
  hints = typing.get_type_hints(type(values))
  out = ml_collections.ConfigDict()
  for name, value in values.to_dict().items():
    if isinstance(getattr(values, name), Section):
      value = section(getattr(values, name))
    elif value is None:
      kind = next(a for a in typing.get_args(hints[name]) if a is not type(None))
      value = config_dict.placeholder(kind)
    out[name] = value
  return out


def data_config(objective: str, seq_len: int) -> ml_collections.ConfigDict:
  return section(DataConfig(objective=objective, seq_len=seq_len))


def train_config(batch_size: int, steps: int, learning_rate: float) -> ml_collections.ConfigDict:
  return section(TrainConfig(batch_size=batch_size, steps=steps, learning_rate=learning_rate,
                             warmup_steps=max(steps // 20, 1)))


def mesh_config() -> ml_collections.ConfigDict:
  return section(MeshConfig())
