"""MLM corruption against its definition: 15% selected, 80/10/10, never specials or padding."""
import numpy as np

from pretrain_jax.objectives import mlm

MASK, CLS, SEP = 5, 3, 4
RANDOM_IDS = np.arange(6, 2000)


def batch(rng, shape=(1000, 1024)):
  tokens = rng.integers(6, 2000, shape).astype(np.int32)
  tokens[:, 0] = CLS
  tokens[:, -101] = SEP
  tokens[:, -100:] = 0  # padding tail
  selectable = (tokens > 5)
  return tokens, selectable


def test_rates_over_a_million_tokens():
  rng = np.random.default_rng(0)
  tokens, selectable = batch(rng)
  out = mlm.mask_tokens(tokens, rng, selectable=selectable, random_ids=RANDOM_IDS, mask_id=MASK)
  sel = out['selected']
  assert selectable.sum() > 900_000
  assert abs(sel.sum() / selectable.sum() - 0.15) < 0.003
  n = sel.sum()
  masked = (out['inputs'] == MASK) & sel
  unchanged = (out['inputs'] == tokens) & sel
  randomised = sel & ~masked & ~unchanged
  assert abs(masked.sum() / n - 0.8) < 0.01
  assert abs(unchanged.sum() / n - 0.1) < 0.01  # + 1/1994 chance a random token is the same
  assert abs(randomised.sum() / n - 0.1) < 0.01
  # Never specials or padding; nothing outside the selection changes; weights only there.
  assert not (sel & ~selectable).any()
  assert (out['inputs'][~sel] == tokens[~sel]).all()
  assert (out['loss_weights'] == sel).all() and out['loss_weights'].dtype == np.float32
  assert (out['targets'] == tokens).all()
  assert np.isin(out['inputs'][randomised], RANDOM_IDS).all()


def test_same_seed_same_corruption_and_rate_is_configurable():
  tokens, selectable = batch(np.random.default_rng(1), (64, 128))
  kw = dict(selectable=selectable, random_ids=RANDOM_IDS, mask_id=MASK)
  a = mlm.mask_tokens(tokens, np.random.default_rng(7), **kw)
  b = mlm.mask_tokens(tokens, np.random.default_rng(7), **kw)
  c = mlm.mask_tokens(tokens, np.random.default_rng(8), **kw)
  assert (a['inputs'] == b['inputs']).all() and (a['inputs'] != c['inputs']).any()
  high = mlm.mask_tokens(tokens, np.random.default_rng(7), probability=0.5, **kw)
  assert abs(high['selected'].sum() / selectable.sum() - 0.5) < 0.02


def test_whole_word_masking_selects_whole_words():
  rng = np.random.default_rng(3)
  tokens, selectable = batch(rng, (400, 256))
  word_starts = rng.random(tokens.shape) < 0.4  # words of ~2.5 pieces
  out = mlm.mask_tokens(tokens, rng, selectable=selectable, random_ids=RANDOM_IDS,
                        mask_id=MASK, word_starts=word_starts)
  sel = out['selected']
  starts = word_starts | ~selectable
  starts[:, 0] = True
  word_id = np.cumsum(starts, axis=1)
  for r in range(50):
    for w in np.unique(word_id[r][selectable[r]]):
      in_word = (word_id[r] == w) & selectable[r]
      assert sel[r][in_word].all() or not sel[r][in_word].any()
  assert abs(sel.sum() / selectable.sum() - 0.15) < 0.01
  assert not (sel & ~selectable).any()


# ---- span masking (SpanBERT) ------------------------------------------------------------------

def _spans(span_ids):
  """[(row, positions)] of every span of a (B, T) span_ids array."""
  return [(b, np.flatnonzero(row == k)) for b, row in enumerate(span_ids)
          for k in range(1, row.max() + 1)]


def test_span_length_pmf_is_the_truncated_geometric():
  pmf = mlm.span_length_pmf(0.2, 10)
  np.testing.assert_allclose(pmf[:3] / pmf[0], [1.0, 0.8, 0.64])
  assert abs(pmf.sum() - 1) < 1e-12 and len(pmf) == 10
  assert abs((np.arange(1, 11) * pmf).sum() - 3.79) < 0.01      # SpanBERT's mean span length


