"""Fine-tuning and probing any checkpoint on a labelled task (run.py), and the transfer
comparison of scratch / linear_probe / full / lora (transfer.py). Sits on top of inference/.

MODES (config.py) loads no JAX, so a command's flags can list it before they are checked; the
rest is imported on first use (PEP 562).
"""
import importlib

from pretrain_jax.finetune.config import MODES

_WHERE = {'finetune': 'run', 'read_curves': 'run'}
__all__ = ['MODES', 'finetune', 'read_curves']


def __getattr__(name):
  if name not in _WHERE:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  return getattr(importlib.import_module(f'{__name__}.{_WHERE[name]}'), name)
