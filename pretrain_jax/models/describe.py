"""Shapes and logical axes of a model's parameters, via jax.eval_shape (no weights allocated)."""
import re

import flax.linen as nn
import jax
import numpy as np

from pretrain_jax.models import build, family_of
from pretrain_jax.models.config import ModelConfig


def abstract_variables(cfg: ModelConfig, length: int = 8):
  """ShapeDtypeStruct tree of the model's variables, with logical-partitioning metadata."""
  model = build(cfg)
  args, kwargs = family_of(cfg).model_inputs(family_of(cfg).init_batch(length, cfg.nsp))
  return jax.eval_shape(lambda: model.init(jax.random.key(0), *args, **kwargs))


def counting_order(path: str) -> list:
  """A sort key that orders numbered names as a person counts: h_2 before h_10."""
  parts = re.split(r'(\d+)', path)   # text, number, text, ...: odd places hold the numbers
  return [int(p) if i % 2 else p for i, p in enumerate(parts)]


def parameter_table(cfg: ModelConfig):
  """[(path, shape, logical axes, count)] in counting order (h_0, h_1, ..., h_10), total count."""
  params = abstract_variables(cfg)['params']
  leaves = jax.tree_util.tree_flatten_with_path(
      params, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))[0]
  rows = []
  for path, leaf in leaves:
    axes = leaf.names if isinstance(leaf, nn.LogicallyPartitioned) else None
    value = leaf.value if isinstance(leaf, nn.LogicallyPartitioned) else leaf
    name = jax.tree_util.keystr(path, simple=True, separator='/')
    rows.append((name, tuple(value.shape), axes, int(np.prod(value.shape))))
  rows.sort(key=lambda r: counting_order(r[0]))
  return rows, sum(r[3] for r in rows)
