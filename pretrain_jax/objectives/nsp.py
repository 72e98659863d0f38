"""BERT next-sentence-prediction pairs: [CLS] A [SEP] B [SEP], one pair per row.

A document is walked left to right. At each step the tokens still available (at most
`max_tokens` = seq_len - 3) are cut at a uniformly random point into A and what follows; with
probability 1/2 B is exactly the tokens that follow A in the same document (IsNext, label 0),
otherwise B is a random same-length window of ANOTHER document (NotNext, label 1) and the
tokens after A are put back for the next pair, as BERT's create_pretraining_data does. Cuts are
at token (not sentence) boundaries, the same for both labels, so the cut itself gives nothing
away. Pairs are trimmed to fit by construction: len(A) + len(B) <= max_tokens.
"""
import numpy as np

IS_NEXT, NOT_NEXT = 0, 1  # Hugging Face convention


def nsp_pairs(tokens: np.ndarray, other: np.ndarray, rng, max_tokens: int) -> list:
  """Pairs of one document: list of (start, a, b, label), `start` = offset of A in `tokens`.

  Args:
    tokens: (N,) ids of the document; fewer than 2 tokens give no pair.
    other: (M,) ids of another document (M >= 1), source of NotNext B segments.
    rng: np.random.Generator.
    max_tokens: most tokens of A + B (seq_len - 3 for [CLS], [SEP], [SEP]).
  """
  if max_tokens < 2:
    raise ValueError(f'NSP needs seq_len >= 5 ([CLS] a [SEP] b [SEP]); got room for '
                     f'{max_tokens} tokens')
  if len(other) < 1:
    raise ValueError('NSP needs a non-empty other document for NotNext pairs')
  pairs, start = [], 0
  while len(tokens) - start >= 2:
    n = min(max_tokens, len(tokens) - start)
    a_len = int(rng.integers(1, n))          # in [1, n-1]: both segments non-empty
    a = tokens[start:start + a_len]
    if rng.random() < 0.5:
      pairs.append((start, a, tokens[start + a_len:start + n], IS_NEXT))
      start += n
    else:
      b_len = min(n - a_len, len(other))
      b_start = int(rng.integers(0, len(other) - b_len + 1))
      pairs.append((start, a, other[b_start:b_start + b_len], NOT_NEXT))
      start += a_len
  return pairs


def nsp_row(a: np.ndarray, b: np.ndarray, *, cls_id: int, sep_id: int) -> dict:
  """Features of one pair (n,) with n = len(a) + len(b) + 3.

  `inputs` = [CLS] a [SEP] b [SEP]; `token_type_ids` 0 for [CLS] a [SEP], 1 for b [SEP].
  """
  cls, sep = np.array([cls_id], np.int32), np.array([sep_id], np.int32)
  inputs = np.concatenate([cls, a, sep, b, sep]).astype(np.int32)
  types = np.zeros(inputs.shape, np.int32)
  types[len(a) + 2:] = 1
  return {'inputs': inputs, 'token_type_ids': types}


def with_partners(docs, first_document):
  """(epoch, doc, tokens) -> (epoch, doc, tokens, partner): a document's NotNext partner is the
  next document of the epoch, else (for the last one) the epoch's first document, which
  `first_document(epoch) -> (doc, tokens)` gives."""
  prev = None
  for cur in docs:
    if prev is not None:
      yield (*prev, cur[2] if cur[0] == prev[0] else _first(first_document, prev))
    prev = cur
  if prev is not None:
    yield (*prev, _first(first_document, prev))


def _first(first_document, current):
  epoch, doc, _ = current
  first_doc, tokens = first_document(epoch)
  if first_doc == doc:
    raise ValueError('NSP needs at least 2 documents with tokens in each data stream share; '
                     f'epoch {epoch} has only one')
  return tokens
