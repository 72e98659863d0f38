"""ALiBi positions for BERT (position_embedding='alibi'): the bias, its use, and its limits."""
import jax.numpy as jnp
import numpy as np
import pytest
from modeling import forward, init, tiny, tokens

from pretrain_jax.hf.record import learned_position_problems
from pretrain_jax.models import ModelConfig
from pretrain_jax.models.layers import alibi_bias, alibi_slopes


def test_alibi_bias_literal():
  # 2 heads, bias_max 2: slopes 2**-1 and 2**-2; distances |i - j| of rows 0, 1, 2; one
  # (1, N, T, T) constant for the whole batch.
  distance = np.array([[0, 1, 2], [1, 0, 1], [2, 1, 0]], np.float32)
  np.testing.assert_array_equal(alibi_bias(3, 2, 2.0), [[-0.5 * distance, -0.25 * distance]])


def test_alibi_slopes_for_heads_not_a_power_of_two_interleave_as_mpt():
  np.testing.assert_array_equal(alibi_slopes(4, 8.0), 2.0 ** -np.array([2., 4., 6., 8.]))
  # 12 heads: the 16-head slopes 2**-(h / 2), even h first, then odd, cut to 12.
  np.testing.assert_allclose(alibi_slopes(12, 8.0), 2.0 ** -np.array(
      [1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5]), rtol=1e-7)


def test_alibi_is_the_only_order_signal():
  """With no position embedding, only the bias tells positions apart. Being symmetric, it
  keeps reversal equivariance (reversed in, reversed out) but breaks it for a rotation, which
  gives tokens other neighbours; with slopes ~0 a rotation only rotates the outputs."""
  x = tokens((1, 9))
  cfg = tiny('bert', position_embedding='alibi', alibi_bias_max=1.0)
  params = init(cfg)
  forward_then_reverse = np.asarray(forward(cfg, params, x))[:, ::-1]
  reverse_then_forward = np.asarray(forward(cfg, params, x[:, ::-1]))
  # A mirror-symmetric bias: reversed in, reversed out...
  np.testing.assert_allclose(forward_then_reverse, reverse_then_forward, atol=1e-5)
  # ... but a token's output depends on who its neighbours are: rotating the row by one moves
  # every token to other neighbours (no longer a mirror image).
  rotated = np.asarray(forward(cfg, params, jnp.roll(x, 1, axis=1)))
  assert np.abs(np.roll(np.asarray(forward(cfg, params, x)), 1, axis=1) - rotated).max() > 5e-4
  # Without the bias (slopes ~0), the same rotation only rotates the outputs.
  flat = cfg.replace(alibi_bias_max=64.0)
  np.testing.assert_allclose(np.roll(np.asarray(forward(flat, params, x)), 1, axis=1),
                             np.asarray(forward(flat, params, jnp.roll(x, 1, axis=1))),
                             atol=1e-5)


def test_alibi_slopes_reach_the_logits():
  cfg = tiny('bert', position_embedding='alibi')
  params = init(cfg)
  x = tokens((2, 9))
  steep = forward(cfg.replace(alibi_bias_max=1.0), params, x)
  gentle = forward(cfg.replace(alibi_bias_max=8.0), params, x)
  assert np.abs(np.asarray(steep) - np.asarray(gentle)).max() > 1e-3
  # No position embedding table is created.
  assert 'position_embeddings' not in params


@pytest.mark.parametrize('options,match', [
    (dict(family='gpt', position_embedding='alibi'), "position_embedding='alibi'.*gpt"),
    (dict(family='bert', position_embedding='alibi', alibi_bias_max=0), 'alibi_bias_max=0'),
    (dict(family='bert', alibi_bias_max=float('inf')), 'alibi_bias_max=inf'),
    (dict(family='bert', alibi_bias_max=True), 'alibi_bias_max=True'),
])
def test_alibi_config_errors(options, match):
  family = options.pop('family')
  with pytest.raises(ValueError, match=match):
    tiny(family, **options)


def test_alibi_config_round_trips_and_is_not_exported_to_hugging_face():
  cfg = tiny('bert', position_embedding='alibi', alibi_bias_max=1.0)
  assert ModelConfig.from_config(cfg.to_dict()) == cfg
  assert any("'alibi'" in p for p in learned_position_problems(cfg))
