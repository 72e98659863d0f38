"""Train step, optimizers, schedules and config errors on one device (fp32, tiny models)."""
import os
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from modeling import batches, setup, tiny_config

from pretrain_jax.models import ModelConfig
from pretrain_jax.run import loop
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import optimizer as opt_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training import synthetic
from pretrain_jax.training.config import MeshConfig, TrainConfig


@pytest.mark.parametrize('family,optimizer', [
    ('gpt', 'adamw'), ('bert', 'adamw'), ('t5', 'adafactor')])
def test_loss_goes_down_on_a_fixed_batch(family, optimizer):
  config = tiny_config(family, optimizer=optimizer)
  if family == 'bert':
    config.model.nsp = True
  state, step, _ = setup(config)
  losses = []
  for batch in batches(config, 12, fixed=True):
    state, metrics = step(state, batch)
    losses.append(float(metrics['loss']))
  assert np.all(np.isfinite(losses))
  assert losses[-1] < 0.8 * losses[0], losses
  assert int(state.step) == 12


def test_microbatches_match_one_big_batch():
  big, micro = tiny_config('gpt'), tiny_config('gpt', microbatches=4)
  state_a, step_a, _ = setup(big)
  state_b, step_b, _ = setup(micro)
  for batch in batches(big, 2):
    state_a, m_a = step_a(state_a, batch)
    state_b, m_b = step_b(state_b, batch)
    np.testing.assert_allclose(m_a['loss'], m_b['loss'], rtol=1e-6)
    np.testing.assert_allclose(m_a['grad_norm'], m_b['grad_norm'], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5),
               state_a.params, state_b.params)


def test_split_microbatches_takes_strided_rows():
  x = jnp.arange(8)[:, None] * jnp.ones((8, 3), jnp.int32)
  out = step_lib.split_microbatches({'x': x}, 4)['x']
  assert out.shape == (4, 2, 3)
  np.testing.assert_array_equal(out[:, :, 0], [[0, 4], [1, 5], [2, 6], [3, 7]])


def test_schedules():
  t = tiny_config('gpt', steps=110, warmup_steps=10, learning_rate=1.0,
                  final_lr_fraction=0.1).train
  for name, at_end in [('cosine', 0.1), ('linear', 0.1), ('constant', 1.0),
                       ('rsqrt', (10 / 110) ** 0.5)]:
    t.schedule = name
    s = opt_lib.make_schedule(TrainConfig.from_config(t))
    np.testing.assert_allclose([s(0), s(5), s(10), s(110)], [0.0, 0.5, 1.0, at_end],
                               rtol=1e-5, err_msg=name)


def test_a_run_that_is_all_warmup_and_a_stretched_decay_are_said():
  t = TrainConfig.from_config(tiny_config('gpt', steps=4, warmup_steps=30,
                                          learning_rate=3e-3).train)
  warning = opt_lib.warmup_warning(t)
  assert warning.startswith('warning: train.warmup_steps=30 >= train.steps=4:'), warning
  assert 'peaks at 0.0003,' in warning and 'configured 0.003 ' in warning, warning
  t = t.replace(warmup_steps=3)
  assert opt_lib.warmup_warning(t) is None
  t = TrainConfig.from_config(tiny_config('gpt', steps=100, warmup_steps=0, learning_rate=1.0,
                                          schedule='linear', final_lr_fraction=0.0).train)
  note = opt_lib.schedule_change(t, 60, 60)
  assert note.startswith('note: train.steps 60 -> 100 ') and 'linear' in note, note
  assert note.endswith('step 60 goes 0 -> 0.4'), note
  t = t.replace(warmup_steps=80)      # step 60 is in warmup under both horizons
  assert opt_lib.schedule_change(t, 60, 60).endswith('step 60 stays 0.75 (still in warmup)')
  t = t.replace(warmup_steps=0)
  assert opt_lib.schedule_change(t, 100, 60) is None
  assert opt_lib.schedule_change(t, None, 60) is None
  t = t.replace(schedule='rsqrt')
  assert opt_lib.schedule_change(t, 60, 60) is None   # no horizon: nothing moves


def test_weight_decay_skips_norms_biases_and_scales():
  params = {'ln': {'scale': 1, 'bias': 1}, 'dense': {'kernel': 1, 'bias': 1},
            'wte': {'embedding': 1}, 'mlm_bias': 1}
  assert opt_lib.decay_mask(params) == {'ln': {'scale': False, 'bias': False},
                                        'dense': {'kernel': True, 'bias': False},
                                        'wte': {'embedding': True}, 'mlm_bias': False}


def test_adamw_decays_kernels_only():
  t = tiny_config('gpt', weight_decay=0.5, learning_rate=0.1, warmup_steps=0,
                  schedule='constant', grad_clip=0.0).train
  tx = opt_lib.make_optimizer(TrainConfig.from_config(t))
  params = {'dense': {'kernel': jnp.ones(2), 'bias': jnp.ones(2)}}
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zeros, tx.init(params), params)
  np.testing.assert_allclose(updates['dense']['kernel'], [-0.05, -0.05])
  np.testing.assert_allclose(updates['dense']['bias'], [0.0, 0.0])


