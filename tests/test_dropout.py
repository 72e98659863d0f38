"""16-bit dropout masks (ops/cpu.py, the CPU form's): the realised rate, exact mean-preserving
scale; ops.Dropout (flax.linen.Dropout's API and key, the form's mask); the train step's
dropout PRNG."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from modeling import init

from pretrain_jax import ops
from pretrain_jax.models import ModelConfig, build
from pretrain_jax.ops import backends, cpu
from pretrain_jax.training import state as state_lib
from pretrain_jax.training import step as step_lib


def test_keep_mask_rate_and_scale():
  keep, scale = cpu.keep_mask(jax.random.key(0, impl='philox4x32'), 0.9, (1000, 1000))
  threshold = round(0.9 * 65536)                                          # 58982
  assert scale == pytest.approx(65536 / threshold)
  # 1e6 draws: the kept share has standard deviation 3e-4 around threshold / 2**16
  assert abs(float(jnp.mean(keep)) - threshold / 65536) < 1.5e-3


def test_dropout_values_gradient_and_determinism():
  x = jnp.linspace(1.0, 2.0, 4096).reshape(64, 64)
  rng = jax.random.key(3)
  y = cpu.dropout(x, rng, 0.25)
  keep, scale = cpu.keep_mask(rng, 0.75, x.shape)
  np.testing.assert_allclose(y, np.where(keep, np.asarray(x) * scale, 0.0), rtol=1e-6)
  assert 0 < int(jnp.sum(y == 0)) < x.size                                # some dropped, not all
  grad = jax.grad(lambda v: jnp.sum(cpu.dropout(v, rng, 0.25)))(x)
  np.testing.assert_allclose(grad, np.where(keep, scale, 0.0), rtol=1e-6)
  np.testing.assert_array_equal(cpu.dropout(x, rng, 0.25), y)         # same key, same mask
  assert not np.array_equal(cpu.dropout(x, jax.random.key(4), 0.25), y)


def test_dropout_module_draws_the_forms_mask_and_is_identity_when_deterministic():
  x = jnp.ones((8, 16))
  module = ops.Dropout(0.1)
  rng = jax.random.key(5)
  def run(**kw):
    return np.asarray(module.apply({}, x, rngs={'dropout': rng}, **kw))
  with ops.using(backends.CPU):
    out = run(deterministic=False)
    # flax hands the module make_rng('dropout'), a key derived from `rng`: the same key as
    # flax.linen.Dropout's, so the plain form is flax's mask exactly
    values = np.unique(out)
    np.testing.assert_allclose(values, [0.0, 65536 / round(0.9 * 65536)], rtol=1e-6)
    np.testing.assert_array_equal(run(deterministic=True), x)
    np.testing.assert_array_equal(ops.Dropout(0.0).apply({}, x, deterministic=False), x)
  flax = nn.Dropout(0.1).apply({}, x, deterministic=False, rngs={'dropout': rng})
  np.testing.assert_array_equal(run(deterministic=False), flax)
  assert not np.array_equal(out, flax)
  with pytest.raises(ValueError, match='keep_prob=0'):
    cpu.keep_mask(rng, 0.0, (2,))


@pytest.mark.parametrize('form', [backends.CPU, backends.PLAIN], ids=['cpu', 'plain'])
def test_train_step_dropout_prng_impl(form):
  """The dropout key's PRNG is a train-step argument: repeatable per step, and it takes effect
  (the CPU form's 16-bit masks and flax's)."""
  cfg = ModelConfig(family='gpt', vocab_size=7, num_layers=1, emb_dim=16, num_heads=2,
                    head_dim=8, mlp_dim=32, max_len=6, dropout_rate=0.5,
                    attention_dropout_rate=0.5, deterministic=False)
  tx = optax.sgd(0.1)
  params = init(cfg, length=6)
  state = state_lib.TrainState(step=np.int32(3), params=params, opt_state=tx.init(params))
  ids = np.random.default_rng(0).integers(0, 7, (4, 7)).astype(np.int32)
  batch = {'inputs': ids[:, :-1], 'targets': ids[:, 1:], 'loss_weights': np.ones((4, 6))}

  def loss(impl):
    step = jax.jit(ops.bind(form, step_lib.make_train_step(build(cfg), tx, lambda s: 0.1,
                                                           seed=0, prng_impl=impl)))
    # LLVM level 0 compiles faster; what is compared is which masks a key draws, the same
    # at any level (every step here is compiled alike)
    step = step.lower(state, batch).compile({'xla_backend_optimization_level': 0})
    return float(step(state, batch)[1]['loss'])

  assert loss('philox4x32') == loss('philox4x32')
  assert loss(None) == loss('threefry2x32')   # JAX's default
  assert loss('philox4x32') != loss('threefry2x32')
  with pytest.raises(ValueError, match="train.prng_impl='philox'"):
    loss('philox')


def test_philox_is_refused_across_processes(monkeypatch):
  model = build(ModelConfig(family='gpt', vocab_size=7, num_layers=1, emb_dim=16, num_heads=2,
                            head_dim=8, mlp_dim=32, max_len=6))
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  with pytest.raises(ValueError, match="'philox4x32' does not compile across 2 processes"):
    step_lib.make_train_step(model, optax.sgd(0.1), lambda s: 0.1, seed=0,
                             prng_impl='philox4x32')
  step_lib.make_train_step(model, optax.sgd(0.1), lambda s: 0.1, seed=0,
                           prng_impl='threefry2x32')
