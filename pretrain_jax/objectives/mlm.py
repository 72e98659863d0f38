"""BERT masked-language-model corruption on a whole (B, T) batch, vectorised.

Each selectable token is selected with probability `probability` (independently, as in Hugging
Face's collator: over 1M tokens the rate is within ~0.04 points of it). Of the selected tokens
80% become [MASK], 10% a random ordinary token and 10% stay unchanged; loss weights are 1 only
on selected positions. Whole-word masking selects words (a piece starting a word plus the
pieces continuing it) with the same probability, then decides 80/10/10 per piece, as BERT's
`create_pretraining_data.py` does.

Span masking (SpanBERT, Joshi et al. 2020: `mask_spans`) selects contiguous spans instead:
lengths from a geometric distribution (p = 0.2) truncated at 10 tokens (mean 3.8), or one fixed
length; each span stays inside one document of a packed row; spans are drawn until the row's
share of selected tokens is reached (15% of its selectable tokens, the last span cut to fit);
and 80/10/10 is decided once per span: all of it [MASK], all random tokens, or all kept.
"""
import numpy as np


def mask_tokens(tokens: np.ndarray, rng, *, selectable: np.ndarray, random_ids: np.ndarray,
                mask_id: int, probability: float = 0.15,
                word_starts: np.ndarray | None = None) -> dict:
  """Corrupt `tokens` (B, T) for MLM.

  Args:
    tokens: (B, T) int original ids.
    rng: np.random.Generator; the only source of randomness.
    selectable: (B, T) bool; False on special tokens ([CLS], [SEP], ...) and padding, which are
      never selected.
    random_ids: (V',) int ordinary ids a "random token" is drawn from (uniformly).
    mask_id: id of [MASK].
    probability: share of selectable tokens selected.
    word_starts: (B, T) bool or None; if given, whole-word masking: True where a word begins
      (a selectable token with word_starts False continues the word to its left).
  Returns:
    dict with `inputs` (B, T) int32 corrupted ids, `targets` (B, T) int32 original ids,
    `loss_weights` (B, T) float32 (1 on selected positions), `selected` (B, T) bool.
  """
  tokens = np.asarray(tokens)
  if tokens.ndim != 2 or selectable.shape != tokens.shape:
    raise ValueError(f'mask_tokens wants tokens (B, T) and selectable of the same shape; got '
                     f'{tokens.shape} and {selectable.shape}')
  if not 0.0 <= probability <= 1.0:
    raise ValueError(f'mlm probability={probability}; expected a value in [0, 1]')
  draw = rng.random(tokens.shape, dtype=np.float32)
  if word_starts is not None:
    # Every piece takes the draw of the piece that starts its word; a special token starts its
    # own "word" so a word never reaches across [CLS]/[SEP]/padding.
    starts = word_starts | ~selectable
    starts[:, 0] = True
    cols = np.where(starts, np.arange(tokens.shape[1]), 0)
    draw = np.take_along_axis(draw, np.maximum.accumulate(cols, axis=1), axis=1)
  selected = selectable & (draw < probability)
  how = rng.random(tokens.shape, dtype=np.float32)
  to_mask = selected & (how < 0.8)
  to_random = selected & (how >= 0.8) & (how < 0.9)
  random_tokens = np.asarray(random_ids)[rng.integers(0, len(random_ids), tokens.shape)]
  inputs = np.where(to_mask, mask_id, np.where(to_random, random_tokens, tokens))
  return {'inputs': inputs.astype(np.int32), 'targets': tokens.astype(np.int32),
          'loss_weights': selected.astype(np.float32), 'selected': selected}


def span_length_pmf(p: float = 0.2, max_span: int = 10) -> np.ndarray:
  """(max_span,) P(length = 1..max_span): the geometric distribution p (1 - p)^(l - 1)
  truncated at max_span and renormalised (SpanBERT's "clipped" lengths; mean 3.79 for p=0.2,
  max_span=10)."""
  lengths = np.arange(1, max_span + 1)
  weights = p * (1.0 - p) ** (lengths - 1)
  return weights / weights.sum()


