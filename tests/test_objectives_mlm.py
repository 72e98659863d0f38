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
