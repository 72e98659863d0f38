"""ops/cpu.py's matmul: jnp.dot's values and gradients, with the weight gradient in the form
XLA:CPU sends to its fast library (no dot contracting the LHS's first axis)."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals

from pretrain_jax.models.layers import REMAT
from pretrain_jax.ops.cpu import matmul


@pytest.mark.parametrize('k,f', [(16, 48), (48, 16), (32, 32)])   # both transpose forms
def test_values_and_gradients_are_jnp_dot(k, f):
  kx, kw, kd = jax.random.split(jax.random.key(0), 3)
  x, w = jax.random.normal(kx, (40, k)), jax.random.normal(kw, (k, f))
  dy = jax.random.normal(kd, (40, f))
  y, vjp = jax.vjp(matmul, x, w)
  y_ref, vjp_ref = jax.vjp(jnp.dot, x, w)
  np.testing.assert_allclose(y, y_ref, rtol=1e-6)
  for got, want in zip(vjp(dy), vjp_ref(dy), strict=True):
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(vjp(dy)[1], np.asarray(x).T @ np.asarray(dy), rtol=1e-5, atol=1e-5)


def test_bfloat16_gradients_keep_dtypes():
  x = jnp.ones((8, 4), jnp.bfloat16)
  w = jnp.ones((4, 6), jnp.bfloat16)
  dx, dw = jax.grad(lambda x, w: jnp.sum(matmul(x, w).astype(jnp.float32)), (0, 1))(x, w)
  assert dx.dtype == dw.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(dw, np.float32), np.full((4, 6), 8.0))


@pytest.mark.parametrize('k,f', [(64, 256), (256, 64)])
def test_cpu_weight_gradient_contracts_no_first_axis(k, f):
  assert jax.default_backend() == 'cpu'
  x, w = jnp.ones((128, k)), jnp.ones((k, f))
  grads = jax.jit(jax.grad(lambda x, w: jnp.sum(matmul(x, w) ** 2), (0, 1)))
  hlo = grads.lower(x, w).compile().as_text()
  dots = re.findall(r'lhs_contracting_dims=\{(\d+)\}', hlo)
  assert len(dots) >= 3                              # forward, dx, dw
  assert '0' not in dots, hlo                        # plain jnp.dot's dw contracts axis 0
  plain = jax.jit(jax.grad(lambda x, w: jnp.sum(jnp.dot(x, w) ** 2), (0, 1)))
  assert '0' in re.findall(r'lhs_contracting_dims=\{(\d+)\}', plain.lower(x, w).compile().as_text())


def test_remat_minimal_still_saves_the_matmul_output(capsys):
  """The custom_vjp's forward dot is visible to layers.REMAT['minimal'] (saved, not redone)."""

  def saved(policy):
    block = jax.checkpoint(lambda x, w1, w2: matmul(jax.nn.relu(matmul(x, w1)), w2),
                           policy=policy)
    print_saved_residuals(lambda *a: jnp.sum(block(*a) ** 2),
                          jnp.ones((32, 16)), jnp.ones((16, 64)), jnp.ones((64, 16)))
    return capsys.readouterr().out
  assert 'f32[32,64]' in saved(REMAT['minimal'])       # the hidden layer's dot output
  assert 'f32[32,64]' not in saved(REMAT['full'])
