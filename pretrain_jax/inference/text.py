"""Text in, text out, for any loaded checkpoint: GPT continuation, T5 span filling, BERT fill-mask.

What a family can do is in its record (pretrain_jax.models.family): `generation` names how it
generates ('continue': left-padded prompts through the causal LM; 'fill_spans': right-padded
inputs + EOS through the encoder, targets decoded), `fills_masks` whether it predicts [MASK]s.
"""
import jax
import jax.numpy as jnp
import numpy as np

from pretrain_jax.data import tokenizer as tokenizer_lib
from pretrain_jax.inference import sampling
from pretrain_jax.models import family_of

MASK_TEXT = '[MASK]'


def _left_pad(rows, pad_id):
  width = max(len(r) for r in rows)
  ids = np.full((len(rows), width), pad_id, np.int32)
  seg = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    ids[i, width - len(r):], seg[i, width - len(r):] = r, 1
  return ids, seg


def _right_pad(rows, pad_id, width=None):
  width = width or max(len(r) for r in rows)
  ids = np.full((len(rows), width), pad_id, np.int32)
  seg = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)], seg[i, :len(r)] = r, 1
  return ids, seg


def is_int(value) -> bool:
  """An integer, not a bool (True would be 1 token) or a float."""
  return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_sampling(max_new_tokens, temperature, top_k, top_p, vocab_size=None) -> None:
  """ValueError naming the first sampling value out of range (top_k against `vocab_size` when
  given; a script checks before loading the model, generate_text again with it)."""
  top_k_max = vocab_size if vocab_size is not None else float('inf')
  for name, value, ok, expected in (
      ('max_new_tokens', max_new_tokens, is_int(max_new_tokens) and max_new_tokens >= 1,
       'an integer >= 1'),
      ('temperature', temperature, temperature >= 0, '>= 0 (0 = greedy)'),
      ('top_k', top_k, is_int(top_k) and 0 <= top_k <= top_k_max,
       'an integer from 0 (no filter) to the vocabulary size' + (
           f' {vocab_size}' if vocab_size else '')),
      ('top_p', top_p, 0 < top_p <= 1, 'in (0, 1] (1 = no nucleus filter)')):
    if not ok:
      raise ValueError(f'{name}={value!r} is out of range; expected {expected}')


def why_empty(result: dict) -> str:
  """Why a continuation is '' (an undertrained model often ends it at once), else ''."""
  if result['text'].strip():
    return ''
  if not result['ids']:
    return ('  (the first token generated was end-of-sequence: the model ends here; an '
            'undertrained one often does. Train longer or sample: --temperature 0.8)')
  return f"  (the {len(result['ids'])} tokens generated decode to whitespace)"


def generate_text(model, prompts, *, max_new_tokens=32, temperature=0.0, top_k=0, top_p=1.0,
                  seed=0) -> list:
  """GPT: continue each prompt. T5: fill the <extra_id_N> spans of each input.

  Returns one dict per prompt: prompt, ids (the new tokens, up to EOS) and text.
  """
  tok, cfg = _language_model(model, 'generation'), model.model_config
  check_sampling(max_new_tokens, temperature, top_k, top_p, cfg.vocab_size)
  if isinstance(prompts, str):
    raise ValueError('generate takes a list of prompts; expected [text, ...], got one string')
  prompts = list(prompts)
  if not prompts:
    raise ValueError('generate got no prompts; expected a list of at least one text')
  mode = family_of(cfg).generation
  if mode not in GENERATORS:
    raise ValueError(f'generation needs a gpt or t5 model; this one is {cfg.family!r} '
                     '(use fill_mask for BERT)')
  if mode == 'fill_spans':
    _check_sentinels(tok, prompts)
  rows = [tok.encode(p) for p in prompts]
  if any(not r for r in rows):
    raise ValueError(f'a prompt tokenizes to nothing: {prompts!r}')
  kw = dict(max_new_tokens=max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
            temperature=temperature, top_k=top_k, top_p=top_p)
  out = GENERATORS[mode](model.params, cfg, rows, tok, jax.random.key(seed), **kw)
  results = []
  for prompt, row in zip(prompts, np.asarray(out), strict=True):
    new = [int(t) for t in row]
    if tok.eos_id in new:
      new = new[:new.index(tok.eos_id)]
    results.append({'prompt': prompt, 'ids': new, 'text': tok.decode(new)})
  return results


