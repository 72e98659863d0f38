"""Does a checkpoint use context? Small, honest probes on held-out text, trained vs random init.

- `masked_word_probe`: BERT. Each held-out sentence gets ONE word masked (a word of 3+ letters
  that the tokenizer holds as one piece, picked by a seeded draw, not by hand), and the probe
  counts how often that piece is in the model's top 5 for the [MASK]. One-piece words only: a
  word split as '▁' + pieces would be "found" by predicting the bare '▁', the commonest piece.
- `continuations`: GPT. Seeded sampled continuations of the first words of held-out sentences.
- `span_fills`: T5. A seeded span of 1-3 words of each sentence becomes <extra_id_0>; the model
  decodes what goes there.
"""
import re

import numpy as np

from pretrain_jax.inference import text as text_lib

WORD = re.compile(r"[A-Za-z]{3,}")


def sentences(texts, *, count: int, min_words: int = 6, max_words: int = 24) -> list:
  """The first `count` sentences of `texts` with between min_words and max_words words."""
  out = []
  for text in texts:
    for sentence in re.split(r'(?<=[.!?])\s+', ' '.join(text.split())):
      words = sentence.split()
      if min_words <= len(words) <= max_words and WORD.search(sentence):
        out.append(sentence)
        if len(out) == count:
          return out
  return out


def _pick_word(sentence: str, rng, keep=lambda start, end: True):
  """(start, end) of one 3+-letter word of the sentence for which keep(start, end), chosen by
  `rng`; None if there is none."""
  spans = [m.span() for m in WORD.finditer(sentence) if keep(*m.span())]
  return spans[rng.integers(len(spans))] if spans else None


def masked_word_probe(model, texts: list, *, seed: int = 0, top_k: int = 5) -> dict:
  """BERT: share of held-out sentences whose masked word's first piece is in the top k."""
  rng = np.random.default_rng(seed)
  tok, hits, examples = model.tokenizer, 0, []
  for sentence in texts:
    # The word's pieces as in the sentence: '▁word' after a space, 'word' glued to the text
    # before it ('instance.__class__'), as fill_mask encodes the text around the [MASK].
    def pieces(start, end, sentence=sentence):
      glued = start > 0 and not sentence[start - 1].isspace()
      return tok.encode(sentence[start:end], word_start=not glued)
    span = _pick_word(sentence, rng, keep=lambda start, end: len(pieces(start, end)) == 1)
    if span is None:
      continue
    start, end = span
    word = sentence[start:end]
    target = pieces(start, end)[0]
    masked = f'{sentence[:start]}{text_lib.MASK_TEXT}{sentence[end:]}'
    candidates = model.fill_mask(masked, top_k=top_k)[0]['candidates']
    hit = target in [c['id'] for c in candidates]
    hits += hit
    examples.append({'text': masked, 'answer': word, 'hit': bool(hit), 'target_id': target,
                     'top': [c['word'] for c in candidates]})
  return {'top5_hit_rate': hits / max(len(examples), 1), 'sentences': len(examples),
          'examples': examples,
          'top5_hit_rate_context_shuffled': _shuffled_context_hits(model, examples, rng, top_k)}


def _shuffled_context_hits(model, examples, rng, top_k: int) -> float:
  """The same masked words with the OTHER words of each sentence in a seeded random order (the
  [MASK] keeps its place): a model that ignores context scores the same here."""
  hits = 0
  for e in examples:
    words = e['text'].split()
    at = next(i for i, w in enumerate(words) if text_lib.MASK_TEXT in w)
    others = [w for i, w in enumerate(words) if i != at]
    order = rng.permutation(len(others))
    shuffled = [others[i] for i in order]
    text = ' '.join(shuffled[:at] + [words[at]] + shuffled[at:])
    candidates = model.fill_mask(text, top_k=top_k)[0]['candidates']
    hits += e['target_id'] in [c['id'] for c in candidates]
  return hits / max(len(examples), 1)


def continuations(model, texts: list, *, prompt_words: int = 4, max_new_tokens: int = 16,
                  seed: int = 0):
  """GPT: continuation of the first `prompt_words` words of each sentence, sampled with a fixed
  seed at temperature 0.8 and top-p 0.95 (greedy decoding of a small model loops on its most
  frequent phrase)."""
  prompts = [' '.join(t.split()[:prompt_words]) for t in texts]
  outs = model.generate(prompts, max_new_tokens=max_new_tokens, temperature=0.8, top_p=0.95,
                        seed=seed)
  return [{'prompt': p, 'continuation': o['text'], 'original': t}
          for p, o, t in zip(prompts, outs, texts, strict=True)]


def span_fills(model, texts: list, *, seed: int = 0, max_new_tokens: int = 8):
  """T5: a seeded span of 1-3 words becomes <extra_id_0>; the model decodes the span."""
  rng = np.random.default_rng(seed)
  inputs, answers = [], []
  for text in texts:
    words = text.split()
    n = int(rng.integers(1, 4))
    start = int(rng.integers(1, max(len(words) - n, 2)))
    answers.append(' '.join(words[start:start + n]))
    inputs.append(' '.join(words[:start] + ['<extra_id_0>'] + words[start + n:]))
  outs = model.generate(inputs, max_new_tokens=max_new_tokens)
  return [{'input': i, 'answer': a, 'filled': _first_span(o['text'])}
          for i, a, o in zip(inputs, answers, outs, strict=True)]


def _first_span(text: str) -> str:
  """The words decoded for <extra_id_0>: after it, up to the next sentinel."""
  parts = re.split(r'\s*<extra_id_\d+>\s*', text)
  spans = [p for p in parts if p.strip()]
  return spans[0].strip() if spans else ''

