"""Hugging Face T5 v1.0 / v1.1 (T5ForConditionalGeneration / T5Model) <-> our T5: the record.

Whether the LM head is tied is read from the tensors (`lm_head_tied`), and whether HF scales
the decoder output from config.json (`lm_head_scaled`); ours scales only a tied head.
"""
import numpy as np
from sentencepiece import sentencepiece_model_pb2 as sp_model

from pretrain_jax import paths
from pretrain_jax.data import tokenizer as data_tok
from pretrain_jax.hf.adapters import T5_EXTRA_IDS, SentencePieceTokenizer
from pretrain_jax.hf.record import HfFamily, activation, clamp_seq_len, get
from pretrain_jax.hf.rules import copy, heads_in, heads_out, linear, norm

ACTIVATIONS = {'relu': 'relu', 'gelu': 'gelu', 'gelu_new': 'gelu_tanh',
               'gated-gelu': 'gated-gelu', 'gated-relu': 'gated-relu'}
HF_ACTIVATIONS = {'relu': 'relu', 'gelu': 'gelu', 'gelu_tanh': 'gelu_new',
                  'gated-gelu': 'gated-gelu', 'gated-relu': 'gated-relu'}


def lm_head_scaled(hf: dict) -> bool:
  """Whether HF scales T5's decoder output by d_model**-0.5 before the LM head.

  transformers 5 saves `scale_decoder_outputs`; older configs say the same with
  `tie_word_embeddings` (absent or true = v1.0 = scaled).
  """
  if hf.get('scale_decoder_outputs') is not None:
    return bool(hf['scale_decoder_outputs'])
  return hf.get('tie_word_embeddings', True) is not False


def lm_head_tied(state_dict: dict) -> bool:
  """True when the checkpoint has no lm_head.weight or only a copy of shared.weight."""
  head, shared = state_dict.get('lm_head.weight'), state_dict.get('shared.weight')
  return head is None or (shared is not None and np.array_equal(head, shared))


def config_from_hf(hf: dict, state_dict: dict) -> dict:
  tied = lm_head_tied(state_dict)
  if not tied and lm_head_scaled(hf):
    raise ValueError('config.json asks T5 to scale the decoder output by d_model**-0.5 '
                     '(tie_word_embeddings / scale_decoder_outputs) but the checkpoint has its '
                     'own lm_head.weight; our T5 scales only a tied head')
  return dict(vocab_size=get(hf, 'vocab_size'), num_layers=get(hf, 'num_layers'),
              num_decoder_layers=get(hf, 'num_decoder_layers', hf.get('num_layers')),
              emb_dim=get(hf, 'd_model'), num_heads=get(hf, 'num_heads'),
              head_dim=get(hf, 'd_kv'), mlp_dim=get(hf, 'd_ff'),
              max_len=get(hf, 'n_positions', 512), position_embedding='relative',
              activation=activation(hf, 'feed_forward_proj', ACTIVATIONS, 'relu'),
              dropout_rate=get(hf, 'dropout_rate', 0.1),
              attention_dropout_rate=get(hf, 'dropout_rate', 0.1),
              layer_norm_eps=get(hf, 'layer_norm_epsilon', 1e-6),
              # tied & scaled (v1.0), or a separate unscaled head (v1.1; also the case where a
              # transformers-5 model ties the head but does not scale: the head is copied)
              tie_embeddings=tied and lm_head_scaled(hf),
              relative_buckets=get(hf, 'relative_attention_num_buckets', 32),
              relative_max_distance=get(hf, 'relative_attention_max_distance', 128))


def config_to_hf(cfg, pad_id=None, eos_id=None) -> dict:
  if cfg.activation not in HF_ACTIVATIONS:
    raise ValueError(f'model.activation={cfg.activation!r}; exportable for t5: '
                     f'{sorted(HF_ACTIVATIONS)}')
  return dict(architectures=['T5ForConditionalGeneration'], model_type='t5',
              vocab_size=cfg.vocab_size, d_model=cfg.emb_dim, d_kv=cfg.head_dim,
              d_ff=cfg.mlp_dim, num_layers=cfg.num_layers,
              num_decoder_layers=cfg.decoder_layers, num_heads=cfg.num_heads,
              relative_attention_num_buckets=cfg.relative_buckets,
              relative_attention_max_distance=cfg.relative_max_distance,
              dropout_rate=cfg.dropout_rate, layer_norm_epsilon=cfg.layer_norm_eps,
              feed_forward_proj=HF_ACTIVATIONS[cfg.activation],
              tie_word_embeddings=cfg.tie_embeddings,
              scale_decoder_outputs=cfg.tie_embeddings, n_positions=cfg.max_len,
              is_encoder_decoder=True, decoder_start_token_id=0,
              pad_token_id=0 if pad_id is None else pad_id,
              eos_token_id=1 if eos_id is None else eos_id)


