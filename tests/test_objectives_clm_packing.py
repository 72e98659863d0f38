"""CLM pairs and T5-style packing against literals and invariants."""
import numpy as np
import pytest

from pretrain_jax.objectives import clm, packing


def pack_examples(examples: list, lengths: dict, features: dict,
                  first_fit: bool = False) -> dict:
  """Pure packing of `examples` into as many rows as needed: dict of (R, L) arrays.

  Next-fit by default (order kept row by row); `first_fit` puts each example in the first row
  with room (fewer rows, order kept within each row).
  """
  packer = packing.BatchPacker(max(len(examples), 1), lengths, features)
  for example in examples:
    if first_fit:
      packer.add(example, packer.first_fit(example))
    else:
      if not packer.fits(example):
        packer.next_row()
      packer.add(example)
  rows = int(np.count_nonzero(packer.segments))
  return {k: v[:rows] for k, v in packer.arrays.items()}


def test_clm_pairs_literal():
  inputs, targets = clm.clm_pairs(np.array([5, 6, 7]), eos_id=1)
  assert inputs.tolist() == [5, 6, 7] and targets.tolist() == [6, 7, 1]
  assert clm.loss_weights(np.array([[1, 1, 2, 0]])).tolist() == [[1, 1, 1, 0]]


def test_pack_examples_literal():
  examples = [{'inputs': np.array([1, 2, 3])}, {'inputs': np.array([4, 5])},
              {'inputs': np.array([6, 7, 8, 9])}, {'inputs': np.array([10])}]
  out = pack_examples(examples, {'': 6}, {'inputs': ''})
  assert out['inputs'].tolist() == [[1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 10, 0]]
  assert out['segment_ids'].tolist() == [[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 2, 0]]
  assert out['positions'].tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]]
  assert packing.real_fraction(out['segment_ids']) == 10 / 12


def test_pack_two_streams_share_segment_ids():
  examples = [{'enc': np.array([1, 2, 3]), 'dec': np.array([7])},
              {'enc': np.array([4]), 'dec': np.array([8, 9])},
              {'enc': np.array([5]), 'dec': np.array([6, 6])}]  # decoder row full -> new row
  out = pack_examples(examples, {'encoder': 5, 'decoder': 3},
                              {'enc': 'encoder', 'dec': 'decoder'})
  assert out['enc'].tolist() == [[1, 2, 3, 4, 0], [5, 0, 0, 0, 0]]
  assert out['dec'].tolist() == [[7, 8, 9], [6, 6, 0]]
  assert out['encoder_segment_ids'].tolist() == [[1, 1, 1, 2, 0], [1, 0, 0, 0, 0]]
  assert out['decoder_segment_ids'].tolist() == [[1, 2, 2], [1, 1, 0]]
  assert out['decoder_positions'].tolist() == [[0, 0, 1], [0, 1, 0]]


def test_padding_only_at_the_tail():
  rng = np.random.default_rng(0)
  examples = [{'x': rng.integers(1, 9, rng.integers(1, 20))} for _ in range(200)]
  out = pack_examples(examples, {'': 32}, {'x': ''})
  seg = out['segment_ids']
  assert (np.diff((seg > 0).astype(int), axis=1) <= 0).all()  # real then pad, never back
  assert (np.diff(seg, axis=1)[seg[:, 1:] > 0] >= 0).all()     # segment ids increase
  flat = [t for row, s in zip(out['x'], seg, strict=True) for t in row[s > 0]]
  assert flat == [t for e in examples for t in e['x']]         # order and content kept


def test_shift_right_by_segment_literal():
  targets = np.array([[5, 6, 7, 8, 9, 0]])
  seg = np.array([[1, 1, 1, 2, 2, 0]])
  assert packing.shift_right_by_segment(targets, seg).tolist() == [[0, 5, 6, 0, 8, 0]]


def test_packer_errors_name_the_problem():
  packer = packing.BatchPacker(1, {'': 4}, {'x': ''})
  with pytest.raises(ValueError, match='longer than the row length 4'):
    packer.add({'x': np.arange(5)})
  packer.add({'x': np.arange(3)})
  with pytest.raises(ValueError, match='does not fit'):
    packer.add({'x': np.arange(2)})
  assert not packer.next_row()  # batch of one row is full


def test_first_fit_fills_earlier_rows():
  examples = [{'x': np.array([1] * 4)}, {'x': np.array([2] * 4)}, {'x': np.array([3] * 2)},
              {'x': np.array([4] * 3)}]
  out = pack_examples(examples, {'': 6}, {'x': ''}, first_fit=True)
  assert out['x'].tolist() == [[1, 1, 1, 1, 3, 3], [2, 2, 2, 2, 0, 0], [4, 4, 4, 0, 0, 0]]
  assert out['segment_ids'].tolist() == [[1, 1, 1, 1, 2, 2], [1, 1, 1, 1, 0, 0],
                                         [1, 1, 1, 0, 0, 0]]