def test_span_masking_rate_and_lengths_on_a_large_sample():
  """One document per row: the masked share is 15% of the selectable tokens and the spans'
  lengths follow the truncated geometric distribution (the last span of a row, cut to the
  row's budget, left out)."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(6, 2000, (48, 4096)).astype(np.int32)
  selectable = np.ones(tokens.shape, bool)
  out = mlm.mask_spans(tokens, rng, selectable=selectable, segment_ids=np.ones_like(tokens),
                       random_ids=RANDOM_IDS, mask_id=MASK)
  assert abs(out['selected'].mean() - 0.15) < 0.0005
  lengths = [len(pos) for b, pos in _spans(out['span_ids'])
             if pos[0] != np.flatnonzero(out['span_ids'][b] == out['span_ids'][b].max())[0]]
  assert len(lengths) > 7000
  histogram = np.bincount(lengths, minlength=11)[1:] / len(lengths)
  np.testing.assert_allclose(histogram, mlm.span_length_pmf(0.2, 10), atol=0.012)
  assert abs(np.mean(lengths) - 3.79) < 0.08
  assert (out['loss_weights'] == out['selected']).all() and (out['targets'] == tokens).all()


def test_spans_stay_in_one_document_and_get_80_10_10_per_span():
  """Packed rows of short documents between [CLS] / [SEP], padded: no span crosses a segment
  boundary or touches a special token or padding; each span is all [MASK], all random or all
  kept, in 80/10/10 proportions over the spans."""
  rng = np.random.default_rng(1)
  tokens = rng.integers(6, 2000, (800, 256)).astype(np.int32)
  lengths = rng.integers(3, 30, (800, 40))
  segment_ids = np.zeros(tokens.shape, np.int32)
  for b in range(800):
    cuts = np.cumsum(lengths[b])
    segment_ids[b] = np.searchsorted(cuts, np.arange(256), side='right') + 1
    starts = np.concatenate([[0], cuts[cuts < 256]])
    tokens[b, starts] = CLS
  segment_ids[:, -20:] = 0
  tokens[:, -20:] = 0
  selectable = (tokens > 5) & (segment_ids > 0)
  out = mlm.mask_spans(tokens, rng, selectable=selectable, segment_ids=segment_ids,
                       random_ids=RANDOM_IDS, mask_id=MASK)
  assert not (out['selected'] & ~selectable).any()
  assert abs(out['selected'].sum() / selectable.sum() - 0.15) < 0.002
  kinds = []
  for b, pos in _spans(out['span_ids']):
    assert (np.diff(pos) == 1).all() and len(set(segment_ids[b, pos])) == 1, (b, pos)
    got = out['inputs'][b, pos]
    masked, kept = (got == MASK).all(), (got == tokens[b, pos]).all()
    assert masked or kept or np.isin(got, RANDOM_IDS).all()
    kinds.append('mask' if masked else 'kept' if kept else 'random')
  assert len(kinds) > 7000
  shares = [kinds.count(k) / len(kinds) for k in ('mask', 'random', 'kept')]
  np.testing.assert_allclose(shares, [0.8, 0.1, 0.1], atol=0.02)
  assert (out['inputs'][~out['selected']] == tokens[~out['selected']]).all()


def test_fixed_span_length():
  rng = np.random.default_rng(2)
  tokens = rng.integers(6, 2000, (16, 2048)).astype(np.int32)
  out = mlm.mask_spans(tokens, rng, selectable=np.ones(tokens.shape, bool),
                       segment_ids=np.ones_like(tokens), random_ids=RANDOM_IDS, mask_id=MASK,
                       span_length=3)
  lengths = np.array([len(pos) for _, pos in _spans(out['span_ids'])])
  assert lengths.max() == 3 and (lengths == 3).mean() > 0.97   # (a cut one ends each row)
  assert abs(out['selected'].mean() - 0.15) < 0.002
