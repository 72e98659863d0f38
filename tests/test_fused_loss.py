"""The fused LM head + cross-entropy (training/fused_loss.py): the autodiff loss's sums, metrics
and gradients for every family, and no (B, T, V) logits kept."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from modeling import VOCAB, init, tiny

from pretrain_jax.models import build, family_of
from pretrain_jax.training import fused_loss, task
from pretrain_jax.training import step as step_lib
from pretrain_jax.training.state import TrainState
from pretrain_jax.training.synthetic import SyntheticDataset

CASES = [('gpt', {}), ('gpt', dict(tie_embeddings=False, head_bias=True)),
         ('bert', dict(nsp=True)), ('bert', dict(nsp=True, tie_embeddings=False)),
         ('t5', {}), ('t5', dict(tie_embeddings=True))]
LENGTH = 12


@functools.cache
def _model(family, items):
  """(config, parameters) of a tiny 1-layer model, made once per case."""
  cfg = tiny(family, num_layers=1, **dict(items))
  return cfg, init(cfg, length=LENGTH)


@pytest.fixture
def case(request):
  family, kw = request.param
  return (family,) + _model(family, tuple(sorted(kw.items())))


def _batch(family, rows=4):
  batch = SyntheticDataset(family, vocab_size=VOCAB, seq_len=LENGTH, batch_size=rows,
                           nsp=family == 'bert').batch(0)
  key = family_of(family).weight_key
  weights = batch[key].astype(np.float32)
  weights[0, -3:] = 0.0                      # padding, at a chunk's edge
  weights[1, weights[1] > 0] *= 0.5           # weights other than 0 and 1
  batch[key] = weights
  return {k: jnp.asarray(v) for k, v in batch.items()}


def _sums_and_grads(cfg, params, batch, **loss_kw):
  """(loss sums, gradients of the total loss)."""
  model = build(cfg)

  def loss(p):
    sums = task.loss_sums(model, p, batch, z_loss=1e-2, top5=True, **loss_kw)
    return task.total_loss(sums, task.denominators(cfg.family, batch)), sums
  (_, sums), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return sums, grads


def _assert_same(got, want):
  (sums, grads), (ref_sums, ref_grads) = got, want
  assert sums.keys() == ref_sums.keys()
  for k in ref_sums:
    np.testing.assert_allclose(sums[k], ref_sums[k], rtol=1e-5, atol=1e-5, err_msg=k)
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(ref_grads))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * scale),
               grads, ref_grads)


@pytest.mark.parametrize('case', CASES, indirect=True, ids=lambda c: f'{c[0]}-{c[1]}')
def test_fused_loss_equals_autodiff(case):
  """z-loss, padding and fractional weights, 5-position chunks with a ragged tail (T5's
  decoder: 6 positions), and the top-5 count; the total loss's gradient for every weight."""
  family, cfg, params = case
  batch = _batch(family)
  want = _sums_and_grads(cfg, params, batch)
  got = _sums_and_grads(cfg, params, batch, fused_loss=True, loss_chunk_len=5)
  _assert_same(got, want)
  assert float(got[0]['lm_top5']) >= float(got[0]['lm_correct'])


@pytest.mark.parametrize('count,chunk', [(6, 4), (2, 0)])
def test_fused_loss_on_gathered_positions(count, chunk):
  """BERT's max_predictions_per_seq: 6 gathers every weighted position of each row (in two
  chunks of 4); 2 overflows a row, which runs the whole-row fallback (one chunk)."""
  _, cfg, params = ('bert',) + _model('bert', (('nsp', True),))
  batch = _batch('bert')
  weights = np.zeros((4, LENGTH), np.float32)
  weights[0, [1, 4, 5, 11]] = 1.0
  weights[1, [0, 7]] = 1.0
  weights[2, 9] = 0.5
  batch['loss_weights'] = jnp.asarray(weights)
  want = _sums_and_grads(cfg, params, batch)
  got = _sums_and_grads(cfg, params, batch, fused_loss=True, max_predictions=count,
                        loss_chunk_len=chunk)
  _assert_same(got, want)
  assert float(got[0]['lm_weight']) == 6.5


@pytest.mark.parametrize('family', ['gpt', 't5'])
def test_microbatched_train_and_eval_steps_match_autodiff(family):
  """Two microbatches, one SGD step (Adam would blow gradients at rounding level up to the
  learning rate): the same metrics and updated parameters; and the eval step's sums (top-5
  included)."""
  cfg, params = _model(family, ())
  batch = _batch(family)
  tx = optax.sgd(1.0)

  def run(fused):
    model = build(cfg)
    step = step_lib.make_train_step(model, tx, lambda s: 1e-3, seed=0, microbatches=2,
                                    z_loss=1e-3, loss_chunk_len=4, fused_loss=fused)

    def one(params):
      state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
      new, metrics = step(state, batch)
      return new.params, metrics
    evaluate = step_lib.make_eval_step(build(cfg.replace(deterministic=True)), 4,
                                       fused_loss=fused)
    return jax.jit(one)(params), jax.jit(evaluate)(params, batch)

  (got_params, got), got_eval = run(True)
  (want_params, want), want_eval = run(False)
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-6, err_msg=k)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               got_params, want_params)
  moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), got_params, params)
  assert max(jax.tree.leaves(moved)) > 1e-3                             # a step was taken
  for k in want_eval[0]:
    np.testing.assert_allclose(got_eval[0][k], want_eval[0][k], rtol=1e-5, err_msg=k)
  assert 'lm_top5' in got_eval[0]


def test_the_compiled_step_keeps_no_logits():
  """XLA:CPU's temporaries of the train step's gradient: the whole-sequence autodiff loss
  holds a float32 (B, T, V) logits array (32 MiB here); the chunked autodiff loss
  (train.loss_chunk_len, which recomputes each chunk) and the fused one a (B, 32, V) chunk's
  few arrays."""
  cfg = tiny('gpt', vocab_size=8192, max_len=256)
  params = init(cfg, length=256)
  batch = SyntheticDataset('gpt', vocab_size=8192, seq_len=256, batch_size=4).batch(0)
  model = build(cfg)

  def temp_bytes(fused):
    grad = jax.grad(lambda p, b: task.total_loss(
        task.loss_sums(model, p, b, fused_loss=fused, loss_chunk_len=32),
        task.denominators('gpt', b)))
    return jax.jit(grad).lower(params, batch).compile().memory_analysis().temp_size_in_bytes
  logits_bytes = 4 * 256 * 8192 * 4
  autodiff, fused = temp_bytes(False), temp_bytes(True)
  whole = jax.jit(jax.grad(lambda p, b: task.total_loss(
      task.loss_sums(model, p, b), task.denominators('gpt', b)))).lower(
          params, batch).compile().memory_analysis().temp_size_in_bytes
  assert whole > logits_bytes
  assert autodiff < whole - logits_bytes
  assert fused < whole - logits_bytes
  assert fused < autodiff + logits_bytes / 8


def test_bad_chunks_are_refused():
  with pytest.raises(ValueError, match='chunk_len=0'):
    fused_loss.fused_cross_entropy_sums(None, None, None, chunk_len=0)
