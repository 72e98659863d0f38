"""T5 span corruption against its definition: lengths, mask arithmetic, reconstruction."""
import numpy as np
import pytest
from helpers import splice

from pretrain_jax.objectives import span_corruption as sc

FIRST_SENTINEL = 2047  # <extra_id_0> of a 2048-id vocabulary
EOS = 1


def test_target_length_matches_t5_for_512():
  assert sc.target_length(512) == (568, 114)
  assert sc.target_length(512, 0.15, 3.0) == (568, 114)


@pytest.mark.parametrize('seq_len', [3, 8, 64, 128, 256, 511, 512, 1024, 2048])
@pytest.mark.parametrize('density,mean', [(0.15, 3.0), (0.3, 5.0), (0.5, 3.0)])
def test_target_length_is_the_largest_raw_length_that_fits(seq_len, density, mean):
  def lengths(n):  # T5's _tokens_length_to_inputs_length_targets_length
    noise = int(round(n * density))
    spans = int(round(noise / mean))
    return n - noise + spans + 1, noise + spans + 1
  raw, target = sc.target_length(seq_len, density, mean)
  if density == 0.5 and lengths(raw + 1)[1] > lengths(raw + 1)[0]:
    return  # T5's documented 0.5 "minor hack" shifts by one; covered by its own formula
  if int(round(raw * density)) < 1 or int(round(int(round(raw * density)) / mean)) < 1:
    # T5's helper plans for no noise or no span here, the mask makes one (at least one of
    # each): planned so, the inputs fit (T5's plan was a token too long for the encoder).
    noise, spans = sc._noise_counts(raw, density, mean)
    assert raw - noise + spans + 1 <= seq_len and target == noise + spans + 1
    return
  assert lengths(raw)[0] <= seq_len < lengths(raw + 1)[0]
  assert target == lengths(raw)[1]


@pytest.mark.parametrize('density, mean', [(0.15, 500.0), (0.003, 3.0)])
def test_settings_that_round_to_no_span_still_fit(density, mean):
  """mean_noise_span_length 500 or noise_density 0.003 at 128 tokens: the mask makes one span
  of at least one token; the planned lengths used to assume none and the inputs overflowed
  ('example of 129 tokens is longer than the encoder length 128')."""
  raw, target = sc.target_length(128, density, mean)
  rng = np.random.default_rng(0)
  for _ in range(5):
    mask = sc.random_spans_noise_mask(raw, rng, noise_density=density,
                                      mean_noise_span_length=mean)
    spans = int(np.sum(mask[1:] & ~mask[:-1]) + mask[0])
    assert raw - mask.sum() + spans + 1 <= 128 and mask.sum() + spans + 1 <= target


def test_noise_counts_follow_t5_rounding_and_clamps():
  assert sc._noise_counts(568, 0.15, 3.0) == (85, 28)
  assert sc._noise_counts(30, 0.15, 3.0) == (4, 1)   # round(4.5) = 4 (half to even, like tf)
  assert sc._noise_counts(10, 0.15, 3.0) == (2, 1)   # round(1.5) = 2
  assert sc._noise_counts(2, 0.15, 3.0) == (1, 1)    # clamped up to 1 noise token
  assert sc._noise_counts(4, 0.9, 3.0) == (3, 1)     # clamped down to L - 1


def test_noise_counts_are_t5_masks_float32_arithmetic():
  """T5's random_spans_noise_mask multiplies in float32: 190 * 0.15 is 28.500001 there (29
  noise tokens), 28.499999999999996 in float64 (28). These are T5's own outputs (t5 0.9.4 under
  TensorFlow); the mask used float64 and made one noise token and span fewer."""
  assert sc._noise_counts(190, 0.15, 3.0) == (29, 10)
  assert sc._noise_counts(350, 0.15, 3.0) == (53, 18)
  assert sc._noise_counts(390, 0.15, 3.0) == (59, 20)
  assert sc._noise_counts(190, 0.15, 3.0, helper=True) == (28, 9)   # T5's length helper
  rng = np.random.default_rng(0)
  mask = sc.random_spans_noise_mask(190, rng)
  assert mask.sum() == 29 and int(np.sum(mask[1:] & ~mask[:-1]) + mask[0]) == 10


