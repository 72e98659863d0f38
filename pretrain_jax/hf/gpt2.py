"""Hugging Face GPT-2 (GPT2LMHeadModel / GPT2Model) <-> our GPT: the family record.

GPT-2's Conv1D weights are already (in, out); its fused c_attn (E, 3E) is q|k|v along the
output axis.
"""
import numpy as np
import tokenizers

from pretrain_jax import paths
from pretrain_jax.hf import spm
from pretrain_jax.hf.adapters import HFTokenizer
from pretrain_jax.hf.record import (
  ACTIVATIONS,
  HF_ACTIVATIONS,
  HfFamily,
  activation,
  clamp_seq_len,
  get,
  head_dim,
  learned_position_problems,
)
from pretrain_jax.hf.rules import Rule, copy, norm


def config_from_hf(hf: dict, state_dict: dict) -> dict:
  del state_dict  # the tensors decide nothing for GPT-2
  for key in ('scale_attn_by_inverse_layer_idx', 'add_cross_attention'):
    if hf.get(key):
      raise ValueError(f'config.json {key}=True is not supported by our GPT')
  if hf.get('scale_attn_weights') is False:
    raise ValueError('config.json scale_attn_weights=False is not supported by our GPT '
                     '(it always scales attention logits by head_dim**-0.5)')
  emb, heads = get(hf, 'n_embd'), get(hf, 'n_head')
  return dict(vocab_size=get(hf, 'vocab_size'), num_layers=get(hf, 'n_layer'), emb_dim=emb,
              num_heads=heads, head_dim=head_dim(emb, heads, 'n_embd'),
              mlp_dim=get(hf, 'n_inner', 4 * emb), max_len=get(hf, 'n_positions'),
              activation=activation(hf, 'activation_function', ACTIVATIONS, 'gelu_new'),
              # ours has one hidden dropout rate (residual and embedding); resid_pdrop wins
              dropout_rate=get(hf, 'resid_pdrop', 0.1),
              attention_dropout_rate=get(hf, 'attn_pdrop', 0.1),
              layer_norm_eps=get(hf, 'layer_norm_epsilon', 1e-5), tie_embeddings=True)


def config_to_hf(cfg, pad_id=None, eos_id=None) -> dict:
  return dict(architectures=['GPT2LMHeadModel'], model_type='gpt2', vocab_size=cfg.vocab_size,
              n_embd=cfg.emb_dim, n_layer=cfg.num_layers, n_head=cfg.num_heads,
              n_inner=cfg.mlp_dim, n_positions=cfg.max_len,
              activation_function=HF_ACTIVATIONS[cfg.activation],
              resid_pdrop=cfg.dropout_rate, embd_pdrop=cfg.dropout_rate,
              attn_pdrop=cfg.attention_dropout_rate, layer_norm_epsilon=cfg.layer_norm_eps,
              initializer_range=0.02, scale_attn_weights=True, tie_word_embeddings=True,
              bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=pad_id)


def rules(cfg):
  n, h = cfg.num_heads, cfg.head_dim
  out = [copy('transformer.wte.weight', 'wte/embedding'),
         copy('transformer.wpe.weight', 'wpe/embedding'), *norm('transformer.ln_f', 'ln_f')]
  qkv = tuple(f'attn/{name}' for name in ('query', 'key', 'value'))
  for i in range(cfg.num_layers):
    hf, ours = f'transformer.h.{i}.', f'h_{i}/'
    out += norm(hf + 'ln_1', ours + 'ln_1') + norm(hf + 'ln_2', ours + 'ln_2')
    out.append(Rule(hf + 'attn.c_attn.weight', tuple(ours + p + '/kernel' for p in qkv),
                    lambda w: tuple(p.reshape(w.shape[0], n, h) for p in np.split(w, 3, 1)),
                    lambda *ks: np.concatenate([k.reshape(k.shape[0], -1) for k in ks], 1)))
    out.append(Rule(hf + 'attn.c_attn.bias', tuple(ours + p + '/bias' for p in qkv),
                    lambda b: tuple(p.reshape(n, h) for p in np.split(b, 3)),
                    lambda *bs: np.concatenate([b.reshape(-1) for b in bs])))
    out.append(Rule(hf + 'attn.c_proj.weight', (ours + 'attn/out/kernel',),
                    lambda w: (w.reshape(n, h, w.shape[1]),), lambda k: k.reshape(n * h, -1)))
    out.append(copy(hf + 'attn.c_proj.bias', ours + 'attn/out/bias'))
    for conv, dense in (('c_fc', 'wi'), ('c_proj', 'wo')):  # Conv1D is already (in, out)
      out += [copy(f'{hf}mlp.{conv}.weight', f'{ours}mlp/{dense}/kernel'),
              copy(f'{hf}mlp.{conv}.bias', f'{ours}mlp/{dense}/bias')]
  return out


def rename(name: str) -> str:
  """GPT2Model checkpoints name their tensors without the 'transformer.' prefix."""
  return name if name.startswith(('transformer.', 'lm_head.')) else 'transformer.' + name


def tokenizer(files: dict, settings: dict):
  """tokenizer.json, or vocab.json + merges.txt (byte-level BPE)."""
  specials = {'eos': settings.get('eos_token') or '<|endoftext|>',
              'pad': settings.get('pad_token'), 'unk': settings.get('unk_token')}
  if 'tokenizer.json' in files:
    tok = tokenizers.Tokenizer.from_file(files['tokenizer.json'])
  elif 'vocab.json' in files:
    if 'merges.txt' not in files:
      raise FileNotFoundError(f'{paths.resolve(files["vocab.json"]).parent} has vocab.json but no '
                              'merges.txt; a GPT-2 byte-level BPE tokenizer needs both (or a '
                              'tokenizer.json)')
    tok = tokenizers.ByteLevelBPETokenizer(files['vocab.json'], files['merges.txt'])
  else:
    return None
  # GPT-2 has no pad token; padding is marked by segment ids anyway
  return HFTokenizer(tok, 'gpt', specials, list(files.values()), fallbacks={'pad': 'eos'})


def from_sentencepiece(model_path: str) -> dict:
  """The project's tokenizer (<pad> </s> <unk>) as tokenizer.json."""
  return spm.tokenizer_files(model_path, {'pad_token': '<pad>', 'eos_token': '</s>',
                                          'unk_token': '<unk>'})


HF = HfFamily(
    name='gpt', model_type='gpt2', architectures=('GPT2LMHeadModel', 'GPT2Model'),
    expected_files='tokenizer.json or vocab.json + merges.txt',
    config_from_hf=config_from_hf, config_to_hf=config_to_hf, rules=rules,
    tied=(('lm_head.weight', 'transformer.wte.weight'),), stacks=(('h',),), rename=rename,
    export_problems=learned_position_problems, tokenizer=tokenizer,
    tokenizer_json_type='BPE', vocab_file='vocab.json', from_sentencepiece=from_sentencepiece,
    data_settings=clamp_seq_len)