def _mlp(cfg, hf, ours):
  wis = ('wi_0', 'wi_1') if cfg.activation.startswith('gated') else ('wi',)
  out = []
  for name in wis + ('wo',):
    out += linear(f'{hf}DenseReluDense.{name}', f'{ours}mlp/{name}', bias=False)
  return out


def _attention(cfg, hf, ours):
  out = []
  for hf_name, name in (('q', 'query'), ('k', 'key'), ('v', 'value')):
    out += heads_in(cfg, f'{hf}.{hf_name}', f'{ours}/{name}', bias=False)
  return out + heads_out(cfg, f'{hf}.o', f'{ours}/out', bias=False)


def rules(cfg):
  out = [copy('shared.weight', 'shared/embedding')]
  for stack, num in (('encoder', cfg.num_layers), ('decoder', cfg.decoder_layers)):
    out.append(copy(f'{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight',
                    f'{stack}/relpos_bias/rel_embedding'))
    out += norm(f'{stack}.final_layer_norm', f'{stack}/final_norm', bias=False)
    for i in range(num):
      hf, ours = f'{stack}.block.{i}.layer.', f'{stack}/layers_{i}/'
      if stack == 'encoder':
        out += _attention(cfg, hf + '0.SelfAttention', ours + 'attention')
        out += norm(hf + '0.layer_norm', ours + 'pre_attention_norm', bias=False)
        out += _mlp(cfg, hf + '1.', ours)
        out += norm(hf + '1.layer_norm', ours + 'pre_mlp_norm', bias=False)
      else:
        out += _attention(cfg, hf + '0.SelfAttention', ours + 'self_attention')
        out += norm(hf + '0.layer_norm', ours + 'pre_self_attention_norm', bias=False)
        out += _attention(cfg, hf + '1.EncDecAttention', ours + 'encoder_decoder_attention')
        out += norm(hf + '1.layer_norm', ours + 'pre_cross_attention_norm', bias=False)
        out += _mlp(cfg, hf + '2.', ours)
        out += norm(hf + '2.layer_norm', ours + 'pre_mlp_norm', bias=False)
  if not cfg.tie_embeddings:
    out += linear('lm_head', 'decoder/lm_head', bias=False)
  return out


def complete(cfg, state_dict: dict) -> dict:
  """An unscaled head tied to `shared` (transformers 5 always ties): ours keeps a copy."""
  if not cfg.tie_embeddings and 'lm_head.weight' not in state_dict:
    state_dict['lm_head.weight'] = state_dict.get('shared.weight')
  return state_dict


def tokenizer(files: dict, settings: dict):
  """spiece.model (+ `<extra_id_N>` sentinels past it)."""
  if 'spiece.model' not in files:
    return None
  extra_ids = settings.get('extra_ids')   # 0 is a value: a spiece.model with its own sentinels
  return SentencePieceTokenizer(files['spiece.model'],
                                T5_EXTRA_IDS if extra_ids is None else int(extra_ids))


def from_sentencepiece(model_path: str) -> dict:
  """A run's sentencepiece model as T5's spiece.model: its pieces without the sentinels.

  A tokenizer trained here ends with the pieces ▁<extra_id_99> ... ▁<extra_id_0>; T5's own
  vocabulary has no sentinel pieces, and transformers' T5Tokenizer (like hf/adapters) adds
  extra_ids=100 `<extra_id_N>` tokens after the pieces, counting down from the last id. Kept,
  the 100 pieces would be added again past the model's vocabulary; dropped, the added tokens get
  the ids the run trained with. A model with sentinel pieces anywhere else is not converted.
  """
  m = sp_model.ModelProto()
  m.ParseFromString(paths.resolve(model_path).read_bytes())
  pieces = [p.piece for p in m.pieces]
  sentinels = [data_tok.sentinel_piece(i) for i in reversed(range(T5_EXTRA_IDS))]
  if pieces[-len(sentinels):] == sentinels:
    del m.pieces[-len(sentinels):]
  elif set(sentinels) & set(pieces):
    return {}
  return {'spiece.model': m.SerializeToString()}


HF = HfFamily(
    name='t5', model_type='t5', architectures=('T5ForConditionalGeneration', 'T5Model'),
    expected_files='spiece.model',
    config_from_hf=config_from_hf, config_to_hf=config_to_hf, rules=rules, complete=complete,
    tied=(('encoder.embed_tokens.weight', 'shared.weight'),
          ('decoder.embed_tokens.weight', 'shared.weight'), ('lm_head.weight', 'shared.weight')),
    stacks=(('encoder', 'layers'), ('decoder', 'layers')), tokenizer=tokenizer,
    sentencepiece_file='spiece.model',
    from_sentencepiece=from_sentencepiece, data_settings=clamp_seq_len)
