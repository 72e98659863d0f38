"""cross_entropy_sums against the textbook formulas: logsumexp, jnp.argmax (ties included),
for vocabularies searched whole (11) and, with blockwise_max (the CPU tuning's), in blocks
(320 = 2 x 160, 3000 = 6 x 500)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pretrain_jax.training import losses


def _reference(logits, targets, weights, z_loss):
  log_z = jax.nn.logsumexp(logits, axis=-1)
  nll = log_z - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return {'loss': jnp.sum(nll * weights), 'z_loss': z_loss * jnp.sum(log_z ** 2 * weights),
          'correct': jnp.sum(correct * weights), 'weight': jnp.sum(weights)}


def _case(seed=0, shape=(3, 7), vocab=11):
  rng = np.random.default_rng(seed)
  # Small integers: most rows have several maxima (in several blocks of a large vocabulary),
  # so the argmax tie rule decides hits. Large vocabularies get a rarer top value, so that
  # some rows' first maximum lies in a later block.
  top = 3 if vocab < 64 else 40
  logits = rng.integers(-2, top, size=shape + (vocab,)).astype(np.float32)
  logits[0, 0] = 1.0                                   # a row that is all one value
  logits[1, 2, :4] = -np.inf                           # masked-out vocabulary entries
  maxima = [np.flatnonzero(row == row.max()) for row in logits.reshape(-1, vocab)]
  # Targets: the first maximum, a later maximum (a tie argmax does not pick) or any id.
  picks = [m[0] if i % 3 == 0 else m[-1] if i % 3 == 1 else rng.integers(vocab)
           for i, m in enumerate(maxima)]
  targets = np.array(picks, np.int32).reshape(shape)
  weights = rng.integers(0, 3, size=shape).astype(np.float32)
  return jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights)


@pytest.mark.parametrize('blockwise', [False, True])
@pytest.mark.parametrize('vocab', [11, 320, 3000])
def test_sums_match_logsumexp_and_argmax_with_ties(vocab, blockwise):
  logits, targets, weights = _case(shape=(4, 9), vocab=vocab)
  later_ties = sum(int(np.flatnonzero(row == row.max())[0] != t)
                   for row, t in zip(np.asarray(logits).reshape(-1, vocab),
                                     np.asarray(targets).ravel(), strict=True)
                   if row[t] == row.max())
  assert later_ties > 0                                # the case really has tied maxima
  got = losses.cross_entropy_sums(logits, targets, weights, z_loss=1e-3, blockwise_max=blockwise)
  want = _reference(logits, targets, weights, 1e-3)
  assert got.keys() == want.keys()
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-6, err_msg=k)
  assert float(got['correct']) == float(want['correct'])


@pytest.mark.parametrize('blockwise', [False, True])
@pytest.mark.parametrize('vocab', [11, 320])
def test_gradient_matches_logsumexp(vocab, blockwise):
  logits, targets, weights = _case(seed=1, vocab=vocab)
  logits = jnp.where(jnp.isfinite(logits), logits + 0.1 * jax.random.normal(
      jax.random.key(0), logits.shape), logits)

  def total(fn):
    return jax.grad(lambda x: (lambda s: s['loss'] + s['z_loss'])(
        fn(x, targets, weights, 1e-3)))(logits)
  got = total(lambda *a: losses.cross_entropy_sums(*a, blockwise_max=blockwise))
  want = total(_reference)
  assert np.all(np.isfinite(np.asarray(got)))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)



def test_blocked_search_finds_maxima_in_every_block():
  """One maximum per row, placed in each block in turn (and at both ends of a block)."""
  vocab = 3000                                          # 6 blocks of 500
  places = [0, 499, 500, 999, 1700, 2499, 2500, 2999]
  logits = np.zeros((len(places), vocab), np.float32)
  logits[np.arange(len(places)), places] = 1.0
  logits[2, 2800] = 1.0                                 # a later tie: the first one counts
  targets = jnp.asarray(places, jnp.int32)
  got = losses.cross_entropy_sums(jnp.asarray(logits), targets, jnp.ones(len(places)),
                                  blockwise_max=True)
  assert float(got['correct']) == len(places)
  got = losses.cross_entropy_sums(jnp.asarray(logits), targets + 1, jnp.ones(len(places)),
                                  blockwise_max=True)
  assert float(got['correct']) == 0.0


def test_the_whole_row_search_gives_the_block_search_sums():
  """Without blockwise_max (the plain tuning's, off CPU) the whole row is searched, with the
  same sums."""
  logits, targets, weights = _case(shape=(4, 9), vocab=3000)
  on_cpu = losses.cross_entropy_sums(logits, targets, weights, blockwise_max=True)
  whole_row = losses.cross_entropy_sums(logits, targets, weights)
  for k in on_cpu:
    assert float(whole_row[k]) == float(on_cpu[k]), k
  assert float(on_cpu['correct']) == float(_reference(logits, targets, weights, 0.0)['correct'])
