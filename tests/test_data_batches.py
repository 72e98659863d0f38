"""Packing generators on synthetic documents: content kept, no cross-document targets, and
restarting from any yielded position reproduces the remaining batches exactly."""
import numpy as np
import pytest
from helpers import splice

from pretrain_jax.data import batches
from pretrain_jax.objectives import packing, span_corruption

EOS, CLS, SEP, SENTINEL0 = 1, 3, 4, 2047


def make_docs(n=40, seed=0, epochs=2, small_ids=False):
  """Documents whose tokens encode (doc, index) so every token's origin is known
  (small_ids: ids below the sentinels instead, origin no longer encoded)."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, 300, n)
  def make(d):
    return (10 + (d * 7 + np.arange(lengths[d])) % 1800 if small_ids else
            10 + d * 1000 + np.arange(lengths[d]) % 990)
  return [(e, d, make(d).astype(np.int32)) for e in range(epochs) for d in range(n)]


def stream_from(docs, epoch, doc):
  return iter([x for x in docs if (x[0], x[1]) >= (epoch, doc)])


def run(gen_fn, docs, position=(0, 0, 0)):
  out = []
  for arrays, pos in gen_fn(stream_from(docs, *position[:2]), position[2]):
    out.append(({k: v.copy() for k, v in arrays.items()}, pos))
  return out


def check_resume(gen_fn, docs):
  straight = run(gen_fn, docs)
  assert len(straight) > 5
  for k in range(len(straight) - 1):
    resumed = run(gen_fn, docs, straight[k][1])
    assert len(resumed) == len(straight) - k - 1
    for (a, pa), (b, pb) in zip(straight[k + 1:], resumed, strict=True):
      assert pa == pb and a.keys() == b.keys()
      for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=f'batch after {k}: {key}')
  return straight


def pieces(arrays, key='inputs', seg_key='segment_ids'):
  for row, seg in zip(arrays[key], arrays[seg_key], strict=True):
    for s in range(1, seg.max() + 1):
      yield row[seg == s]


def test_clm_batches_keep_documents_and_resume_exactly():
  docs = make_docs()
  def gen(d, o):
    return batches.clm_batches(d, o, batch_size=4, seq_len=64, pack=True, eos_id=EOS)
  out = check_resume(gen, docs)
  inputs = np.concatenate([p for a, _ in out for p in pieces(a)])
  targets = np.concatenate([p for a, _ in out for p in pieces(a, 'targets')])
  expected = np.concatenate([t for _, _, t in docs])
  np.testing.assert_array_equal(inputs, expected)  # every token once, in order
  expected_targets = np.concatenate([np.append(t[1:], EOS) for _, _, t in docs])
  np.testing.assert_array_equal(targets, expected_targets)  # next token of the SAME document
  for a, _ in out[:-1]:
    assert (a['segment_ids'] > 0).all()  # documents cut at row ends: no padding mid-stream
  assert out[-1][1] is None


def test_bert_batches_wrap_pieces_in_cls_sep():
  docs = make_docs(seed=1)
  def gen(d, o):
    return batches.bert_batches(d, o, batch_size=4, seq_len=50, pack=True,
                                cls_id=CLS, sep_id=SEP)
  out = check_resume(gen, docs)
  content = []
  for a, _ in out:
    for p in pieces(a):
      assert p[0] == CLS and p[-1] == SEP and len(p) >= 3
      content.append(p[1:-1])
  np.testing.assert_array_equal(np.concatenate(content),
                                np.concatenate([t for _, _, t in docs]))


def test_unpacked_rows_hold_one_piece():
  docs = make_docs(n=10, seed=2, epochs=1)
  out = run(lambda d, o: batches.clm_batches(d, o, batch_size=4, seq_len=64, pack=False,
                                             eos_id=EOS), docs)
  assert all(a['segment_ids'].max() <= 1 for a, _ in out)


def test_span_corruption_batches_reconstruct_and_resume():
  docs = make_docs(seed=3, small_ids=True)
  raw_len, target_len = span_corruption.target_length(64)
  def gen(d, o):
    return batches.span_corruption_batches(
        d, o, batch_size=4, seq_len=64, pack=True, seed=0, salt=(1, 0), first_sentinel=SENTINEL0,
        eos_id=EOS, noise_density=0.15, mean_noise_span_length=3.0)
  out = check_resume(gen, docs)
  chunks = [t[s:s + raw_len] for _, _, t in docs for s in range(0, len(t), raw_len)]
  got = []
  for a, _ in out:
    assert a['encoder_input_tokens'].shape == (4, 64)
    assert a['decoder_target_tokens'].shape == (4, target_len)
    np.testing.assert_array_equal(a['decoder_input_tokens'], packing.shift_right_by_segment(
        a['decoder_target_tokens'], a['decoder_segment_ids']))
    assert (a['encoder_segment_ids'].max(1) == a['decoder_segment_ids'].max(1)).all()
    got += [splice(i, t) for i, t in zip(pieces(a, 'encoder_input_tokens', 'encoder_segment_ids'),
                                         pieces(a, 'decoder_target_tokens', 'decoder_segment_ids'),
                                         strict=True)]
  # The reconstruction invariant end to end: every chunk exactly once (first-fit reorders rows).
  assert sorted(got) == sorted(c.tolist() for c in chunks)
  fill = np.mean([(a['encoder_segment_ids'] > 0).mean() for a, _ in out[:-1]])
  assert fill > 0.85  # first-fit packs the short tail chunks into earlier rows


def test_nsp_batches_one_pair_per_row_and_resume():
  docs = make_docs(seed=4)
  def first(epoch):
    return (0, docs[epoch * 40][2])
  def gen(d, o):
    return batches.nsp_batches(d, o, batch_size=4, seq_len=64, seed=0, salt=(1, 0),
                               cls_id=CLS, sep_id=SEP, first_document=first)
  out = check_resume(gen, docs)
  labels = np.concatenate([a['nsp_labels'] for a, _ in out])
  pairs = labels[labels >= 0]
  assert abs(pairs.mean() - 0.5) < 0.1 and len(pairs) > 100
  # The last batch is kept, its empty rows labelled -1: every pair is read at any batch size.
  assert (labels[:-4] >= 0).all() and 0 < len(labels) - len(pairs) < 4
  def rows_at(size):
    read = batches.nsp_batches(iter(docs), 0, batch_size=size, seq_len=64, seed=0, salt=(1, 0),
                               cls_id=CLS, sep_id=SEP, first_document=first)
    return [r for a, _ in read
            for r, label in zip(a['inputs'].tolist(), a['nsp_labels'], strict=True) if label >= 0]
  assert rows_at(1) == rows_at(3) == rows_at(4) and len(rows_at(1)) == len(pairs)
  for a, _ in out:
    assert (a['inputs'][a['nsp_labels'] >= 0, 0] == CLS).all()
    assert (a['segment_ids'].max(1) == (a['nsp_labels'] >= 0)).all()   # a -1 row is empty
    for row, types, seg, label in zip(a['inputs'], a['token_type_ids'], a['segment_ids'],
                                      a['nsp_labels'], strict=True):
      if label < 0:
        continue
      real = row[seg > 0]
      seps = np.flatnonzero(real == SEP)
      assert len(seps) == 2 and seps[1] == len(real) - 1
      assert (types[seg > 0] == (np.arange(len(real)) > seps[0])).all()
      a_doc, b_doc = real[1] // 1000, real[seps[0] + 1] // 1000
      assert (a_doc == b_doc) == (label == 0)  # IsNext: same document; NotNext: another


def test_nsp_needs_two_documents():
  docs = [(0, 0, np.arange(10, 50, dtype=np.int32))]
  gen = batches.nsp_batches(iter(docs), 0, batch_size=2, seq_len=16, seed=0, salt=(0, 0),
                            cls_id=CLS, sep_id=SEP, first_document=lambda e: (0, docs[0][2]))
  with pytest.raises(ValueError, match='at least 2 documents'):
    list(gen)