def _check_sentinels(tok, prompts) -> None:
  """T5 prompts: every `<extra_id_N>` must be one of the tokenizer's sentinels. One past them
  (`<extra_id_150>` of 100) was encoded as the text '<extra_id_150>', and the model asked to
  fill spans it could not see."""
  for prompt in prompts:
    for n in sorted({int(m) for m in tokenizer_lib.SENTINEL_TEXT.findall(prompt)}):
      if len(tok.encode(f'<extra_id_{n}>')) != 1:
        count = getattr(tok, 'num_sentinels', None)    # (a tokenizer.json has no count)
        known = f'<extra_id_0> to <extra_id_{count - 1}>' if count else 'its sentinels'
        raise ValueError(f'prompt {prompt!r} names <extra_id_{n}>, which this tokenizer does '
                         f'not have (it has {known}); expected sentinels numbered from 0')


def _continue(params, cfg, rows, tok, rng, **kw):
  ids, seg = _left_pad(rows, tok.pad_id)
  return sampling.gpt_generate(params, cfg, ids, seg, rng, **kw)


def _fill_spans(params, cfg, rows, tok, rng, **kw):
  ids, seg = _right_pad([r + [tok.eos_id] for r in rows], tok.pad_id)
  return sampling.t5_generate(params, cfg, ids, seg, rng, **kw)


GENERATORS = {'continue': _continue, 'fill_spans': _fill_spans}


def _language_model(model, use: str):
  """The model's tokenizer; ValueError for a fine-tuned classifier (its class logits are no
  LM head) or a model loaded without a tokenizer."""
  where = getattr(model, 'path', None) or 'this checkpoint'
  cfg = model.model_config
  if getattr(cfg, 'num_classes', 0):
    labels = list(model.task.labels) if model.task else []
    raise ValueError(f'{where} holds a fine-tuned {cfg.family} classifier (model.num_classes='
                     f'{cfg.num_classes}, labels {labels}); {use} needs a pretrained language '
                     'model: use its predict() for labels, or the checkpoint it was tuned from')
  if model.tokenizer is None:
    raise ValueError(f'{where} has no tokenizer files; {use} needs them (expected those of its '
                     'Hugging Face tokenizer: tokenizer.json, vocab.txt, vocab.json + merges.txt '
                     'or spiece.model)')
  return model.tokenizer


def fill_mask(model, text: str, top_k: int = 5) -> list:
  """BERT: top-k candidates for each [MASK] in `text`, left to right: `token` (the piece,
  '▁is'), `word` (it detokenised, 'is'; a bare '▁' is ''), `id`, `probability`."""
  if not family_of(model.model_config).fills_masks:
    raise ValueError(f'fill_mask needs a BERT model; this one is {model.family!r}')
  tok = _language_model(model, 'fill_mask')
  vocab = model.model_config.vocab_size
  if not (is_int(top_k) and 1 <= top_k <= vocab):
    raise ValueError(f'top_k={top_k!r} is out of range; expected an integer from 1 to the '
                     f'vocabulary size {vocab}')
  pieces = text.split(MASK_TEXT)
  if len(pieces) < 2:
    raise ValueError(f'{text!r} has no {MASK_TEXT}')
  ids = [tok.cls_id]
  for i, piece in enumerate(pieces):
    if piece.strip():   # text glued to the [MASK] before it ('[MASK]-in') continues its word
      ids += tok.encode(piece.strip(), word_start=i == 0 or piece[0].isspace())
    if i < len(pieces) - 1:
      ids.append(tok.mask_id)
  ids.append(tok.sep_id)
  if len(ids) > model.model_config.max_len:
    raise ValueError(f'{len(ids)} tokens; the model holds at most {model.model_config.max_len}')
  # Padded to a bucket (16, 32, 64, ... up to max_len) under an attention mask, so calls with
  # texts of similar length reuse one compiled program instead of compiling per length.
  width = min(max(16, 1 << (len(ids) - 1).bit_length()), model.model_config.max_len)
  padded, mask = _right_pad([ids], tok.pad_id, width)
  logits = model(padded, attention_mask=mask).logits[0]                  # (T, V)
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  out = []
  for position in [i for i, t in enumerate(ids) if t == tok.mask_id]:
    p, idx = jax.lax.top_k(probs[position], top_k)
    out.append({'position': position,
                'candidates': [{'token': tok.id_to_piece(int(i)), 'word': tok.decode([int(i)]),
                                'id': int(i),
                                'probability': float(q)} for q, i in zip(p, idx, strict=True)]})
  return out