@pytest.mark.parametrize('key,value,message', [
    ('optimizer', 'sgd', "train.optimizer='sgd'"),
    ('schedule', 'step', "train.schedule='step'"),
    ('grad_clip', -1.0, 'train.grad_clip=-1.0'),
    ('final_lr_fraction', -1.0, r'train.final_lr_fraction=-1.0; expected a value in [0, 1]'),
    ('final_lr_fraction', 2.0, 'train.final_lr_fraction=2.0'),
    ('weight_decay', -1.0, 'train.weight_decay=-1.0; expected a number >= 0'),
    ('z_loss', -1.0, 'train.z_loss=-1.0; expected a number >= 0'),
    ('adam_b2', 1.5, r'train.adam_b2=1.5; expected a value in [0, 1)'),
    ('adam_b1', -0.1, 'train.adam_b1=-0.1'),
])
def test_bad_optimizer_config(key, value, message):
  t = tiny_config('gpt').train
  t[key] = value
  with pytest.raises(ValueError, match=re.escape(message) if '[' in message
                     else message.replace('.', r'\.')):
    opt_lib.make_optimizer(TrainConfig.from_config(t))   # (the section refuses it)


@pytest.mark.parametrize('mesh,message', [
    (dict(data=2, fsdp=1, tensor=1), 'expected the 1 available'),
    (dict(data=-1, fsdp=-1, tensor=1), 'at most one -1'),
    (dict(data=0, fsdp=1, tensor=1), 'expected positive sizes'),
])
def test_bad_mesh_config(mesh, message):
  with pytest.raises(ValueError, match=message):
    mesh_lib.make_mesh(MeshConfig.from_config(ml_collections.ConfigDict(mesh)),
                       jax.devices()[:1])


def test_batch_shards_must_split_over_the_processes():
  """Tensor parallelism across hosts (data*fsdp=1 on 2 processes) gave each process its own
  rows for a batch shard both hold: the global batch differed by device."""
  config = tiny_config('gpt')
  config.mesh.update(data=1, fsdp=1, tensor=1)
  mesh = mesh_lib.make_mesh(MeshConfig.from_config(config.mesh), jax.devices()[:1])
  t, cfg = TrainConfig.from_config(config.train), ModelConfig.from_config(config.model)
  mesh_lib.check_config(t, cfg, mesh, process_count=1)
  with pytest.raises(ValueError, match=r'data\*fsdp=1 .* 2 processes'):
    mesh_lib.check_config(t, cfg, mesh, process_count=2)


def test_batch_not_divisible_by_microbatches():
  config = tiny_config('gpt', microbatches=3)
  mesh = mesh_lib.make_mesh(MeshConfig.from_config(config.mesh), jax.devices()[:1])
  with pytest.raises(ValueError, match=r'batch_size=8 .*microbatches=3\b'):
    mesh_lib.check_config(TrainConfig.from_config(config.train),
                          ModelConfig.from_config(config.model), mesh)


@pytest.mark.parametrize('family, causal, objective, expected', [
    ('bert', True, 'clm', 'mlm'),       # next-token targets an encoder reads in its own input
    ('gpt', False, 'clm', 'mlm'),       # the same leak through the bidirectional GPT stack
    ('gpt', True, 'mlm', 'clm'),
    ('t5', True, 'clm', 'span_corruption'),
    ('gpt', True, 'span_corruption', 'clm'),
])
def test_an_objective_the_model_does_not_train_with_is_refused(family, causal, objective,
                                                               expected, tmp_path):
  config = tiny_config(family)
  config.model.causal = causal
  config.data.objective = objective
  model_cfg = ModelConfig.from_config(config.model)
  with pytest.raises(ValueError, match=f"objective='{objective}' but a {family}.* pre-trains "
                                       f"with '{expected}'"):
    loop.check_objective(model_cfg, objective)
  loop.check_objective(model_cfg, expected)
  with pytest.raises(ValueError, match=r'^config\.data\.nsp=True .*model\.nsp=False'):
    loop.check_objective(model_cfg, expected, data_nsp=True)
  with pytest.raises(ValueError, match=f"objective='{objective}'"):
    loop.train_and_evaluate(config, str(tmp_path / 'w'))
  assert not os.path.exists(tmp_path / 'w' / 'config.json')


def test_no_evaluation_opens_no_validation_split(tmp_path):
  """data.validation_fraction=0 leaves no validation split: with train.eval_every=0 it trains
  (it failed opening the split it would never read)."""
  config = tiny_config('gpt', steps=2)
  base = synthetic.synthetic_datasets(config)

  def datasets(*, split, **kw):
    if split != config.data.train_split:
      raise ValueError(f'no split {split!r}')
    return base(split=split, **kw)
  assert loop.train_and_evaluate(config, str(tmp_path), datasets=datasets)['step'] == 2
  config.train.eval_every = 1
  with pytest.raises(ValueError, match="no split 'validation'"):
    loop.train_and_evaluate(config, str(tmp_path / 'eval'), datasets=datasets)
