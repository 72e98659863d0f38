"""Hugging Face config.json <-> ModelConfig for BERT, GPT-2 and T5 (v1.0 and v1.1).

Which heads a checkpoint carries (BERT's NSP head, T5's separate LM head) is read from the
tensor names, not from `architectures`, because that is what the weights can actually fill.
"""
import numpy as np

from pretrain_jax.models.config import ModelConfig

MODEL_TYPES = {'bert': 'bert', 'gpt2': 'gpt', 't5': 't5'}
ARCHITECTURES = {
    'bert': ('BertForPreTraining', 'BertForMaskedLM'),
    'gpt': ('GPT2LMHeadModel', 'GPT2Model'),
    't5': ('T5ForConditionalGeneration', 'T5Model'),
}
# HF activation name -> ours (BERT hidden_act, GPT-2 activation_function, T5 feed_forward_proj).
ACTIVATIONS = {'gelu': 'gelu', 'gelu_new': 'gelu_tanh', 'gelu_pytorch_tanh': 'gelu_tanh',
               'relu': 'relu'}
T5_ACTIVATIONS = {'relu': 'relu', 'gelu': 'gelu', 'gelu_new': 'gelu_tanh',
                  'gated-gelu': 'gated-gelu', 'gated-relu': 'gated-relu'}
HF_ACTIVATIONS = {'gelu': 'gelu', 'gelu_tanh': 'gelu_new', 'relu': 'relu'}
HF_T5_ACTIVATIONS = {'relu': 'relu', 'gelu': 'gelu', 'gelu_tanh': 'gelu_new',
                     'gated-gelu': 'gated-gelu', 'gated-relu': 'gated-relu'}


def family_of(hf: dict) -> str:
  """'bert' | 'gpt' | 't5' from config.json's model_type (and architectures, when present)."""
  model_type = hf.get('model_type')
  if model_type not in MODEL_TYPES:
    raise ValueError(f'config.json model_type={model_type!r} (architectures '
                     f'{hf.get("architectures")}); expected one of {sorted(MODEL_TYPES)}')
  family = MODEL_TYPES[model_type]
  for arch in hf.get('architectures') or ():
    if arch not in ARCHITECTURES[family]:
      raise ValueError(f'config.json architectures={hf["architectures"]!r}: {arch!r} is not '
                       f'supported; expected one of {ARCHITECTURES[family]}')
  return family


def _get(hf: dict, key: str, default=None):
  if key in hf and hf[key] is not None:
    return hf[key]
  if default is None:
    raise ValueError(f'config.json has no {key!r}; it is needed to build the '
                     f'{hf.get("model_type")} model')
  return default


def _activation(hf: dict, key: str, table: dict, default: str) -> str:
  name = _get(hf, key, default)
  if name not in table:
    raise ValueError(f'config.json {key}={name!r}; supported: {sorted(table)}')
  return table[name]


def t5_lm_head_scaled(hf: dict) -> bool:
  """Whether HF scales T5's decoder output by d_model**-0.5 before the LM head.

  transformers 5 saves `scale_decoder_outputs`; older configs say the same with
  `tie_word_embeddings` (absent or true = v1.0 = scaled).
  """
  if hf.get('scale_decoder_outputs') is not None:
    return bool(hf['scale_decoder_outputs'])
  return hf.get('tie_word_embeddings', True) is not False


def t5_lm_head_tied(state_dict: dict) -> bool:
  """True when the checkpoint has no lm_head.weight or only a copy of shared.weight."""
  head, shared = state_dict.get('lm_head.weight'), state_dict.get('shared.weight')
  return head is None or (shared is not None and np.array_equal(head, shared))


