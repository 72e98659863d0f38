"""T5 (v1.0 and v1.1): encoder-decoder, RMSNorm, no dense biases, relative position bias.

v1.0: ReLU feed-forward, LM head tied to the shared embedding with logits scaled by
d_model**-0.5. v1.1: gated GELU, untied LM head. The relative position bias is one value per
stack (a masks.RelativeBias: bidirectional buckets in the encoder, causal ones in the
decoder), handed to every layer in its attention mask: the flash kernel reads it as it is, the
other paths get its matrix, made once per stack (layers.stack_bias).
"""
import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from pretrain_jax import ops
from pretrain_jax.models import flops, layers, masks
from pretrain_jax.models.config import ModelConfig
from pretrain_jax.models.family import Family, TaskLayout


class RelativePositionBias(nn.Module):
  """-> the stack's bias value, masks.RelativeBias: its (buckets, N) table, which the flash
  kernel reads per block and the other paths make a (1, N, T, S) matrix of."""
  cfg: ModelConfig
  bidirectional: bool

  @nn.compact
  def __call__(self):
    cfg = self.cfg
    table = self.param('rel_embedding', layers.partitioned(
        nn.initializers.normal(1.0), ('relpos_buckets', 'heads')),
        (cfg.relative_buckets, cfg.num_heads), cfg.param_dtype)
    return masks.RelativeBias(table, bidirectional=self.bidirectional,
                              max_distance=cfg.relative_max_distance, dtype=cfg.dtype)


def _dropout(cfg, x):
  return ops.Dropout(cfg.dropout_rate)(x, deterministic=cfg.deterministic)


class EncoderBlock(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, mask):                                           # (B, T, E)
    cfg = self.cfg
    h = layers.norm(cfg, 'pre_attention_norm')(x)
    x = x + _dropout(cfg, layers.MultiHeadAttention(cfg, name='attention')(h, h, mask))
    h = layers.norm(cfg, 'pre_mlp_norm')(x)
    return x + _dropout(cfg, layers.MLP(cfg, name='mlp')(h)), None


class DecoderBlock(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, encoded, self_mask, cross_mask, decode_index):   # (B, T, E)
    cfg = self.cfg
    h = layers.norm(cfg, 'pre_self_attention_norm')(x)
    x = x + _dropout(cfg, layers.MultiHeadAttention(cfg, name='self_attention')(
        h, h, self_mask, decode_index))
    h = layers.norm(cfg, 'pre_cross_attention_norm')(x)
    x = x + _dropout(cfg, layers.MultiHeadAttention(cfg, name='encoder_decoder_attention')(
        h, encoded, cross_mask))
    h = layers.norm(cfg, 'pre_mlp_norm')(x)
    return x + _dropout(cfg, layers.MLP(cfg, name='mlp')(h)), None


class Encoder(nn.Module):
  cfg: ModelConfig
  shared: nn.Module

  @nn.compact
  def __call__(self, tokens, segment_ids):                               # (B, T)
    cfg = self.cfg
    x = self.shared(tokens)                                              # (B, T, E)
    x = _dropout(cfg, x) if cfg.embedding_dropout else x
    length = tokens.shape[1]
    bias = layers.stack_bias(cfg, RelativePositionBias(cfg, bidirectional=True,
                                                       name='relpos_bias')(),
                             length, length, rows=tokens.shape[0])
    x = layers.apply_stack(EncoderBlock, cfg, cfg.num_layers, 'layers', x,
                           masks.AttentionMask(q_segment_ids=segment_ids, bias=bias))
    return _dropout(cfg, layers.norm(cfg, 'final_norm')(x))              # (B, T, E)


class Decoder(nn.Module):
  """__call__ -> the final norm's output (B, T, E); `logits` is the LM head."""
  cfg: ModelConfig
  shared: nn.Module

  def setup(self):
    if not self.cfg.tie_embeddings:
      self.lm_head = layers.dense(self.cfg, self.cfg.vocab_size, ['embed'], ['vocab'], 'lm_head',
                                  init=nn.initializers.normal(self.cfg.emb_dim ** -0.5))
    if self.cfg.decode:
      self.decode_cache = layers.DecodeCache()

  @nn.compact
  def __call__(self, tokens, encoded, segment_ids, encoder_segment_ids):  # (B, T), (B, S, E)
    cfg = self.cfg
    length = tokens.shape[1]
    # Training: packing/padding segment ids AND causal (a flag). Decode: the whole cache mask.
    decode_index = None
    relative = RelativePositionBias(cfg, bidirectional=False, name='relpos_bias')()
    if cfg.decode:
      dense, decode_index, _ = self.decode_cache(segment_ids)
      self_mask = masks.AttentionMask(
          dense_mask=dense, bias=relative.dense(length, dense.shape[-1], decode_index))
    else:
      bias = layers.stack_bias(cfg, relative, length, length, rows=tokens.shape[0])
      self_mask = masks.AttentionMask(q_segment_ids=segment_ids, causal=True, bias=bias)
    cross_mask = masks.AttentionMask(q_segment_ids=segment_ids,
                                     kv_segment_ids=encoder_segment_ids)
    x = self.shared(tokens)                                              # (B, T, E)
    x = _dropout(cfg, x) if cfg.embedding_dropout else x
    x = layers.apply_stack(DecoderBlock, cfg, cfg.decoder_layers, 'layers', x, encoded,
                           self_mask, cross_mask, decode_index)
    return _dropout(cfg, layers.norm(cfg, 'final_norm')(x))              # (B, T, E)

  def logits(self, x):                                                   # (..., E)
    if self.cfg.tie_embeddings:
      return self.shared.attend(x * self.cfg.emb_dim ** -0.5).astype(jnp.float32)  # (..., V)
    return self.lm_head(x).astype(jnp.float32)

  def head_inputs(self, x):                                              # (..., E)
    if self.cfg.tie_embeddings:
      return layers.embedding_head(self.shared, x * self.cfg.emb_dim ** -0.5)
    return layers.dense_head(self.lm_head, x)


