"""Shared layers: the one-hot embedding lookup is the gather lookup, values and gradients."""
import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from modeling import tiny

from pretrain_jax.models import layers
from pretrain_jax.models.masks import relative_position_bucket
from pretrain_jax.models.t5 import RelativePositionBias


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


def _scatter_dtypes(jaxpr):
  """dtypes of every scatter-add operand in a (closed) jaxpr, nested calls included."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'scatter-add':
      found.append(eqn.invars[0].aval.dtype)
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      found += _scatter_dtypes(sub)
  return found


def test_bf16_embedding_gathers_f32_rows_and_scatters_its_gradient_in_f32():
  table, ids = _table_and_ids()
  embed = layers.Embed(7, 5, dtype=jnp.bfloat16)
  variables = {'params': {'embedding': table}}
  out = embed.apply(variables, ids)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_array_equal(out, table[ids].astype(jnp.bfloat16))
  grad = jax.grad(lambda t: jnp.sum(embed.apply({'params': {'embedding': t}}, ids)
                                    .astype(jnp.float32)))
  # A bf16 scatter-add is a compare-and-swap loop on GPUs (85 ms vs 0.3 ms measured for BERT)
  dtypes = _scatter_dtypes(jax.make_jaxpr(grad)(table).jaxpr)
  assert dtypes == [jnp.float32], dtypes
  np.testing.assert_array_equal(grad(table)[6], np.full(5, 3.0))   # id 6 appears 3 times
  with pytest.raises(ValueError, match='must be integers'):
    embed.apply(variables, ids.astype(jnp.float32))


def test_relative_position_bias_is_the_table_at_the_buckets():
  cfg = tiny('t5', relative_buckets=8, relative_max_distance=16).resolved('cpu')
  module = RelativePositionBias(cfg, bidirectional=True)
  pos = jnp.arange(10)
  variables = module.init(jax.random.key(0))
  table = variables['params']['rel_embedding']
  table = table.value if hasattr(table, 'value') else table
  buckets = relative_position_bucket(pos[None, :] - pos[:, None], True, 8, 16)   # (T, S)
  expected = np.transpose(np.asarray(table)[np.asarray(buckets)], (2, 0, 1))[None]
  np.testing.assert_array_equal(module.apply(variables).dense(10, 10), expected)
