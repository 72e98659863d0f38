"""Shapes and logical axes of a model's parameters, via jax.eval_shape (no weights allocated)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from pretrain_jax.models import build
from pretrain_jax.models.config import ModelConfig


def dummy_inputs(cfg: ModelConfig, batch: int = 1, length: int = 8) -> tuple:
  tokens = jnp.ones((batch, length), jnp.int32)
  return (tokens, tokens) if cfg.family == 't5' else (tokens,)


def abstract_variables(cfg: ModelConfig):
  """ShapeDtypeStruct tree of the model's variables, with logical-partitioning metadata."""
  model = build(cfg)
  return jax.eval_shape(lambda: model.init(jax.random.key(0), *dummy_inputs(cfg)))


def parameter_table(cfg: ModelConfig):
  """[(path, shape, logical axes, count)], total count."""
  params = abstract_variables(cfg)['params']
  leaves = jax.tree_util.tree_flatten_with_path(
      params, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))[0]
  rows = []
  for path, leaf in leaves:
    axes = leaf.names if isinstance(leaf, nn.LogicallyPartitioned) else None
    value = leaf.value if isinstance(leaf, nn.LogicallyPartitioned) else leaf
    name = '/'.join(str(getattr(k, 'key', k)) for k in path)
    rows.append((name, tuple(value.shape), axes, int(np.prod(value.shape))))
  return rows, sum(r[3] for r in rows)
