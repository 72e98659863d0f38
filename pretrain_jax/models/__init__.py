"""Model families. `build(ModelConfig)` returns the Linen module for the config's family."""
import importlib

from pretrain_jax.models.config import ModelConfig

_CLASSES = {'bert': ('bert', 'BERT'), 'gpt': ('gpt', 'GPT'), 't5': ('t5', 'T5')}


def build(cfg: ModelConfig):
  module, cls = _CLASSES[cfg.family]
  return getattr(importlib.import_module(f'pretrain_jax.models.{module}'), cls)(cfg)


__all__ = ['ModelConfig', 'build']
