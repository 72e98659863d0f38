"""Analytic model FLOPs (matmuls only) for MFU, as PaLM / MaxText count them.

A (m, k) x (k, n) matmul is 2*m*k*n FLOPs. Training = 3x forward (backward is twice forward).
Counted: every dense projection, the unembedding (all positions, as the models compute it, or
`head_positions` per row with train.max_predictions_per_seq), and attention scores + values:
4*B*T*S*N*H forward, halved for causal self-attention.
Not counted: embeddings lookups, norms, softmax, activations, optimizer (all sub-1% at scale).
"""
from pretrain_jax.models.config import ModelConfig


def _block_dense(cfg: ModelConfig, cross: bool = False) -> int:
  """Dense FLOPs per token of one transformer block (self-attn, optional cross-attn, MLP)."""
  e, nh = cfg.emb_dim, cfg.num_heads * cfg.head_dim
  attention = 2 * e * nh * 4                   # q, k, v, out projections
  mlp_mats = 3 if cfg.activation.startswith('gated') else 2
  mlp = 2 * e * cfg.mlp_dim * mlp_mats
  return attention * (2 if cross else 1) + mlp


def _attention(cfg: ModelConfig, batch: int, q_len: int, kv_len: int, causal: bool) -> float:
  """Scores (QK^T) and weighted values, one layer, forward."""
  flops = 4.0 * batch * q_len * kv_len * cfg.num_heads * cfg.head_dim
  return flops / 2 if causal else flops


NO_LM_HEAD = -1   # head_positions of a step that never runs the LM head (classification)


def head_length(length: int, head_positions: int) -> int:
  """Positions per row the LM head runs on (all, or train.max_predictions_per_seq; none for
  NO_LM_HEAD)."""
  if head_positions == NO_LM_HEAD:
    return 0
  return min(head_positions, length) if head_positions > 0 else length


def lm_head_flops(cfg: ModelConfig, batch: int, length: int, head_positions: int = 0) -> float:
  """The unembedding over `length` positions per row (or head_positions of them)."""
  return batch * head_length(length, head_positions) * 2.0 * cfg.emb_dim * cfg.vocab_size


def stack_flops(cfg: ModelConfig, batch: int, seq_len: int, causal: bool,
                head_positions: int = 0) -> float:
  """A single self-attention stack (GPT, BERT) plus its unembedding."""
  total = cfg.num_layers * (batch * seq_len * _block_dense(cfg)
                            + _attention(cfg, batch, seq_len, seq_len, causal))
  return total + lm_head_flops(cfg, batch, seq_len, head_positions)


def encoder_decoder_flops(cfg: ModelConfig, batch: int, seq_len: int, target_len: int,
                          head_positions: int = 0) -> float:
  """T5: encoder over seq_len, causal decoder over target_len with cross-attention, head."""
  e = cfg.emb_dim
  enc_tokens, dec_tokens = batch * seq_len, batch * target_len
  total = cfg.num_layers * (enc_tokens * _block_dense(cfg)
                            + _attention(cfg, batch, seq_len, seq_len, False))
  # Cross-attention k/v project encoder tokens; q/out project decoder tokens.
  nh = cfg.num_heads * cfg.head_dim
  dec_dense = dec_tokens * _block_dense(cfg, cross=True) - dec_tokens * 2 * e * nh * 2 \
      + enc_tokens * 2 * e * nh * 2
  total += cfg.decoder_layers * (dec_dense
                                 + _attention(cfg, batch, target_len, target_len, True)
                                 + _attention(cfg, batch, target_len, seq_len, False))
  return total + lm_head_flops(cfg, batch, target_len, head_positions)
