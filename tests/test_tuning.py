"""The backend tuning seam (ops/backends.py): chosen once, by make_steps, from the mesh's
devices; the model and the step read it from the ModelConfig and never ask JAX's default
backend while tracing. CPU and plain compute the same forward values and gradients."""
import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from modeling import init, tiny, tokens

from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.ops import backends
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training.config import MeshConfig, TrainConfig
from tests.test_train import batches, tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_platforms_choose_their_tuning():
  assert backends.for_platform('cpu') is backends.CPU
  for platform in ('gpu', 'tpu'):
    tuning = backends.for_platform(platform)
    assert tuning is backends.for_platform(platform)            # one record per platform
    assert tuning.platform == platform and backends.PLAIN.platform == ''
    assert (tuning.matmul, tuning.Dropout, tuning.all_finite, tuning.bias_per_row) == (
        jnp.dot, nn.Dropout, backends.all_finite, False)
  assert ModelConfig(family='gpt', vocab_size=8, num_layers=1, emb_dim=8, num_heads=1,
                     head_dim=8, mlp_dim=8).tuning is backends.PLAIN


def test_tuning_is_no_config_key():
  cfg = tiny('gpt', tuning=backends.CPU)
  assert 'tuning' not in cfg.to_dict()
  assert ModelConfig.from_config(cfg.to_dict()).tuning is backends.PLAIN
  with pytest.raises(ValueError, match=r"unknown config.model keys \['tuning'\]"):
    ModelConfig.from_config({**cfg.to_dict(), 'tuning': 'cpu'})


@pytest.mark.parametrize('family', ['gpt', 'bert', 't5'])
def test_cpu_and_plain_compute_the_same_model(family):
  """Forward values bit for bit, gradients to rounding (the CPU weight gradient and T5's
  per-row bias sum in another order); t5 runs the reference attention path (per-row bias)."""
  cfg = tiny(family)
  params = init(cfg, length=8)
  family_rec = family_of(cfg)
  batch = family_rec.example_batch(np.asarray(tokens((2, 9))))
  args, kwargs = family_rec.model_inputs(batch)

  def loss(tuning, p):
    out = build(cfg.replace(tuning=tuning)).apply({'params': p}, *args, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    return jnp.sum(jnp.tanh(out)), out

  def run(tuning):
    return jax.jit(jax.value_and_grad(lambda p: loss(tuning, p), has_aux=True))(params)
  (_, out_cpu), g_cpu = run(backends.CPU)
  (_, out_plain), g_plain = run(backends.PLAIN)
  np.testing.assert_array_equal(np.asarray(out_cpu), np.asarray(out_plain))
  for a, b in zip(jax.tree.leaves(g_cpu), jax.tree.leaves(g_plain), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_make_steps_chooses_once_from_the_mesh_and_tracing_never_asks_the_backend(monkeypatch):
  config = tiny_config('t5', loss_chunk_len=0)
  mesh = mesh_lib.make_mesh(MeshConfig.from_config(config.mesh), jax.devices()[:1])
  chosen = []
  choose = backends.for_platform
  monkeypatch.setattr(backends, 'for_platform', lambda p: chosen.append(p) or choose(p))

  def no_default_backend():
    raise AssertionError('jax.default_backend() asked while tracing')
  steps = step_lib.make_steps(ModelConfig.from_config(config.model),
                              TrainConfig.from_config(config.train), mesh)
  assert chosen == ['cpu']
  state = steps.create_state(0)                    # run_once: the init program's options
  monkeypatch.setattr(jax, 'default_backend', no_default_backend)
  batch = batches(config, 1)[0]
  state, metrics = steps.train_step(state, batch)  # traced and compiled here
  assert float(metrics['state_finite']) == 1.0
  assert chosen == ['cpu', 'cpu']


def test_the_cpu_train_step_computes_weight_gradients_the_cpu_way():
  """make_steps on CPU puts ops/cpu.py's matmul in the dense layers: its weight gradient's
  optimization barriers are in the step, and not in the step of a plain model."""
  config = tiny_config('gpt')
  cfg = ModelConfig.from_config(config.model)
  mesh = mesh_lib.make_mesh(MeshConfig.from_config(config.mesh), jax.devices()[:1])
  steps = step_lib.make_steps(cfg, TrainConfig.from_config(config.train), mesh)
  batch = batches(config, 1)[0]
  def barriers(step):
    return str(jax.make_jaxpr(step)(steps.abstract_state, batch)).count(
        'optimization_barrier')
  plain = step_lib.make_train_step(build(cfg.replace(deterministic=False)), optax.sgd(0.1),
                                   lambda s: 0.1, seed=0)
  # 2 layers x (q, k, v, out, mlp in, mlp out): at least one barrier each
  assert barriers(steps.train_step) >= 12 and barriers(plain) == 0


def test_model_and_step_code_never_ask_the_default_backend():
  """Backends differ only through the seam: no `default_backend` in models/, ops/ or the
  step's training modules, but in attention.py where a direct call names no backend (the
  layers pass cfg.tuning.platform)."""
  folders = [os.path.join(ROOT, 'pretrain_jax', d) for d in ('models', 'ops')]
  files = [os.path.join(f, n) for f in folders for n in sorted(os.listdir(f)) if n.endswith('.py')]
  files += [os.path.join(ROOT, 'pretrain_jax', 'training', f'{n}.py')
            for n in ('losses', 'task', 'step', 'state')]
  hits = []
  for path in files:
    source = open(path, encoding='utf-8').read()
    for match in re.finditer(r'default_backend', source):
      function = re.findall(r'^def (\w+)', source[:match.start()], re.M)
      hits.append((os.path.basename(path), function[-1] if function else None))
  assert set(hits) == {('attention.py', f) for f in (
      'dot_product_attention', 'runnable_implementation', 'implementation_notes')}, hits
  for line in open(os.path.join(ROOT, 'pretrain_jax', 'models', 'attention.py')):
    if 'default_backend' in line:
      assert 'backend or jax.default_backend()' in line, line
