"""The LM head run in chunks or on the weighted positions only: the same sums and gradients as
the whole-sequence loss."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from modeling import VOCAB, init, tiny

from configs import common
from pretrain_jax.data.config import DataConfig, TaskDataConfig
from pretrain_jax.models import build, family_of
from pretrain_jax.training import losses, task
from pretrain_jax.training import step as step_lib
from pretrain_jax.training.config import TrainConfig
from pretrain_jax.training.synthetic import SyntheticDataset

CASES = [('gpt', {}), ('gpt', dict(tie_embeddings=False)), ('bert', dict(nsp=True)),
         ('t5', {}), ('t5', dict(tie_embeddings=True, activation='relu'))]


def _batch(family, seq_len=12):
  batch = SyntheticDataset(family, vocab_size=VOCAB, seq_len=seq_len, batch_size=3,
                           nsp=family == 'bert').batch(0)
  key = family_of(family).weight_key
  weights = batch[key].copy()
  weights[0, -3:] = 0.0                          # some ignored positions, near a chunk edge
  batch[key] = weights
  return {k: jnp.asarray(v) for k, v in batch.items()}


def _sums_and_grads(cfg, params, batch, **loss_kw):
  """(loss sums, gradients) of the total loss with dropout on; loss_kw go to task.loss_sums."""
  model = build(cfg)
  # The dropout key is an 'rbg' one: the same masks on both sides, as with JAX's default
  # threefry, whose per-element hashing makes T5's step compile several times slower.
  key = jax.random.key(3, impl='rbg')

  def loss(p):
    sums = task.loss_sums(model, p, batch, rngs={'dropout': key}, **loss_kw)
    return task.total_loss(sums, task.denominators(cfg.family, batch)), sums
  # jitted: one compile of the step instead of one per operation; both sides alike
  (_, sums), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return sums, grads


@pytest.mark.parametrize('family,kw', CASES)
def test_chunked_loss_matches_whole_sequence_with_dropout(family, kw):
  cfg = tiny(family, dropout_rate=0.1, attention_dropout_rate=0.1, deterministic=False, **kw)
  params = init(cfg, length=12)
  batch = _batch(family)
  whole, whole_grads = _sums_and_grads(cfg, params, batch, z_loss=1e-3)
  # 5 does not divide the target length (12, or 6 for T5): the last chunk is padded.
  sums, grads = _sums_and_grads(cfg, params, batch, z_loss=1e-3, loss_chunk_len=5)
  assert sums.keys() == whole.keys()
  for k in whole:
    np.testing.assert_allclose(sums[k], whole[k], rtol=1e-5, atol=1e-6, err_msg=k)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               grads, whole_grads)
  assert float(whole['lm_weight']) == float(jnp.sum(batch[family_of(family).weight_key]))


@pytest.mark.parametrize('family,kw', CASES)
def test_hidden_then_logits_is_the_model_call(family, kw):
  cfg = tiny(family, **kw)
  params = init(cfg, length=12)
  batch = _batch(family)
  args, kwargs = family_of(family).model_inputs(batch)
  model = build(cfg)
  out = jax.jit(model.apply)({'params': params}, *args, **kwargs)
  logits = out[0] if family == 'bert' else out
  sums = jax.jit(lambda p, b: task.loss_sums(model, p, b, loss_chunk_len=5))(params, batch)
  ref = losses.cross_entropy_sums(logits, batch[family_of(family).target_key],
                                  batch[family_of(family).weight_key])
  np.testing.assert_allclose(sums['lm'], ref['loss'], rtol=1e-5)
  np.testing.assert_allclose(sums['lm_correct'], ref['correct'])
  if family == 'bert':
    nsp = losses.cross_entropy_sums(out[1], batch['nsp_labels'], jnp.ones((3,)))
    np.testing.assert_allclose(sums['nsp'], nsp['loss'], rtol=1e-5)


def test_negative_chunk_is_refused():
  with pytest.raises(ValueError, match='loss_chunk_len=-1'):
    losses.chunked_cross_entropy_sums(lambda h: h, jnp.zeros((1, 4, 2)),
                                      jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 4)),
                                      chunk_len=-1)


@pytest.mark.parametrize('count', [6, 2])
def test_head_on_weighted_positions_only_is_exact(count):
  """BERT's max_predictions_per_seq: rows have <= 4 weighted positions here, so 6 gathers and
  2 overflows (the whole-row fallback); both must give the whole-sequence sums and gradients."""
  cfg = tiny('bert', nsp=True, dropout_rate=0.1, deterministic=False)
  params = init(cfg, length=12)
  batch = _batch('bert')
  weights = np.zeros((3, 12), np.float32)
  weights[0, [1, 4, 5, 11]] = 1.0
  weights[1, [0, 7]] = 1.0
  weights[2, 9] = 0.5                              # any nonzero weight is a prediction
  batch['loss_weights'] = jnp.asarray(weights)
  whole, whole_grads = _sums_and_grads(cfg, params, batch)
  sums, grads = _sums_and_grads(cfg, params, batch, max_predictions=count,
                                loss_chunk_len=5 if count == 6 else 0)
  for k in whole:
    np.testing.assert_allclose(sums[k], whole[k], rtol=1e-5, atol=1e-6, err_msg=k)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               grads, whole_grads)
  assert float(sums['lm_weight']) == 6.5


def test_gather_predictions_keeps_every_weighted_position():
  hidden = jnp.arange(2 * 5 * 1, dtype=jnp.float32).reshape(2, 5, 1)
  targets = jnp.arange(10).reshape(2, 5)
  weights = jnp.array([[0., 1., 0., 1., 0.], [0., 0., 0., 0., 1.]])
  h, t, w = task.gather_predictions(hidden, targets, weights, 2)
  assert sorted(t[0].tolist()) == [1, 3] and w[0].tolist() == [1.0, 1.0]
  assert 9 in t[1].tolist() and float(jnp.sum(w[1])) == 1.0
  np.testing.assert_array_equal(h[..., 0], t.astype(jnp.float32))
  with pytest.raises(ValueError, match='max_predictions_per_seq=-2'):
    task.loss_sums(None, None, {}, max_predictions=-2)


def test_max_predictions_resolves_from_the_objective():

  def resolve(value, objective='mlm', seq_len=512):
    t = common.train_config(batch_size=8, steps=10, learning_rate=1e-3)
    t.max_predictions_per_seq = value
    data = DataConfig(objective=objective, seq_len=seq_len, mlm_probability=0.15)
    return step_lib.max_predictions(TrainConfig.from_config(t), data)
  assert resolve(-1) == 128       # 76.8 + 6 sd = 125.3, to 8s
  assert resolve(-1, seq_len=48) == 24
  assert resolve(-1, objective='clm') == 0
  assert resolve(7) == 7
  with pytest.raises(ValueError, match='max_predictions_per_seq=-3'):
    resolve(-3)
  assert TaskDataConfig().max_predictions(-1) == 0   # a fine-tune has no MLM objective
  # the bound is rarely exceeded: 15% Bernoulli rows of 512 positions
  counts = np.random.default_rng(0).binomial(512, 0.15, 200_000)
  assert counts.max() <= 128
