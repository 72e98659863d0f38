"""Shared layers: the one-hot embedding lookup is the gather lookup, values and gradients."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from pretrain_jax import layers
from pretrain_jax.models.t5 import RelativePositionBias, relative_position_bucket
from modeling import tiny


def _table_and_ids():
  table = jax.random.normal(jax.random.key(0), (7, 5), jnp.float32)
  ids = jnp.array([[0, 3, 3, 6], [6, 6, 1, 0]])
  return table, ids


def test_one_hot_embed_equals_gather_with_the_same_gradient():
  table, ids = _table_and_ids()
  gather = nn.Embed(7, 5)
  one_hot = layers.OneHotEmbed(7, 5)
  variables = {'params': {'embedding': table}}
  np.testing.assert_array_equal(one_hot.apply(variables, ids), gather.apply(variables, ids))
  cotangent = jax.random.normal(jax.random.key(1), ids.shape + (5,))

  def grad(module):
    return jax.grad(lambda t: jnp.sum(module.apply({'params': {'embedding': t}}, ids)
                                      * cotangent))(table)
  np.testing.assert_allclose(grad(one_hot), grad(gather), rtol=0, atol=1e-6)
  # rows hit twice get both contributions (what a colliding scatter-add must also give)
  np.testing.assert_allclose(grad(one_hot)[6], cotangent[0, 3] + cotangent[1, 0]
                             + cotangent[1, 1], atol=1e-6)


def test_relative_position_bias_is_the_table_at_the_buckets():
  cfg = tiny('t5', relative_buckets=8, relative_max_distance=16)
  module = RelativePositionBias(cfg, bidirectional=True)
  pos = jnp.arange(10)
  variables = module.init(jax.random.key(0), pos, pos)
  table = variables['params']['rel_embedding']
  table = table.value if hasattr(table, 'value') else table
  buckets = relative_position_bucket(pos[None, :] - pos[:, None], True, 8, 16)   # (T, S)
  expected = np.transpose(np.asarray(table)[np.asarray(buckets)], (2, 0, 1))[None]
  np.testing.assert_array_equal(module.apply(variables, pos, pos), expected)
