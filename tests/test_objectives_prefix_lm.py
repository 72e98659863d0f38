"""The prefix-LM objective: a split per packed piece, the loss after it."""
import numpy as np
import pytest

from pretrain_jax.objectives import prefix_lm


class FixedDraws:
  """A stand-in Generator whose `random` returns given values (to pin the split points)."""

  def __init__(self, draws):
    self.draws = np.asarray(draws, np.float64)

  def random(self, shape):
    assert shape == self.draws.shape
    return self.draws


def test_worked_example_of_the_docstring():
  seg = np.array([[1, 1, 1, 1, 1, 2, 2, 0]])
  pos = np.array([[0, 1, 2, 3, 4, 0, 1, 0]])
  # piece 1: n = 5, draw 0.5 -> P = 1 + int(0.5 * 4) = 3; piece 2: n = 2 -> P = 1 always
  out = prefix_lm.features(seg, pos, FixedDraws([[0.5, 0, 0, 0, 0, 0.99, 0, 0]]))
  np.testing.assert_array_equal(out['prefix'], [[1, 1, 1, 0, 0, 1, 0, 0]])
  np.testing.assert_array_equal(out['loss_weights'], [[0, 0, 1, 1, 1, 1, 1, 0]])
  assert out['prefix'].dtype == np.int32 and out['loss_weights'].dtype == np.float32


@pytest.mark.parametrize('seed', range(5))
def test_every_piece_splits_inside_itself_and_trains_on_the_rest(seed):
  rng = np.random.default_rng(seed)
  seg = np.array([[1] * 7 + [2] * 1 + [3] * 4 + [0] * 4, [1] * 16])
  pos = np.concatenate([np.r_[np.arange(7), 0, np.arange(4), np.zeros(4, int)][None],
                        np.arange(16)[None]])
  out = prefix_lm.features(seg, pos, rng)
  split = prefix_lm.split_points(seg, np.random.default_rng(seed))
  for row in range(2):
    for sid in set(seg[row]) - {0}:
      where = seg[row] == sid
      n, p = int(where.sum()), int(split[row][where][0])
      assert (split[row][where] == p).all()
      assert 1 <= p <= max(n - 1, 1)
      np.testing.assert_array_equal(out['prefix'][row][where], np.arange(n) < p)
      np.testing.assert_array_equal(out['loss_weights'][row][where], np.arange(n) >= p - 1)
  np.testing.assert_array_equal(out['prefix'][0, 12:], 0)          # padding: no prefix, no loss
  np.testing.assert_array_equal(out['loss_weights'][0, 12:], 0)


def test_split_points_cover_the_range():
  """P is uniform over 1..n-1: every value appears over many draws of one 5-token piece."""
  seg = np.ones((400, 5), np.int32)
  split = prefix_lm.split_points(seg, np.random.default_rng(0))[:, 0]
  assert set(split.tolist()) == {1, 2, 3, 4}
