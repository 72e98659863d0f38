"""BERT masked-language-model corruption on a whole (B, T) batch, vectorised.

Each selectable token is selected with probability `probability` (independently, as in Hugging
Face's collator: over 1M tokens the rate is within ~0.04 points of it). Of the selected tokens
80% become [MASK], 10% a random ordinary token and 10% stay unchanged; loss weights are 1 only
on selected positions. Whole-word masking selects words (a piece starting a word plus the
pieces continuing it) with the same probability, then decides 80/10/10 per piece, as BERT's
`create_pretraining_data.py` does.
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
