"""NSP pairs against their definition: IsNext follows A, NotNext comes from elsewhere, 50/50."""
import numpy as np
import pytest

from pretrain_jax.objectives import nsp


def test_pairs_follow_or_come_from_the_other_document():
  rng = np.random.default_rng(0)
  labels = []
  for _ in range(800):
    doc = np.arange(0, int(rng.integers(2, 400)))
    other = np.arange(10_000, 10_000 + int(rng.integers(1, 300)))
    for start, a, b, label in nsp.nsp_pairs(doc, other, rng, max_tokens=61):
      labels.append(label)
      assert len(a) >= 1 and len(b) >= 1 and len(a) + len(b) <= 61
      assert a.tolist() == doc[start:start + len(a)].tolist()  # A is a window of the document
      if label == nsp.IS_NEXT:
        assert b.tolist() == doc[start + len(a):start + len(a) + len(b)].tolist()
      else:
        assert (b >= 10_000).all() and (np.diff(b) == 1).all()  # a window of `other`
  assert len(labels) > 4000
  assert abs(np.mean(labels) - 0.5) < 0.03


def test_pairs_cover_the_document_in_order():
  rng = np.random.default_rng(1)
  doc = np.arange(500)
  pairs = nsp.nsp_pairs(doc, np.arange(1000, 1100), rng, max_tokens=125)
  starts = [p[0] for p in pairs]
  assert starts == sorted(starts) and starts[0] == 0
  for (s, a, b, label), nxt in zip(pairs, starts[1:] + [None], strict=True):
    if nxt is not None:  # IsNext consumes A and B; NotNext puts B's tokens back
      assert nxt == s + len(a) + (len(b) if label == nsp.IS_NEXT else 0)


def test_short_documents_and_bad_lengths():
  rng = np.random.default_rng(0)
  assert nsp.nsp_pairs(np.array([7]), np.array([9]), rng, 10) == []
  with pytest.raises(ValueError, match='seq_len >= 5'):
    nsp.nsp_pairs(np.arange(5), np.arange(5), rng, 1)


def test_row_literal():
  row = nsp.nsp_row(np.array([7, 8]), np.array([9]), cls_id=3, sep_id=4)
  assert row['inputs'].tolist() == [3, 7, 8, 4, 9, 4]
  assert row['token_type_ids'].tolist() == [0, 0, 0, 0, 1, 1]
