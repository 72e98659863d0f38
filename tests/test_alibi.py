"""ALiBi positions for BERT (position_embedding='alibi'): the bias, its use, and its limits."""
import jax.numpy as jnp
import numpy as np
import pytest

from modeling import forward, init, tiny, tokens
from pretrain_jax.hf.family import learned_position_problems
from pretrain_jax.models import ModelConfig
from pretrain_jax.models.layers import alibi_bias


def test_alibi_bias_literal():
  # 2 heads, bias_max 2: slopes 2**-1 and 2**-2; distances |i - j| of rows 0, 1, 2; one
  # (1, N, T, T) constant for the whole batch.
  distance = np.array([[0, 1, 2], [1, 0, 1], [2, 1, 0]], np.float32)
  np.testing.assert_array_equal(alibi_bias(3, 2, 2.0), [[-0.5 * distance, -0.25 * distance]])


def test_alibi_bert_sees_only_relative_positions():
  """Shifting every position by a constant changes nothing with ALiBi, and does with the
  absolute (sinusoidal) positions it replaces: the bias is the only position signal. (Packed
  documents, whose positions restart, are test_models' packing test.)"""
  x = tokens((1, 9))
  pos = jnp.arange(9)[None]
  for kind, invariant in (('alibi', True), ('sinusoidal', False)):
    cfg = tiny('bert', position_embedding=kind)
    params = init(cfg)
    a = forward(cfg, params, x, positions=pos)
    b = forward(cfg, params, x, positions=pos + 5)
    assert np.allclose(a, b, atol=1e-5) == invariant, kind


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
])
def test_alibi_config_errors(options, match):
  family = options.pop('family')
  with pytest.raises(ValueError, match=match):
    tiny(family, **options)


def test_alibi_config_round_trips_and_is_not_exported_to_hugging_face():
  cfg = tiny('bert', position_embedding='alibi', alibi_bias_max=1.0)
  assert ModelConfig.from_config(cfg.to_dict()) == cfg
  assert any("'alibi'" in p for p in learned_position_problems(cfg))
