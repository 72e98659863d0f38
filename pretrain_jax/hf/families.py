"""The one place a Hugging Face family record is looked up: by our family name (or a
ModelConfig, through pretrain_jax.models.family_of) or by config.json's `model_type`.

A fourth family is one new module here (ending with `HF = HfFamily(...)`) and one entry below.
"""
from pretrain_jax import models
from pretrain_jax.hf import bert, gpt2, t5
from pretrain_jax.hf.record import HfFamily

RECORDS = (bert.HF, gpt2.HF, t5.HF)
BY_NAME = {r.name: r for r in RECORDS}
BY_MODEL_TYPE = {r.model_type: r for r in RECORDS}


def of(cfg_or_name) -> HfFamily:
  """The record of a ModelConfig's family (or of a family name, or a models.Family)."""
  return BY_NAME[models.family_of(cfg_or_name).name]


def of_config_json(hf: dict) -> HfFamily:
  """The record of a config.json dict: its model_type, checked against its architectures."""
  model_type = hf.get('model_type')
  if model_type not in BY_MODEL_TYPE:
    raise ValueError(f'config.json model_type={model_type!r} (architectures '
                     f'{hf.get("architectures")}); expected one of {sorted(BY_MODEL_TYPE)}')
  record = BY_MODEL_TYPE[model_type]
  for arch in hf.get('architectures') or ():
    if arch not in record.architectures:
      raise ValueError(f'config.json architectures={hf["architectures"]!r}: {arch!r} is not '
                       f'supported; expected one of {record.architectures}')
  return record
