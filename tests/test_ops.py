"""The backend's form of the operations (pretrain_jax/ops): chosen once, by make_steps, from the
mesh's devices and bound to the programs it traces; layers call ops.* and never ask JAX's
default backend while tracing. CPU and plain compute the same forward values and gradients; a
form never leaks into a program traced under another."""
import dataclasses
import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import ROOT
from modeling import batches, init, tiny, tiny_config, tokens

from pretrain_jax import ops
from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.ops import backends, cpu
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training.config import MeshConfig, TrainConfig

# The plain form on a CPU mesh: what the step computes without XLA:CPU's forms.
PLAIN_CPU = dataclasses.replace(backends.PLAIN, name='plain-cpu', platform='cpu')


def test_platforms_choose_their_form():
  assert backends.for_platform('cpu') is backends.CPU
  for platform in ('gpu', 'tpu'):
    form = backends.for_platform(platform)
    assert form is backends.for_platform(platform)            # one record per platform
    assert form.platform == platform and backends.PLAIN.platform == ''
    assert (form.matmul, form.dropout, form.all_finite, form.bias_per_row) == (
        jnp.dot, backends.flax_dropout, backends.all_finite, False)
  assert ops.current() is backends.PLAIN                       # outside any binding
  with ops.using(backends.CPU):
    assert ops.current() is backends.CPU
  assert ops.current() is backends.PLAIN


def test_the_form_is_no_config_key():
  assert 'tuning' not in {f.name for f in dataclasses.fields(ModelConfig)}
  with pytest.raises(ValueError, match=r"unknown config.model keys \['tuning'\]"):
    ModelConfig.from_config({**tiny('gpt').to_dict(), 'tuning': 'cpu'})


@pytest.mark.parametrize('family', ['gpt', 'bert', 't5'])
def test_cpu_and_plain_compute_the_same_model(family):
  """Forward values bit for bit, gradients to rounding (the CPU weight gradient and T5's
  per-row bias sum in another order); t5 runs the reference attention path (per-row bias)."""
  cfg = tiny(family)
  params = init(cfg, length=8)
  family_rec = family_of(cfg)
  batch = family_rec.example_batch(np.asarray(tokens((2, 9))))
  args, kwargs = family_rec.model_inputs(batch)

  def loss(p):
    out = build(cfg).apply({'params': p}, *args, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    return jnp.sum(jnp.tanh(out)), out

  def run(form):
    return jax.jit(ops.bind(form, jax.value_and_grad(loss, has_aux=True)))(params)
  (_, out_cpu), g_cpu = run(backends.CPU)
  (_, out_plain), g_plain = run(backends.PLAIN)
  np.testing.assert_array_equal(np.asarray(out_cpu), np.asarray(out_plain))
  for a, b in zip(jax.tree.leaves(g_cpu), jax.tree.leaves(g_plain), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_one_jitted_function_computes_the_form_it_is_called_in():
  """A program traced in one form is never reused in another: the form is in jit's cache key
  (a function jitted once and called in both forms, as a cached apply or a static model
  argument would be, computes each form's dropout masks)."""
  x, rng = jnp.linspace(1.0, 2.0, 256).reshape(16, 16), jax.random.key(3)
  drop = jax.jit(lambda x, rng: ops.dropout(x, rng, 0.5))
  want = {'cpu': cpu.dropout(x, rng, 0.5),
          'plain': nn.Dropout(0.5, deterministic=False).apply({}, x, rng=rng)}   # flax's
  assert not np.array_equal(want['cpu'], want['plain'])        # the forms' masks differ
  for form in ('cpu', 'plain', 'cpu', 'plain'):
    with ops.using(backends.CPU if form == 'cpu' else backends.PLAIN):
      np.testing.assert_array_equal(drop(x, rng), want[form])


def test_steps_of_two_forms_in_one_process_each_compute_their_own(monkeypatch):
  """Two make_steps in one process (two meshes: here a CPU-form one and a plain-form one)
  each trace their steps in their own form, whichever is built or called last: each step's
  metrics are the ones it gives alone, and the forms' dropout masks make them differ."""
  config = tiny_config('gpt')
  config.model.update(dropout_rate=0.3, attention_dropout_rate=0.3, num_layers=1)
  cfg, t = ModelConfig.from_config(config.model), TrainConfig.from_config(config.train)
  mesh = mesh_lib.make_mesh(MeshConfig.from_config(config.mesh), jax.devices()[:1])
  batch = batches(config, 1)[0]

  def steps_of(form):
    monkeypatch.setattr(backends, 'for_device', lambda device, fp8_dense=False: form)
    return step_lib.make_steps(cfg, t, mesh)

  def losses(steps):     # an eval step and a train step from one fresh state
    state = steps.create_state(0)
    evaluated = float(steps.eval_step(state.params, batch)[0]['lm'])
    return float(steps.train_step(state, batch)[1]['loss']), evaluated
  alone = {form.name: losses(steps_of(form)) for form in (backends.CPU, PLAIN_CPU)}
  steps = {form.name: steps_of(form) for form in (backends.CPU, PLAIN_CPU)}
  for name in ('plain-cpu', 'cpu', 'plain-cpu'):
    assert losses(steps[name]) == alone[name], name
  assert alone['cpu'][0] != alone['plain-cpu'][0]              # train: dropout masks differ
  assert alone['cpu'][1] == alone['plain-cpu'][1]              # eval: no dropout, same values


def test_make_steps_chooses_once_from_the_mesh_and_tracing_never_asks_the_backend(monkeypatch):
  config = tiny_config('gpt', loss_chunk_len=0)   # the choice is the family's alike
  config.model.num_layers = 1
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
  """make_steps on CPU binds its step to ops/cpu.py's matmul: its weight gradient's
  optimization barriers are in the step, and not in the step of a model traced plain."""
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
  """Backends differ only through the ops form: no `default_backend` in models/, ops/ or the
  step's training modules, but in attention.py where the form names no platform (PLAIN)."""
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
      'dot_product_attention', 'runnable_implementation')}, hits
  for line in open(os.path.join(ROOT, 'pretrain_jax', 'models', 'attention.py')):
    if 'default_backend' in line:
      assert 'backend or jax.default_backend()' in line, line
