"""The configs: one get_config() per file. `base_config` picks the file a Hugging Face import
starts from (its data, train and mesh sections) for a model of a given family."""
import importlib
import os


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
  if not os.path.isfile(os.path.join(os.path.dirname(__file__), f'{name}.py')):
    names = sorted(f[:-3] for f in os.listdir(os.path.dirname(__file__))
                   if f.endswith('.py') and not f.startswith('_'))
    raise ValueError(f'base config {name!r} is not in configs/; expected one of {names}')
  config = importlib.import_module(f'configs.{name}').get_config()
  family = (config.get('model') or {}).get('family')
  if cfg is not None and family != cfg.family:
    raise ValueError(f'base config {name!r} is a {family} config; this model is {cfg.family}: '
                     f'expected a {cfg.family} config (default: {base_config_name(cfg)})')
  return name, config
