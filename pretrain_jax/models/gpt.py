"""GPT-2: pre-LN decoder, learned positions, GELU (tanh), final LayerNorm, tied LM head
(`tie_embeddings=False`: a separate `lm_head` dense layer with bias)."""
import flax.linen as nn
import jax.numpy as jnp

from pretrain_jax import layers, masks
from pretrain_jax.dropout import Dropout
from pretrain_jax.models.config import ModelConfig


class GPTBlock(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, mask, decode_index):                 # (B, T, E)
    cfg = self.cfg
    residual_scale = (2 * cfg.num_layers) ** -0.5             # GPT-2's init of residual outputs
    drop = lambda y: Dropout(cfg.dropout_rate)(y, deterministic=cfg.deterministic)
    h = layers.norm(cfg, 'ln_1')(x)
    # Training: `mask` is the packing/padding mask and the causal part stays factored (cuDNN
    # skips the blocks it hides). Decode: `mask` is the whole cache mask.
    attn = layers.MultiHeadAttention(cfg, residual_scale, causal=not cfg.decode, name='attn')
    x = x + drop(attn(h, h, mask, None, decode_index))
    h = layers.norm(cfg, 'ln_2')(x)
    x = x + drop(layers.MLP(cfg, residual_scale, name='mlp')(h))
    return x, None


class GPT(nn.Module):
  """Causal LM. __call__(inputs (B, T), segment_ids, positions) -> logits (B, T, V).

  `hidden` (same arguments) -> the final LayerNorm's output (B, T, E) and `logits(hidden)` is
  the LM head, so a loss can run the head a chunk of positions at a time.
  The mask is decided here: the packing/padding mask from segment ids AND causal, the causal
  part handed to the attention core in factored form (`causal=True`) so cuDNN can skip it.
  In decode mode (cfg.decode) a `cache_index` and the cached keys' segment ids live in the
  `cache` collection: each call appends its T tokens and attends over everything cached.
  """
  cfg: ModelConfig

  def setup(self):
    cfg = self.cfg
    self.wte, self.embed_scale = layers.token_embedding(cfg, 'wte')
    if not cfg.tie_embeddings:
      self.lm_head = layers.dense(cfg, cfg.vocab_size, ['embed'], ['vocab'], 'lm_head',
                                  init=layers.param_init(cfg, cfg.emb_dim))

  @nn.compact
  def hidden(self, inputs, *, segment_ids=None, positions=None):
    cfg = self.cfg
    if segment_ids is None:
      segment_ids = jnp.ones_like(inputs)
    decode_index = None
    if cfg.decode:
      mask, decode_index, cache_positions = layers.decode_cache_mask(self, segment_ids)
      positions = cache_positions if positions is None else positions
    else:
      mask = masks.segment_mask(segment_ids)     # (B, 1, T, T); AND causal, given factored
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
    x = self.wte(inputs) * self.embed_scale                               # (B, T, E)
    if cfg.position_embedding == 'learned':
      x = x + layers.embed(cfg, cfg.max_len, ('position', 'embed'), 'wpe', 0.01,
                           one_hot=True)(positions)
    else:
      x = x + layers.sinusoidal_positions(positions, cfg.emb_dim).astype(cfg.dtype)
    x = Dropout(cfg.dropout_rate)(x, deterministic=cfg.deterministic)
    x = layers.apply_stack(GPTBlock, cfg, cfg.num_layers, 'h', x, mask, decode_index)
    return layers.norm(cfg, 'ln_f')(x)                                    # (B, T, E)

  def logits(self, hidden):                                               # (..., E)
    head = self.wte.attend if self.cfg.tie_embeddings else self.lm_head
    return head(hidden).astype(jnp.float32)                               # (..., V)

  def __call__(self, inputs, *, segment_ids=None, positions=None):
    return self.logits(self.hidden(inputs, segment_ids=segment_ids, positions=positions))