def test_the_plan_follows_the_mask_where_t5s_helper_and_mask_disagree():
  """At seq_len 172 T5's helper plans (190, 38) but its mask makes 29 noise tokens in 10 spans
  of a 190-token chunk: 40 targets. Every chunk up to raw_len fits the plan."""
  assert sc.target_length(172) == (190, 40)
  for density, mean in [(0.15, 3.0), (0.3, 8.0), (0.5, 3.0)]:
    for seq_len in range(3, 700):
      raw, target = sc.target_length(seq_len, density, mean)
      for n in range(1, raw + 1):
        noise, spans = sc._noise_counts(max(n, 2), density, mean)
        noise = min(noise, n)
        assert n - noise + spans + 1 <= seq_len and noise + spans + 1 <= target, (seq_len, n)


@pytest.mark.parametrize('length', [1, 2, 3, 7, 50, 568, 1000])
def test_noise_mask_structure(length):
  rng = np.random.default_rng(length)
  for _ in range(20):
    mask = sc.random_spans_noise_mask(length, rng)
    assert mask.shape == (length,) and mask.dtype == bool
    num_noise, num_spans = sc._noise_counts(max(length, 2), 0.15, 3.0)
    if length >= 2:
      assert mask.sum() == num_noise
      starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
      assert len(starts) == num_spans
      assert not mask[0] and mask[-1]  # non-noise first, noise last (T5 interleaving)
    else:
      assert not mask.any()


def test_mean_span_length_is_about_three():
  rng = np.random.default_rng(0)
  lengths = []
  for _ in range(300):
    mask = sc.random_spans_noise_mask(568, rng)
    edges = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
    lengths += list(np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1))
  assert abs(np.mean(lengths) - 85 / 28) < 1e-9  # exactly num_noise / num_spans per chunk
  assert len(set(lengths)) > 3  # but span lengths vary


def test_sentinels_literal():
  tokens = np.arange(10, 18)
  mask = np.array([0, 0, 1, 1, 0, 0, 0, 1], bool)
  assert sc.noise_span_to_unique_sentinel(tokens, mask, 99).tolist() == [10, 11, 99, 14, 15, 16,
                                                                          98]
  assert sc.noise_span_to_unique_sentinel(tokens, ~mask, 99).tolist() == [99, 12, 13, 98, 17]


def test_span_corruption_of_568_tokens_gives_512_and_114():
  rng = np.random.default_rng(1)
  tokens = rng.integers(10, 1900, 568)
  inputs, targets = sc.span_corruption(tokens, rng, first_sentinel=FIRST_SENTINEL, eos_id=EOS)
  assert inputs.shape == (512,) and targets.shape == (114,)
  assert inputs[-1] == EOS and targets[-1] == EOS
  sentinels = inputs[inputs > 1900]
  assert sentinels.tolist() == list(range(FIRST_SENTINEL, FIRST_SENTINEL - 28, -1))


def test_reconstruction_invariant_every_length():
  rng = np.random.default_rng(2)
  raw_len, target_len = sc.target_length(512)
  for length in list(range(1, 120)) + list(range(500, raw_len + 1)):
    tokens = rng.integers(10, 1900, length)
    inputs, targets = sc.span_corruption(tokens, rng, first_sentinel=FIRST_SENTINEL, eos_id=EOS)
    assert splice(inputs, targets) == tokens.tolist(), length
    assert len(inputs) <= 512 and len(targets) <= target_len, length


def test_max_spans_and_bad_arguments():
  assert sc.max_spans(568, 0.15, 3.0) == 28
  with pytest.raises(ValueError, match='noise_density'):
    sc.target_length(512, noise_density=0.0)
  with pytest.raises(ValueError, match='seq_len=2'):
    sc.target_length(2)
  with pytest.raises(ValueError, match='non-empty'):
    sc.span_corruption(np.array([], np.int32), np.random.default_rng(0), first_sentinel=9,
                       eos_id=1)
