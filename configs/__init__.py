"""The configs: one get_config() per file (`config_names`). `base_config` picks the file a
Hugging Face import starts from (its data, train and mesh sections) for a model's family."""
import importlib
import os


def config_names() -> list:
  """The configs this install ships (configs/<name>.py), by name."""
  return sorted(f[:-3] for f in os.listdir(os.path.dirname(__file__))
                if f.endswith('.py') and not f.startswith('_') and 'common' not in f)


def config_path(name: str) -> str:
  """configs/<name>.py of this install (a wheel ships them inside the package set)."""
  path = os.path.join(os.path.dirname(__file__), f'{name}.py')
  if not os.path.isfile(path):
    raise ValueError(f'no config named {name!r}; expected a config file path or one of '
                     f'{", ".join(config_names())}')
  return path


def base_config_name(cfg) -> str:
  """The configs/ module whose data/train/mesh sections an imported ModelConfig starts from."""
  if cfg.family == 't5':
    return 't5_small' if cfg.tie_embeddings else 't5_v1_1_base'
  return {'bert': 'bert_base', 'gpt': 'gpt2_small'}[cfg.family]


def base_config(cfg, name: str = None):
  """(name, ConfigDict) of configs/<name>.py, by default the family's base for `cfg`."""
  name = name or base_config_name(cfg)
  if name.endswith('.py'):   # the path form the other scripts take: configs/NAME.py
    name = os.path.basename(name)[:-3]
  if name not in config_names():
    raise ValueError(f'base config {name!r} is not in configs/; expected one of {config_names()}')
  config = importlib.import_module(f'configs.{name}').get_config()
  family = (config.get('model') or {}).get('family')
  if cfg is not None and family != cfg.family:
    raise ValueError(f'base config {name!r} is a {family} config; this model is {cfg.family}: '
                     f'expected a {cfg.family} config (default: {base_config_name(cfg)})')
  return name, config
