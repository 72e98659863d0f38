"""GPT-2: pre-LN decoder, learned positions, GELU (tanh), final LayerNorm, tied LM head
(`tie_embeddings=False`: a separate `lm_head` dense layer with bias)."""
import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from pretrain_jax import ops
from pretrain_jax.models import flops, layers, masks
from pretrain_jax.models.config import ModelConfig
from pretrain_jax.models.family import Family, Head


class GPTBlock(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, mask, decode_index):                 # (B, T, E)
    cfg = self.cfg
    residual_scale = (2 * cfg.num_layers) ** -0.5             # GPT-2's init of residual outputs
    def drop(y):
      return ops.Dropout(cfg.dropout_rate)(y, deterministic=cfg.deterministic)
    h = layers.norm(cfg, 'ln_1')(x)
    attn = layers.MultiHeadAttention(cfg, residual_scale, name='attn')
    x = x + drop(attn(h, h, mask, decode_index))
    h = layers.norm(cfg, 'ln_2')(x)
    x = x + drop(layers.MLP(cfg, residual_scale, name='mlp')(h))
    return x, None


class GPT(nn.Module):
  """Causal LM. __call__(inputs (B, T), segment_ids, positions, prefix) -> logits (B, T, V).

  `hidden` (same arguments) -> the final LayerNorm's output (B, T, E) and `logits(hidden)` is
  the LM head, so a loss can run the head a chunk of positions at a time.
  The mask is decided here, as one masks.AttentionMask every layer reads: the packing/padding
  segment ids AND causal (a flag: cuDNN and splash skip the blocks it hides). With
  cfg.causal=False the same stack gets the packing/padding mask alone: a bidirectional encoder
  (trained with MLM). With cfg.prefix_lm the (B, T) `prefix` flags (1 on each document's
  leading tokens) see each other both ways: a prefix LM. The mask is the only difference.
  In decode mode (cfg.decode) the `decode_cache` (layers.DecodeCache) keeps the cache index and
  the cached keys' segment ids: each call appends its T tokens and attends over everything
  cached, with the whole cache mask given explicitly (a prefix LM's prompt, fed in one call
  with its `prefix`, sees itself both ways).
  """
  cfg: ModelConfig

  def setup(self):
    cfg = self.cfg
    self.wte, self.embed_scale = layers.token_embedding(cfg, 'wte')
    if not cfg.tie_embeddings:
      self.lm_head = layers.dense(cfg, cfg.vocab_size, ['embed'], ['vocab'], 'lm_head',
                                  fan_in=cfg.emb_dim, use_bias=cfg.head_bias)
    if cfg.num_classes:  # GPT2ForSequenceClassification's `score`: no bias
      self.score = layers.dense(cfg, cfg.num_classes, ['embed'], ['classes'], 'score',
                                fan_in=cfg.emb_dim, use_bias=False)
    if cfg.decode:
      self.decode_cache = layers.DecodeCache(prefix_lm=cfg.prefix_lm)

  @nn.compact
  def hidden(self, inputs, *, segment_ids=None, positions=None, prefix=None):
    cfg = self.cfg
    if segment_ids is None:
      segment_ids = jnp.ones_like(inputs)
    if prefix is not None and not cfg.prefix_lm:
      raise ValueError('a prefix was given to a GPT with model.prefix_lm=False; it has no '
                       'bidirectional prefix (expected prefix=None, or a prefix-LM model)')
    decode_index = None
    if cfg.decode:       # the whole mask over the cache, as a matrix
      dense, decode_index, cache_positions = self.decode_cache(segment_ids, prefix)
      mask = masks.AttentionMask(dense_mask=dense)
      positions = cache_positions if positions is None else positions
    else:
      mask = masks.AttentionMask(q_segment_ids=segment_ids, causal=cfg.causal, prefix=prefix)
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
    x = self.wte(inputs) * self.embed_scale                               # (B, T, E)
    if cfg.position_embedding == 'learned':
      x = x + layers.embed(cfg, cfg.max_len, ('position', 'embed'), 'wpe', 0.01,
                           one_hot=True)(positions)
    else:
      x = x + layers.sinusoidal_positions(positions, cfg.emb_dim).astype(cfg.dtype)
    if cfg.embedding_dropout:
      x = ops.Dropout(cfg.dropout_rate)(x, deterministic=cfg.deterministic)
    x = layers.apply_stack(GPTBlock, cfg, cfg.num_layers, 'h', x, mask, decode_index)
    return layers.norm(cfg, 'ln_f')(x)                                    # (B, T, E)

  def logits(self, hidden):                                               # (..., E)
    head = self.wte.attend if self.cfg.tie_embeddings else self.lm_head
    return layers.constrain(head(hidden), 'batch', 'length', 'vocab').astype(jnp.float32)

  def head_inputs(self, hidden):                                          # (..., E)
    """`logits`' head as a layers.LMHead, for a loss that computes the logits itself."""
    if self.cfg.tie_embeddings:
      return layers.embedding_head(self.wte, hidden)
    return layers.dense_head(self.lm_head, hidden)

  def classify(self, hidden, segment_ids=None):                           # (B, T, E)
    """Class logits (B, C) from each row's LAST real token (the last nonzero segment id, so
    right and left padding both work); the one place a causal model has read the whole row."""
    if segment_ids is None:
      segment_ids = jnp.ones(hidden.shape[:2], jnp.int32)
    t = hidden.shape[1]
    last = t - 1 - jnp.argmax(jnp.flip(segment_ids != 0, axis=1), axis=1)  # (B,)
    h = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]   # (B, E)
    return self.score(h).astype(jnp.float32)                              # (B, C)

  def __call__(self, inputs, *, segment_ids=None, positions=None, prefix=None):
    """LM logits (B, T, V); with cfg.num_classes the class logits (B, C) instead."""
    h = self.hidden(inputs, segment_ids=segment_ids, positions=positions, prefix=prefix)
    return self.classify(h, segment_ids) if self.cfg.num_classes else self.logits(h)


def example_batch(tokens, rng=None, *, nsp=False, target_len=None) -> dict:
  """A CLM batch from (B, T + 1) ids: inputs, next-token targets, one document per row."""
  del rng, nsp, target_len
  b, t = tokens.shape[0], tokens.shape[1] - 1
  return {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:],
          'segment_ids': np.ones((b, t), np.int32),
          'positions': np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
          'loss_weights': np.ones((b, t), np.float32)}


def forward_flops(cfg, batch, seq_len, target_len=0, head_positions=0):
  del target_len
  return flops.stack_flops(cfg, batch, seq_len, True, head_positions)


FAMILY = Family(hf_inputs=(('input_ids', 'inputs'), ('attention_mask', 'segment_ids')),
                name='gpt', model=GPT, objective='clm', input_keys=('inputs',),
                kwarg_keys=('segment_ids', 'positions', 'prefix'), target_key='targets',
                weight_key='loss_weights', example_batch=example_batch,
                forward_flops=forward_flops, generation='continue',
                heads=(Head(name='class', method='classify', label_key='labels',
                            enabled='num_classes', keys=('segment_ids',), params=('score',)),))
