"""The analytic FLOP count against hand arithmetic and the 6*N*D rule."""
import numpy as np
import pytest
from modeling import tiny

from pretrain_jax.models import ModelConfig, cost, family_of, flops


def test_gpt_forward_flops_by_hand():
  cfg = tiny('gpt')  # E=32, N*H=32, F=64, V=97, L=2
  b, t = 3, 10
  per_token_block = 2 * 32 * 32 * 4 + 2 * 32 * 64 * 2
  attention = 4 * b * t * t * 32 / 2
  expected = 2 * (b * t * per_token_block + attention) + b * t * 2 * 32 * 97
  assert cost.forward_flops(cfg, b, t) == expected
  assert cost.train_flops(cfg, b, t) == 3 * expected


def test_bidirectional_attention_costs_twice_causal():
  gpt, bert = tiny('gpt'), tiny('bert')
  extra_bert = 4 * 16 * 2 * 32 * 32           # MLM transform on every token
  diff = cost.forward_flops(bert, 4, 16) - cost.forward_flops(gpt, 4, 16) - extra_bert
  assert diff == 2 * (4 * 4 * 16 * 16 * 32 / 2)


def test_gpt2_small_close_to_6nd():
  cfg = ModelConfig(family='gpt', vocab_size=50257, num_layers=12, emb_dim=768, num_heads=12,
                    head_dim=64, mlp_dim=3072, max_len=1024)
  tokens = 8 * 1024
  non_embedding = 12 * (4 * 768 * 768 + 2 * 768 * 3072)
  six_nd = 6 * (non_embedding + 768 * 50257) * tokens
  attention = 3 * 12 * 4 * 8 * 1024 * 1024 * 768 / 2
  assert cost.train_flops(cfg, 8, 1024) == pytest.approx(six_nd + attention, rel=1e-9)


def test_t5_counts_cross_attention_on_encoder_length():
  cfg = tiny('t5')
  short = cost.forward_flops(cfg, 2, 16, 8)
  longer = cost.forward_flops(cfg, 2, 32, 8)
  # Doubling the encoder length doubles encoder cost, cross k/v projections and cross scores.
  assert longer > short
  per_enc_token = 2 * flops._block_dense(cfg) + 2 * 2 * 32 * 32 * 2
  def enc_attention(s):
    return 2 * 4 * 2 * s * s * 32
  def cross(s):
    return 2 * 4 * 2 * 8 * s * 32
  assert longer - short == 2 * 16 * per_enc_token + enc_attention(32) - enc_attention(16) \
      + cross(32) - cross(16)


def test_head_counted_on_max_predictions_positions():
  cfg = ModelConfig(family='bert', vocab_size=1000, num_layers=1, emb_dim=8, num_heads=2,
                    head_dim=4, mlp_dim=16)
  whole, gathered = cost.forward_flops(cfg, 2, 16), cost.forward_flops(cfg, 2, 16,
                                                                         head_positions=4)
  assert whole - gathered == 2 * (16 - 4) * (2 * 8 * 1000 + 2 * 8 * 8)   # unembedding + transform
  assert cost.forward_flops(cfg, 2, 16, head_positions=32) == whole


def test_a_classification_step_counts_no_lm_head_and_a_linear_probe_no_backward():
  """Fine-tuning's MFU counted the LM head, which a classification step never runs, and a
  linear probe's backbone backward, which stop_gradient skips (review K: 80% MFU shown)."""
  for family in ('gpt', 'bert'):
    cfg = tiny(family)
    b, t = 3, 10
    headless = cost.forward_flops(cfg, b, t) - b * t * 2 * 32 * 97 - (
        b * t * 2 * 32 * 32 if family == 'bert' else 0)          # unembedding (+ transform)
    assert cost.train_flops(cfg, b, t, lm_head=False) == 3 * headless
    assert cost.train_flops(cfg, b, t, lm_head=False, frozen_backbone=True) == headless
    pretrain = family_of(cfg).init_batch(t)
    pretrain = {k: np.repeat(v, b, axis=0) for k, v in pretrain.items()}
    classify = {k: v for k, v in pretrain.items() if k != family_of(cfg).target_key}
    assert cost.batch_cost(cfg, pretrain) == (b * t, cost.train_flops(cfg, b, t))
    assert cost.batch_cost(cfg, classify) == (b * t, 3 * headless)
    assert cost.batch_cost(cfg, classify, frozen_backbone=True) == (b * t, headless)
