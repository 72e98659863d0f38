"""T5 span corruption, the same arithmetic as t5.data.preprocessors (random_spans_*).

A raw chunk of `raw_len` tokens is split into alternating non-noise / noise spans (non-noise
first). Each noise span is replaced in the inputs by ONE sentinel; the targets hold, for each
noise span, its sentinel followed by the span's tokens. Sentinels count DOWN from
`first_sentinel` (`<extra_id_0>`, the last id of the vocabulary): span k gets first_sentinel - k.
EOS is appended to both. Spans interleave non-noise first and end with noise. Worked example
(raw tokens a..h, noise = c d and h):

    raw      a b c d e f g h
    mask     . . x x . . . x
    inputs   a b <0> e f g <1> EOS
    targets  <0> c d <1> h EOS
"""
import numpy as np

from pretrain_jax.objectives import packing


def _noise_counts(length: int, noise_density: float, mean_noise_span_length: float,
                  helper: bool = False):
  """(num_noise_tokens, num_noise_spans) of a chunk, rounded half to even and clamped exactly
  like T5's `random_spans_noise_mask`, which multiplies and divides in float32 (190 tokens at
  0.15: 28.500001 -> 29 noise tokens). `helper`: in float64 as T5's `random_spans_helper`
  plans lengths (28.499999999999996 -> 28); the two differ at a few lengths (8 in 1..1200)."""
  real = float if helper else np.float32
  num_noise = int(np.round(real(length) * real(noise_density)))
  num_noise = min(max(num_noise, 1), length - 1)
  num_spans = int(np.round(real(num_noise) / real(mean_noise_span_length)))
  return num_noise, max(num_spans, 1)


def target_length(seq_len: int, noise_density: float = 0.15,
                  mean_noise_span_length: float = 3.0) -> tuple:
  """(raw_len, target_len) such that `raw_len` raw tokens give inputs of `seq_len` tokens.

  T5's `random_spans_helper`: the largest raw length whose inputs (non-noise tokens + one
  sentinel per span + EOS) fit in `seq_len`, and the matching targets length (noise tokens +
  one sentinel per span + EOS). target_length(512) == (568, 114). Where T5's mask (float32)
  would make a chunk of raw_len one noise token or span more than its helper (float64)
  planned, the plan follows the mask, so every chunk fits (T5 itself would overflow there).
  """
  if not 0.0 < noise_density < 1.0:
    raise ValueError(f'noise_density={noise_density}; expected a value in (0, 1)')
  if mean_noise_span_length < 1.0:
    raise ValueError(f'mean_noise_span_length={mean_noise_span_length}; expected >= 1')
  if seq_len < 3:
    raise ValueError(f'span corruption seq_len={seq_len}; expected >= 3 (a token, a sentinel '
                     'and EOS)')

  def lengths(tokens_length, helper=True):
    # T5's helper rounds half to even without the mask's clamps (at least one noise token and
    # one span); here with them, so a density or span length that rounds to no span plans for
    # the span the mask makes (identical otherwise).
    num_noise, num_spans = _noise_counts(tokens_length, noise_density, mean_noise_span_length,
                                         helper)
    return tokens_length - num_noise + num_spans + 1, num_noise + num_spans + 1

  raw_len = seq_len - 1
  while lengths(raw_len + 1)[0] <= seq_len:
    raw_len += 1
  inputs_len, targets_len = lengths(raw_len)
  if noise_density == 0.5 and targets_len > inputs_len:
    raw_len -= 1  # T5's "minor hack" so targets length equals the (round) inputs length
    targets_len -= 1
  while lengths(raw_len, helper=False)[0] > seq_len:
    raw_len -= 1
  return raw_len, max(targets_len, lengths(raw_len, helper=False)[1])


def max_spans(raw_len: int, noise_density: float, mean_noise_span_length: float) -> int:
  """Most noise spans (= sentinels needed) in any chunk of up to `raw_len` tokens."""
  return max(_noise_counts(max(n, 2), noise_density, mean_noise_span_length)[1]
             for n in range(1, raw_len + 1))


def _random_segmentation(num_items: int, num_segments: int, rng) -> np.ndarray:
  """Random partition of num_items into num_segments non-empty runs; lengths (num_segments,)."""
  first_in_segment = np.zeros(num_items, np.int64)
  first_in_segment[1:] = rng.permutation(num_items - 1) < num_segments - 1
  return np.bincount(np.cumsum(first_in_segment), minlength=num_segments)[:num_segments]


def random_spans_noise_mask(length: int, rng, noise_density: float = 0.15,
                            mean_noise_span_length: float = 3.0) -> np.ndarray:
  """Bool mask (length,), True on noise. T5's `random_spans_noise_mask` in numpy.

  num_noise = round(L * density) clamped to [1, L-1]; num_spans = max(round(num_noise /
  mean_span), 1); span lengths are random partitions; spans interleave non-noise first.
  Lengths below 2 are computed at 2 and truncated, as in T5.
  """
  orig_length, length = length, max(length, 2)
  num_noise, num_spans = _noise_counts(length, noise_density, mean_noise_span_length)
  noise_lengths = _random_segmentation(num_noise, num_spans, rng)
  nonnoise_lengths = _random_segmentation(length - num_noise, num_spans, rng)
  interleaved = np.stack([nonnoise_lengths, noise_lengths], axis=1).reshape(-1)  # (2S,)
  span_starts = np.cumsum(interleaved)[:-1]
  span_start_indicator = np.bincount(span_starts, minlength=length)[:length]
  is_noise = np.cumsum(span_start_indicator) % 2 == 1
  return is_noise[:orig_length]


def noise_span_to_unique_sentinel(tokens: np.ndarray, noise_mask: np.ndarray,
                                  first_sentinel: int) -> np.ndarray:
  """Replace each run of noise tokens by one sentinel (first_sentinel, first_sentinel-1, ...)."""
  prev_noise = np.concatenate([[False], noise_mask[:-1]])
  first_noise = noise_mask & ~prev_noise
  sentinels = first_sentinel + 1 - np.cumsum(first_noise)
  out = np.where(first_noise, sentinels, tokens)
  return out[~(noise_mask & prev_noise)].astype(np.int32)


def span_corruption(tokens: np.ndarray, rng, *, first_sentinel: int, eos_id: int,
                    noise_density: float = 0.15, mean_noise_span_length: float = 3.0) -> tuple:
  """(inputs, targets) of one raw chunk `tokens` (L,), both ending in EOS.

  `first_sentinel` is the id of <extra_id_0>; later spans count down from it.
  """
  tokens = np.asarray(tokens, np.int32)
  if tokens.ndim != 1 or tokens.size == 0:
    raise ValueError(f'span_corruption needs a non-empty 1-D chunk; got shape {tokens.shape}')
  mask = random_spans_noise_mask(tokens.size, rng, noise_density, mean_noise_span_length)
  eos = np.array([eos_id], np.int32)
  inputs = noise_span_to_unique_sentinel(tokens, mask, first_sentinel)
  targets = noise_span_to_unique_sentinel(tokens, ~mask, first_sentinel)
  return np.concatenate([inputs, eos]), np.concatenate([targets, eos])


def with_decoder_inputs(arrays: dict) -> dict:
  """Packed T5 arrays + `decoder_input_tokens`: the targets shifted right within each segment
  (document), 0 first (packing.shift_right_by_segment), as t5x feeds the decoder."""
  return dict(arrays, decoder_input_tokens=packing.shift_right_by_segment(
      arrays['decoder_target_tokens'], arrays['decoder_segment_ids']))