def model_config_from_hf(hf: dict, state_dict: dict, **overrides) -> ModelConfig:
  """config.json dict + the checkpoint's tensors (name -> array) -> ModelConfig.

  The tensors decide BERT's `nsp` (a `cls.seq_relationship` head is present) and whether T5's
  LM head is tied (`t5_lm_head_tied`). `overrides` are ModelConfig fields (e.g. dtype,
  scan_layers, attention_impl) applied last.
  """
  family = family_of(hf)
  names = set(state_dict)
  if family == 'bert':
    if hf.get('position_embedding_type', 'absolute') != 'absolute':
      raise ValueError(f'config.json position_embedding_type={hf["position_embedding_type"]!r};'
                       " only 'absolute' BERT position embeddings are supported")
    emb, heads = _get(hf, 'hidden_size'), _get(hf, 'num_attention_heads')
    kw = dict(vocab_size=_get(hf, 'vocab_size'), num_layers=_get(hf, 'num_hidden_layers'),
              emb_dim=emb, num_heads=heads, head_dim=_head_dim(emb, heads, 'hidden_size'),
              mlp_dim=_get(hf, 'intermediate_size'),
              max_len=_get(hf, 'max_position_embeddings'),
              activation=_activation(hf, 'hidden_act', ACTIVATIONS, 'gelu'),
              dropout_rate=_get(hf, 'hidden_dropout_prob', 0.1),
              attention_dropout_rate=_get(hf, 'attention_probs_dropout_prob', 0.1),
              layer_norm_eps=_get(hf, 'layer_norm_eps', 1e-12), tie_embeddings=True,
              type_vocab_size=_get(hf, 'type_vocab_size', 2),
              nsp=any(n.endswith('seq_relationship.weight') for n in names))
  elif family == 'gpt':
    for key in ('scale_attn_by_inverse_layer_idx', 'add_cross_attention'):
      if hf.get(key):
        raise ValueError(f'config.json {key}=True is not supported by our GPT')
    if hf.get('scale_attn_weights') is False:
      raise ValueError('config.json scale_attn_weights=False is not supported by our GPT '
                       '(it always scales attention logits by head_dim**-0.5)')
    emb, heads = _get(hf, 'n_embd'), _get(hf, 'n_head')
    kw = dict(vocab_size=_get(hf, 'vocab_size'), num_layers=_get(hf, 'n_layer'), emb_dim=emb,
              num_heads=heads, head_dim=_head_dim(emb, heads, 'n_embd'),
              mlp_dim=_get(hf, 'n_inner', 4 * emb), max_len=_get(hf, 'n_positions'),
              activation=_activation(hf, 'activation_function', ACTIVATIONS, 'gelu_new'),
              # ours has one hidden dropout rate (residual and embedding); resid_pdrop wins
              dropout_rate=_get(hf, 'resid_pdrop', 0.1),
              attention_dropout_rate=_get(hf, 'attn_pdrop', 0.1),
              layer_norm_eps=_get(hf, 'layer_norm_epsilon', 1e-5), tie_embeddings=True)
  else:
    tied = t5_lm_head_tied(state_dict)
    if not tied and t5_lm_head_scaled(hf):
      raise ValueError('config.json asks T5 to scale the decoder output by d_model**-0.5 '
                       '(tie_word_embeddings / scale_decoder_outputs) but the checkpoint has its '
                       'own lm_head.weight; our T5 scales only a tied head')
    kw = dict(vocab_size=_get(hf, 'vocab_size'), num_layers=_get(hf, 'num_layers'),
              num_decoder_layers=_get(hf, 'num_decoder_layers', hf.get('num_layers')),
              emb_dim=_get(hf, 'd_model'), num_heads=_get(hf, 'num_heads'),
              head_dim=_get(hf, 'd_kv'), mlp_dim=_get(hf, 'd_ff'),
              max_len=_get(hf, 'n_positions', 512), position_embedding='relative',
              activation=_activation(hf, 'feed_forward_proj', T5_ACTIVATIONS, 'relu'),
              dropout_rate=_get(hf, 'dropout_rate', 0.1),
              attention_dropout_rate=_get(hf, 'dropout_rate', 0.1),
              layer_norm_eps=_get(hf, 'layer_norm_epsilon', 1e-6),
              # tied & scaled (v1.0), or a separate unscaled head (v1.1; also the case where a
              # transformers-5 model ties the head but does not scale: the head is copied)
              tie_embeddings=tied and t5_lm_head_scaled(hf),
              relative_buckets=_get(hf, 'relative_attention_num_buckets', 32),
              relative_max_distance=_get(hf, 'relative_attention_max_distance', 128))
  kw.update(overrides)
  return ModelConfig(family=family, **kw)


def _head_dim(emb: int, heads: int, emb_key: str) -> int:
  if emb % heads:
    raise ValueError(f'config.json {emb_key}={emb} is not divisible by the number of heads '
                     f'{heads}')
  return emb // heads