class T5(nn.Module):
  """__call__(encoder_input_tokens (B, S), decoder_input_tokens (B, T), ...) -> (B, T, V).

  `encode` and `decode` are separate methods so generation runs the encoder once. `hidden`
  (same arguments as __call__) -> the decoder's final states (B, T, E) and `logits(hidden)` is
  the LM head, so a loss can run the head a chunk of positions at a time.
  """
  cfg: ModelConfig

  def setup(self):
    self.shared = layers.embed(self.cfg, self.cfg.vocab_size, ('vocab', 'embed'), 'shared',
                               std=1.0)
    self.encoder = Encoder(self.cfg, self.shared)
    self.decoder = Decoder(self.cfg, self.shared)

  def encode(self, encoder_input_tokens, *, encoder_segment_ids=None, encoder_positions=None):
    del encoder_positions  # relative attention only needs token order within the row
    if encoder_segment_ids is None:
      encoder_segment_ids = jnp.ones_like(encoder_input_tokens)
    return self.encoder(encoder_input_tokens, encoder_segment_ids)

  def decoder_hidden(self, encoded, decoder_input_tokens, *, encoder_segment_ids=None,
                     decoder_segment_ids=None, decoder_positions=None):
    del decoder_positions
    if encoder_segment_ids is None:
      encoder_segment_ids = jnp.ones(encoded.shape[:2], jnp.int32)
    if decoder_segment_ids is None:
      decoder_segment_ids = jnp.ones_like(decoder_input_tokens)
    return self.decoder(decoder_input_tokens, encoded, decoder_segment_ids, encoder_segment_ids)

  def logits(self, hidden):                                              # (..., E)
    return self.decoder.logits(hidden)                                   # (..., V)

  def head_inputs(self, hidden):                                         # (..., E)
    """`logits`' head as a layers.LMHead, for a loss that computes the logits itself."""
    return self.decoder.head_inputs(hidden)

  def decode(self, encoded, decoder_input_tokens, **kwargs):
    """Logits (B, T, V) of the decoder given the encoder's output (kwargs: decoder_hidden's)."""
    return self.logits(self.decoder_hidden(encoded, decoder_input_tokens, **kwargs))

  def hidden(self, encoder_input_tokens, decoder_input_tokens, *, encoder_segment_ids=None,
             decoder_segment_ids=None, encoder_positions=None, decoder_positions=None):
    encoded = self.encode(encoder_input_tokens, encoder_segment_ids=encoder_segment_ids,
                          encoder_positions=encoder_positions)
    return self.decoder_hidden(encoded, decoder_input_tokens,
                               encoder_segment_ids=encoder_segment_ids,
                               decoder_segment_ids=decoder_segment_ids,
                               decoder_positions=decoder_positions)

  def __call__(self, encoder_input_tokens, decoder_input_tokens, **kwargs):
    return self.logits(self.hidden(encoder_input_tokens, decoder_input_tokens, **kwargs))


def example_batch(tokens, rng=None, *, nsp=False, target_len=None) -> dict:
  """A span-corruption-shaped batch from (B, T + 1) ids: encoder inputs are the first T,
  targets the first `target_len` (default T // 2), decoder inputs the targets shifted right."""
  del rng, nsp
  b, t = tokens.shape[0], tokens.shape[1] - 1
  target_len = target_len or t // 2
  targets = tokens[:, :target_len]
  ones, dec_ones = np.ones((b, t), np.int32), np.ones_like(targets)
  def positions(n):
    return np.broadcast_to(np.arange(n, dtype=np.int32), (b, n)).copy()
  return {'encoder_input_tokens': tokens[:, :-1], 'encoder_segment_ids': ones,
          'encoder_positions': positions(t),
          'decoder_input_tokens': np.pad(targets[:, :-1], [(0, 0), (1, 0)]),
          'decoder_target_tokens': targets, 'decoder_segment_ids': dec_ones,
          'decoder_positions': positions(target_len),
          'decoder_loss_weights': dec_ones.astype(np.float32)}


FAMILY = Family(hf_inputs=(('input_ids', 'encoder_input_tokens'),
                           ('attention_mask', 'encoder_segment_ids'),
                           ('decoder_input_ids', 'decoder_input_tokens'),
                           ('decoder_attention_mask', 'decoder_segment_ids')),
                name='t5', model=T5, objective='span_corruption',
                input_keys=('encoder_input_tokens', 'decoder_input_tokens'),
                kwarg_keys=('encoder_segment_ids', 'decoder_segment_ids', 'encoder_positions',
                            'decoder_positions'),
                target_key='decoder_target_tokens', weight_key='decoder_loss_weights',
                example_batch=example_batch, forward_flops=flops.encoder_decoder_flops,
                generation='fill_spans', task_layout=TaskLayout(text_to_text=True),
                encoder_decoder=True)
