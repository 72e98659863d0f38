"""The configs: one get_config() per file. `base_config` picks the file a Hugging Face import
starts from (its data, train and mesh sections) for a model of a given family."""
import importlib


def base_config_name(cfg) -> str:
  """The configs/ module whose data/train/mesh sections an imported ModelConfig starts from."""
  if cfg.family == 't5':
    return 't5_small' if cfg.tie_embeddings else 't5_v1_1_base'
  return {'bert': 'bert_base', 'gpt': 'gpt2_small'}[cfg.family]


def base_config(cfg, name: str = None):
  """(name, ConfigDict) of configs/<name>.py, by default the family's base for `cfg`."""
  name = name or base_config_name(cfg)
  return name, importlib.import_module(f'configs.{name}').get_config()
