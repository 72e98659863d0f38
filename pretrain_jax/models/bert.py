"""BERT: post-LN encoder, learned positions + token types, GELU (erf), MLM and NSP heads.

Positions: learned (the published BERT), fixed sinusoidal, or ALiBi (MosaicBERT: no position
embedding; a distance bias on every layer's attention logits: one masks.AlibiBias value in
the mask every layer reads, which the flash kernel computes per block and the other paths
get as a matrix made once here).
"""
import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from pretrain_jax import ops
from pretrain_jax.models import flops, layers, masks
from pretrain_jax.models.config import ModelConfig
from pretrain_jax.models.family import Family, Head, TaskLayout


class BertBlock(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, mask):                                # (B, T, E)
    cfg = self.cfg
    def drop(y):
      return ops.Dropout(cfg.dropout_rate)(y, deterministic=cfg.deterministic)
    x = layers.norm(cfg, 'attention_norm')(
        x + drop(layers.MultiHeadAttention(cfg, name='attention')(x, x, mask)))
    x = layers.norm(cfg, 'output_norm')(x + drop(layers.MLP(cfg, name='mlp')(x)))
    return x, None


class MLMTransform(nn.Module):
  """dense + activation + LayerNorm before the tied decoder."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x):                                                 # (B, T, E)
    cfg = self.cfg
    h = layers.dense(cfg, cfg.emb_dim, ['embed'], ['mlp'], 'dense')(x)
    return layers.norm(cfg, 'norm')(layers.activation_fn(cfg.activation)(h))


class BERT(nn.Module):
  """Masked-LM encoder.

  __call__(inputs (B, T), token_type_ids, segment_ids, positions) ->
  (mlm_logits (B, T, V) float32, nsp_logits (B, 2) float32 or None).
  `hidden` (same arguments) -> the encoder's output (B, T, E); `logits(hidden)` is the MLM head
  and `nsp_logits(hidden)` the NSP head, so a loss can run the MLM head a chunk at a time.
  The bidirectional mask comes from segment ids alone (packing + padding), with ALiBi's
  bias when cfg.position_embedding='alibi': one masks.AttentionMask every layer reads.
  """
  cfg: ModelConfig

  def setup(self):
    cfg = self.cfg
    self.word_embeddings, self.embed_scale = layers.token_embedding(cfg, 'word_embeddings')
    self.mlm_bias = self.param('mlm_bias', layers.partitioned(nn.initializers.zeros, ('vocab',)),
                               (cfg.vocab_size,), cfg.param_dtype)
    self.mlm_transform = MLMTransform(cfg)
    if not cfg.tie_embeddings:
      self.mlm_decoder = layers.dense(cfg, cfg.vocab_size, ['embed'], ['vocab'], 'mlm_decoder',
                                      init=layers.param_init(cfg, cfg.emb_dim), use_bias=False)
    if cfg.nsp or cfg.num_classes:  # pooler: tanh(dense([CLS])), then a classifier
      self.pooler = layers.dense(cfg, cfg.emb_dim, ['embed'], ['mlp'], 'pooler')
    if cfg.nsp:
      self.nsp = layers.dense(cfg, 2, ['mlp'], ['classes'], 'nsp')
    if cfg.num_classes:
      self.classifier = layers.dense(cfg, cfg.num_classes, ['mlp'], ['classes'], 'classifier')
      self.pooled_dropout = ops.Dropout(cfg.dropout_rate)

  @nn.compact
  def hidden(self, inputs, *, token_type_ids=None, segment_ids=None, positions=None):
    cfg = self.cfg
    if segment_ids is None:
      segment_ids = jnp.ones_like(inputs)
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(inputs)
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
    x = self.word_embeddings(inputs) * self.embed_scale                  # (B, T, E)
    bias = None
    if cfg.position_embedding == 'learned':
      x = x + layers.embed(cfg, cfg.max_len, ('position', 'embed'), 'position_embeddings',
                           one_hot=True)(positions)
    elif cfg.position_embedding == 'sinusoidal':
      x = x + layers.sinusoidal_positions(positions, cfg.emb_dim).astype(cfg.dtype)
    else:                                                  # alibi: one value, all layers
      bias = layers.stack_bias(cfg, masks.AlibiBias(layers.alibi_slopes(
          cfg.num_heads, cfg.alibi_bias_max)), inputs.shape[1], inputs.shape[1])
    x = x + layers.embed(cfg, cfg.type_vocab_size, ('type_vocab', 'embed'),
                         'token_type_embeddings', one_hot=True)(token_type_ids)
    x = layers.norm(cfg, 'embeddings_norm')(x)
    if cfg.embedding_dropout:
      x = ops.Dropout(cfg.dropout_rate)(x, deterministic=cfg.deterministic)
    mask = masks.AttentionMask(q_segment_ids=segment_ids, bias=bias)
    return layers.apply_stack(BertBlock, cfg, cfg.num_layers, 'layer', x, mask)  # (B, T, E)

  def logits(self, hidden):                                              # (..., E)
    h = self.mlm_transform(hidden)
    decoder = self.word_embeddings.attend if self.cfg.tie_embeddings else self.mlm_decoder
    return (decoder(h) + self.mlm_bias).astype(jnp.float32)              # (..., V)

  def head_inputs(self, hidden):                                         # (..., E)
    """`logits`' head as a layers.LMHead (the transform applied), for a loss that computes the
    logits itself."""
    h = self.mlm_transform(hidden)
    head = (layers.embedding_head(self.word_embeddings, h) if self.cfg.tie_embeddings
            else layers.dense_head(self.mlm_decoder, h))
    return head._replace(bias=self.mlm_bias)

  def nsp_logits(self, hidden):                                          # (B, T, E)
    if not self.cfg.nsp:
      return None
    pooled = jnp.tanh(self.pooler(hidden[:, 0]))
    return self.nsp(pooled).astype(jnp.float32)                          # (B, 2)

  def classify(self, hidden):                                            # (B, T, E)
    """BertForSequenceClassification: dropout(tanh(dense([CLS]))) -> classifier (B, C)."""
    pooled = jnp.tanh(self.pooler(hidden[:, 0]))
    pooled = self.pooled_dropout(pooled, deterministic=self.cfg.deterministic)
    return self.classifier(pooled).astype(jnp.float32)                   # (B, C)

  def __call__(self, inputs, *, token_type_ids=None, segment_ids=None, positions=None):
    """(mlm_logits, nsp_logits or None); with cfg.num_classes the class logits (B, C)."""
    x = self.hidden(inputs, token_type_ids=token_type_ids, segment_ids=segment_ids,
                    positions=positions)
    if self.cfg.num_classes:
      return self.classify(x)
    return self.logits(x), self.nsp_logits(x)


MASK_ID = 2  # the [MASK] id of example batches (any id > 2 is an ordinary token there)


def example_batch(tokens, rng=None, *, nsp=False, target_len=None) -> dict:
  """An MLM batch from (B, T + 1) ids (the last column unused): with `rng` (numpy Generator)
  15% of positions are selected and replaced by MASK_ID, with NSP labels when `nsp`."""
  del target_len
  b, t = tokens.shape[0], tokens.shape[1] - 1
  selected = rng.random((b, t)) < 0.15 if rng is not None else np.zeros((b, t), bool)
  batch = {'inputs': np.where(selected, MASK_ID, tokens[:, :-1]).astype(np.int32),
           'targets': tokens[:, :-1], 'segment_ids': np.ones((b, t), np.int32),
           'positions': np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
           'token_type_ids': np.zeros((b, t), np.int32),
           'loss_weights': selected.astype(np.float32)}
  if nsp:
    batch['nsp_labels'] = (rng.integers(0, 2, (b,), dtype=np.int32) if rng is not None
                           else np.zeros((b,), np.int32))
  return batch


def forward_flops(cfg, batch, seq_len, target_len=0, head_positions=0):
  """The stack, the MLM transform on the head's positions and the NSP pooler + classifier."""
  del target_len
  e = cfg.emb_dim
  total = flops.stack_flops(cfg, batch, seq_len, False, head_positions)
  total += batch * flops.head_length(seq_len, head_positions) * 2 * e * e
  if cfg.nsp:
    total += batch * (2 * e * e + 2 * e * 2)
  return total


FAMILY = Family(hf_inputs=(('input_ids', 'inputs'), ('attention_mask', 'segment_ids'),
                           ('token_type_ids', 'token_type_ids')),
                name='bert', model=BERT, objective='mlm', input_keys=('inputs',),
                kwarg_keys=('token_type_ids', 'segment_ids', 'positions'), target_key='targets',
                weight_key='loss_weights', example_batch=example_batch,
                forward_flops=forward_flops,
                heads=(Head(name='nsp', method='nsp_logits', label_key='nsp_labels',
                            enabled='nsp'),
                       Head(name='class', method='classify', label_key='labels',
                            enabled='num_classes', params=('pooler', 'classifier'))),
                fills_masks=True,
                task_layout=TaskLayout(begin=('cls_id',), end='sep_id', token_types=True))