def export_problems(cfg: ModelConfig) -> list:
  """Why `cfg` cannot be written as a Hugging Face model (empty when it can). Training scripts
  print these as a warning at start, so nobody learns it only at export time."""
  problems = []
  if cfg.family in ('bert', 'gpt'):
    if cfg.num_heads * cfg.head_dim != cfg.emb_dim:
      problems.append(f'model.num_heads * head_dim = {cfg.num_heads} * {cfg.head_dim} != '
                      f'emb_dim={cfg.emb_dim}; Hugging Face {cfg.family} needs them equal')
    if cfg.position_embedding != 'learned':
      problems.append(f'model.position_embedding={cfg.position_embedding!r}; Hugging Face '
                      f'{cfg.family} has only learned position embeddings')
    if cfg.activation not in HF_ACTIVATIONS:
      problems.append(f'model.activation={cfg.activation!r}; exportable for {cfg.family}: '
                      f'{sorted(HF_ACTIVATIONS)}')
    if not cfg.tie_embeddings:
      problems.append(f'model.tie_embeddings=False; Hugging Face {cfg.family.upper()} ties its '
                      'LM head to the token embedding')
  return problems


def _check_exportable(cfg: ModelConfig) -> None:
  problems = export_problems(cfg)
  if problems:
    raise ValueError(problems[0])


def hf_config_from_model(cfg: ModelConfig, *, pad_id=None, eos_id=None) -> dict:
  """ModelConfig -> a config.json dict that transformers' from_pretrained accepts.

  `pad_id` / `eos_id` come from the tokenizer when there is one.
  """
  _check_exportable(cfg)
  if cfg.family == 'bert':
    hf = dict(architectures=['BertForPreTraining' if cfg.nsp else 'BertForMaskedLM'],
              model_type='bert', vocab_size=cfg.vocab_size, hidden_size=cfg.emb_dim,
              num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
              intermediate_size=cfg.mlp_dim, hidden_act=HF_ACTIVATIONS[cfg.activation],
              hidden_dropout_prob=cfg.dropout_rate,
              attention_probs_dropout_prob=cfg.attention_dropout_rate,
              max_position_embeddings=cfg.max_len, type_vocab_size=cfg.type_vocab_size,
              layer_norm_eps=cfg.layer_norm_eps, initializer_range=0.02,
              position_embedding_type='absolute', tie_word_embeddings=True,
              pad_token_id=0 if pad_id is None else pad_id)
  elif cfg.family == 'gpt':
    hf = dict(architectures=['GPT2LMHeadModel'], model_type='gpt2', vocab_size=cfg.vocab_size,
              n_embd=cfg.emb_dim, n_layer=cfg.num_layers, n_head=cfg.num_heads,
              n_inner=cfg.mlp_dim, n_positions=cfg.max_len,
              activation_function=HF_ACTIVATIONS[cfg.activation],
              resid_pdrop=cfg.dropout_rate, embd_pdrop=cfg.dropout_rate,
              attn_pdrop=cfg.attention_dropout_rate, layer_norm_epsilon=cfg.layer_norm_eps,
              initializer_range=0.02, scale_attn_weights=True, tie_word_embeddings=True,
              bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=pad_id)
  else:
    if cfg.activation not in HF_T5_ACTIVATIONS:
      raise ValueError(f'model.activation={cfg.activation!r}; exportable for t5: '
                       f'{sorted(HF_T5_ACTIVATIONS)}')
    hf = dict(architectures=['T5ForConditionalGeneration'], model_type='t5',
              vocab_size=cfg.vocab_size, d_model=cfg.emb_dim, d_kv=cfg.head_dim,
              d_ff=cfg.mlp_dim, num_layers=cfg.num_layers,
              num_decoder_layers=cfg.decoder_layers, num_heads=cfg.num_heads,
              relative_attention_num_buckets=cfg.relative_buckets,
              relative_attention_max_distance=cfg.relative_max_distance,
              dropout_rate=cfg.dropout_rate, layer_norm_epsilon=cfg.layer_norm_eps,
              feed_forward_proj=HF_T5_ACTIVATIONS[cfg.activation],
              tie_word_embeddings=cfg.tie_embeddings,
              scale_decoder_outputs=cfg.tie_embeddings, n_positions=cfg.max_len,
              is_encoder_decoder=True, decoder_start_token_id=0,
              pad_token_id=0 if pad_id is None else pad_id,
              eos_token_id=1 if eos_id is None else eos_id)
  return hf
