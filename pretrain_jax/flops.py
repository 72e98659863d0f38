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


def forward_flops(cfg: ModelConfig, batch: int, seq_len: int, target_len: int = 0,
                  head_positions: int = 0) -> float:
  """Matmul FLOPs of one forward pass over (batch, seq_len) [T5: plus (batch, target_len)];
  the LM head over min(head_positions, length) positions per row when head_positions > 0."""
  e, v = cfg.emb_dim, cfg.vocab_size
  head_len = lambda length: min(head_positions, length) if head_positions > 0 else length
  if cfg.family == 't5':
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
    return total + batch * head_len(target_len) * 2 * e * v
  tokens = batch * seq_len
  total = cfg.num_layers * (tokens * _block_dense(cfg)
                            + _attention(cfg, batch, seq_len, seq_len, cfg.family == 'gpt'))
  head_tokens = batch * head_len(seq_len)
  total += head_tokens * 2 * e * v             # unembedding
  if cfg.family == 'bert':
    total += head_tokens * 2 * e * e           # MLM transform
    if cfg.nsp:
      total += batch * (2 * e * e + 2 * e * 2)  # pooler + classifier
  return total


def train_flops(cfg: ModelConfig, batch: int, seq_len: int, target_len: int = 0,
                head_positions: int = 0) -> float:
  """Model FLOPs of one training step: 3 x forward (rematerialisation is NOT counted)."""
  return 3.0 * forward_flops(cfg, batch, seq_len, target_len, head_positions)
