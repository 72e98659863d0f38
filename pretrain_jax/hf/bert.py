"""Hugging Face BERT (BertForPreTraining / BertForMaskedLM) <-> our BERT: the family record."""
import tokenizers

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
from pretrain_jax.hf.rules import copy, heads_in, heads_out, linear, norm

SPECIALS = {'pad': '[PAD]', 'cls': '[CLS]', 'sep': '[SEP]', 'mask': '[MASK]', 'unk': '[UNK]'}


def config_from_hf(hf: dict, state_dict: dict) -> dict:
  if hf.get('position_embedding_type', 'absolute') != 'absolute':
    raise ValueError(f'config.json position_embedding_type={hf["position_embedding_type"]!r};'
                     " only 'absolute' BERT position embeddings are supported")
  emb, heads = get(hf, 'hidden_size'), get(hf, 'num_attention_heads')
  return dict(vocab_size=get(hf, 'vocab_size'), num_layers=get(hf, 'num_hidden_layers'),
              emb_dim=emb, num_heads=heads, head_dim=head_dim(emb, heads, 'hidden_size'),
              mlp_dim=get(hf, 'intermediate_size'),
              max_len=get(hf, 'max_position_embeddings'),
              activation=activation(hf, 'hidden_act', ACTIVATIONS, 'gelu'),
              dropout_rate=get(hf, 'hidden_dropout_prob', 0.1),
              attention_dropout_rate=get(hf, 'attention_probs_dropout_prob', 0.1),
              layer_norm_eps=get(hf, 'layer_norm_eps', 1e-12), tie_embeddings=True,
              type_vocab_size=get(hf, 'type_vocab_size', 2),
              nsp=any(n.endswith('seq_relationship.weight') for n in state_dict))


def config_to_hf(cfg, pad_id=None, eos_id=None) -> dict:
  del eos_id  # BERT ends sequences with [SEP]
  return dict(architectures=['BertForPreTraining' if cfg.nsp else 'BertForMaskedLM'],
              model_type='bert', vocab_size=cfg.vocab_size, hidden_size=cfg.emb_dim,
              num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
              intermediate_size=cfg.mlp_dim, hidden_act=HF_ACTIVATIONS[cfg.activation],
              hidden_dropout_prob=cfg.dropout_rate,
              attention_probs_dropout_prob=cfg.attention_dropout_rate,
              max_position_embeddings=cfg.max_len, type_vocab_size=cfg.type_vocab_size,
              layer_norm_eps=cfg.layer_norm_eps, initializer_range=0.02,
              position_embedding_type='absolute', tie_word_embeddings=True,
              pad_token_id=0 if pad_id is None else pad_id)


def rules(cfg):
  e = 'bert.embeddings.'
  out = [copy(e + 'word_embeddings.weight', 'word_embeddings/embedding'),
         copy(e + 'position_embeddings.weight', 'position_embeddings/embedding'),
         copy(e + 'token_type_embeddings.weight', 'token_type_embeddings/embedding'),
         *norm(e + 'LayerNorm', 'embeddings_norm')]
  for i in range(cfg.num_layers):
    hf, ours = f'bert.encoder.layer.{i}.', f'layer_{i}/'
    for name in ('query', 'key', 'value'):
      out += heads_in(cfg, hf + 'attention.self.' + name, ours + 'attention/' + name)
    out += heads_out(cfg, hf + 'attention.output.dense', ours + 'attention/out')
    out += norm(hf + 'attention.output.LayerNorm', ours + 'attention_norm')
    out += linear(hf + 'intermediate.dense', ours + 'mlp/wi')
    out += linear(hf + 'output.dense', ours + 'mlp/wo')
    out += norm(hf + 'output.LayerNorm', ours + 'output_norm')
  out += linear('cls.predictions.transform.dense', 'mlm_transform/dense')
  out += norm('cls.predictions.transform.LayerNorm', 'mlm_transform/norm')
  out.append(copy('cls.predictions.bias', 'mlm_bias'))
  if cfg.nsp:
    out += linear('bert.pooler.dense', 'pooler') + linear('cls.seq_relationship', 'nsp')
  return out


def tokenizer(files: dict, settings: dict):
  """tokenizer.json, or vocab.txt (WordPiece, lowercasing as tokenizer_config.json says)."""
  specials = {role: settings.get(f'{role}_token') or text for role, text in SPECIALS.items()}
  if 'tokenizer.json' in files:
    tok = tokenizers.Tokenizer.from_file(files['tokenizer.json'])
  elif 'vocab.txt' in files:
    lower = settings.get('do_lower_case')
    tok = tokenizers.BertWordPieceTokenizer(
        files['vocab.txt'], lowercase=True if lower is None else bool(lower),
        unk_token=specials['unk'], sep_token=specials['sep'], cls_token=specials['cls'],
        pad_token=specials['pad'], mask_token=specials['mask'])
  else:
    return None
  return HFTokenizer(tok, 'bert', specials, list(files.values()), fallbacks={'eos': 'sep'})


def from_sentencepiece(model_path: str) -> dict:
  """The project's tokenizer (<pad> <unk> [CLS] [SEP] [MASK]) as tokenizer.json."""
  return spm.tokenizer_files(model_path, {'pad_token': '<pad>', 'unk_token': '<unk>',
                                          'cls_token': '[CLS]', 'sep_token': '[SEP]',
                                          'mask_token': '[MASK]'}, bert_template=True)


HF = HfFamily(
    name='bert', model_type='bert', architectures=('BertForPreTraining', 'BertForMaskedLM'),
    expected_files='tokenizer.json or vocab.txt',
    config_from_hf=config_from_hf, config_to_hf=config_to_hf, rules=rules,
    # Tensors HF may save as copies of another: (copy, original). Import accepts them when equal.
    tied=(('cls.predictions.decoder.weight', 'bert.embeddings.word_embeddings.weight'),
          ('cls.predictions.decoder.bias', 'cls.predictions.bias')),
    stacks=(('layer',),), export_problems=learned_position_problems,
    tokenizer=tokenizer, tokenizer_json_type='WordPiece', vocab_file='vocab.txt',
    from_sentencepiece=from_sentencepiece,
    data_settings=lambda cfg, data: dict(clamp_seq_len(cfg, data), nsp=cfg.nsp))