def _place_span(free, segments, rng, length: int, tries: int = 10):
  """(start, end) of a span of at most `length` free positions in one segment, from a start
  drawn uniformly among the free positions: the first of `tries` starts where the whole span
  fits, else the last one's run of free positions (shorter: a document's end or a selected
  token stops it)."""
  candidates = np.flatnonzero(free)
  for _ in range(tries):
    start = end = int(candidates[rng.integers(len(candidates))])
    while end < len(free) and end - start < length and free[end] and \
        segments[end] == segments[start]:
      end += 1
    if end - start == length:
      break
  return start, end


def mask_spans(tokens: np.ndarray, rng, *, selectable: np.ndarray, segment_ids: np.ndarray,
               random_ids: np.ndarray, mask_id: int, probability: float = 0.15,
               p: float = 0.2, max_span: int = 10, span_length: int = 0) -> dict:
  """Corrupt `tokens` (B, T) for MLM by spans (SpanBERT).

  Args: as mask_tokens, plus
    segment_ids: (B, T) int, 1-based per document of a packed row: no span crosses from one
      document into the next.
    p, max_span: the span lengths' geometric distribution (span_length_pmf).
    span_length: > 0: every span has this many tokens instead (cut only by a document's end,
      a token already selected or the row's budget).
  Each row selects floor(probability * its selectable tokens + u), u ~ U(0, 1) (so exactly
  `probability` of them on average). Returns mask_tokens' dict plus `span_ids` (B, T) int32:
  0 off the selection, k on the k-th span of its row.
  """
  tokens = np.asarray(tokens)
  if tokens.ndim != 2 or selectable.shape != tokens.shape or \
      np.shape(segment_ids) != tokens.shape:
    raise ValueError(f'mask_spans wants tokens, selectable and segment_ids of one (B, T) shape; '
                     f'got {tokens.shape}, {selectable.shape} and {np.shape(segment_ids)}')
  if not 0.0 <= probability <= 1.0:
    raise ValueError(f'mlm probability={probability}; expected a value in [0, 1]')
  pmf = span_length_pmf(p, max_span)
  span_ids = np.zeros(tokens.shape, np.int32)
  inputs = tokens.copy()
  random_ids = np.asarray(random_ids)
  for b in range(tokens.shape[0]):
    free = np.asarray(selectable[b], bool).copy()
    segments = np.asarray(segment_ids[b])
    budget = int(np.floor(probability * free.sum() + rng.random()))
    count = spans = 0
    while count < budget and free.any():
      length = span_length or 1 + int(rng.choice(max_span, p=pmf))
      start, end = _place_span(free, segments, rng, min(length, budget - count))
      spans += 1
      span_ids[b, start:end] = spans
      free[start:end] = False
      count += end - start
      how = rng.random()
      if how < 0.8:
        inputs[b, start:end] = mask_id
      elif how < 0.9:
        inputs[b, start:end] = random_ids[rng.integers(0, len(random_ids), end - start)]
  selected = span_ids > 0
  return {'inputs': inputs.astype(np.int32), 'targets': tokens.astype(np.int32),
          'loss_weights': selected.astype(np.float32), 'selected': selected,
          'span_ids': span_ids}


def max_predictions_per_seq(seq_len: int, probability: float = 0.15) -> int:
  """A per-row bound on the selected positions, for running the MLM head only on those.

  Selection is Bernoulli(probability) per position, so the count is binomial: the bound is its
  mean + 6 standard deviations, rounded up to a multiple of 8 (at most seq_len). A row beyond it
  (about 1e-9 of rows; more often with whole-word masking, whose count varies more) is still
  exact: the loss then runs the head on every position of that batch (task.loss_sums).
  E.g. 512 -> 128, 128 -> 48, 48 -> 24.
  """
  mean = probability * seq_len
  bound = mean + 6.0 * np.sqrt(seq_len * probability * (1.0 - probability))
  return int(min(seq_len, 8 * np.ceil(bound / 8)))


def wrap_cls_sep(tokens: np.ndarray, cls_id: int, sep_id: int) -> np.ndarray:
  """BERT's input format for one piece of text: [CLS] tokens [SEP]."""
  return np.concatenate([[cls_id], tokens, [sep_id]]).astype(np.int32)
