"""The flash kernel (models/flash.py: Pallas, TPU, the bias computed per block) against the
reference path in Pallas's TPU interpreter on CPU (float32), and its Mosaic lowering by the TPU
compiler for a v5e and a v4 topology."""
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import topologies
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from modeling import tiny, tiny_config

from pretrain_jax import ops
from pretrain_jax.models import ModelConfig, build, family_of, flash, layers
from pretrain_jax.models.attention import (
  dot_product_attention,
  kernel_readable,
  runnable_implementation,
)
from pretrain_jax.models.masks import AlibiBias, AttentionMask, RelativeBias
from pretrain_jax.ops import backends
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training import synthetic
from pretrain_jax.training.config import MeshConfig, TrainConfig

N, H, T = 2, 8, 260           # 260 tokens pad to 384: three blocks of 128, the last part padding
ENC_SEG = np.array([[1] * 200 + [0] * 60, [1] * 260])                    # padding
DEC_SEG = np.array([[1] * 100 + [2] * 130 + [0] * 30, [1] * 60 + [2] * 200])  # packed
PREFIX = np.array([[1] * 40 + [0] * 60 + [1] * 30 + [0] * 130, [1] * 90 + [0] * 170])
SLOPES = layers.alibi_slopes(N, 8.0)

CASES = {   # name -> (length, the mask given T5's (buckets, N) table)
    't5_encoder': (T, lambda table: AttentionMask(
        q_segment_ids=ENC_SEG, bias=RelativeBias(table, bidirectional=True, max_distance=128))),
    't5_decoder': (T, lambda table: AttentionMask(
        q_segment_ids=DEC_SEG, causal=True,
        bias=RelativeBias(table, bidirectional=False, max_distance=128))),
    'bert_alibi': (T, lambda table: AttentionMask(q_segment_ids=ENC_SEG,
                                                  bias=AlibiBias(SLOPES))),
    'prefix_lm_relative': (T, lambda table: AttentionMask(
        q_segment_ids=DEC_SEG, causal=True, prefix=PREFIX,
        bias=RelativeBias(table, bidirectional=False, max_distance=128))),
    # one block; max_distance 6 < 8 buckets: the kernel's offsets reach num_buckets
    'short_few_buckets': (20, lambda table: AttentionMask(
        q_segment_ids=DEC_SEG[:, :20],
        bias=RelativeBias(table[:8], bidirectional=True, max_distance=6))),
}


def _inputs(length, seed=0):
  ks = jax.random.split(jax.random.key(seed), 5)
  q, k, v, probe = (jax.random.normal(ks[i], (2, length, N, H)) for i in range(4))
  return q, k, v, probe, jax.random.normal(ks[4], (32, N))


@pytest.mark.parametrize('case', sorted(CASES))
def test_flash_matches_reference_outputs_and_gradients(case):
  """Outputs and the gradients of q, k, v and T5's bucket table, flash vs the dense reference
  (the table's gradient sums B * T * S logit gradients: 1e-5 of its largest entry)."""
  length, make_mask = CASES[case]
  q, k, v, probe, table = _inputs(length)

  def grad(impl):
    def loss(q, k, v, table):
      out = dot_product_attention(q, k, v, make_mask(table), implementation=impl)
      return jnp.sum(out * probe), out
    return jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)
  (_, got), got_grads = jax.jit(grad('flash'))(q, k, v, table)
  (_, want), want_grads = grad('reference')(q, k, v, table)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  for g, w in zip(got_grads[:3], want_grads[:3], strict=True):
    np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)
  scale = max(1.0, float(jnp.abs(want_grads[3]).max()))
  np.testing.assert_allclose(got_grads[3], want_grads[3], atol=1e-5 * scale, rtol=0)
  if case == 't5_encoder':         # padding rows return zeros, as on the reference path
    np.testing.assert_array_equal(got[0, 200:], 0.0)


def test_bias_table_is_the_models_bias_at_each_offset():
  """The kernel's per-head table holds, at lane clip + (j - i), the bias the dense matrix has
  at (i, j), rounded to the model's dtype; beyond max_distance the buckets no longer change."""
  table = jax.random.normal(jax.random.key(3), (8, N))
  for bidirectional in (True, False):
    bias = RelativeBias(table, bidirectional=bidirectional, max_distance=10,
                        dtype=jnp.bfloat16)
    kind, clip, lanes = flash.bias_table(bias, N)
    assert (kind, clip, lanes.shape) == ('relative', 10, (N, 1, 128))
    dense = np.asarray(bias.dense(40, 40).astype(jnp.float32))[0]           # (N, T, S)
    i, j = np.meshgrid(np.arange(40), np.arange(40), indexing='ij')
    looked_up = np.asarray(lanes)[:, 0, np.clip(j - i, -clip, clip) + clip]  # (N, T, S)
    np.testing.assert_array_equal(looked_up, dense)
  kind, clip, lanes = flash.bias_table(AlibiBias(SLOPES), N)
  assert (kind, clip) == ('alibi', 0)
  np.testing.assert_array_equal(lanes[:, 0, 0], -SLOPES)
  with pytest.raises(ValueError, match='3 heads'):
    flash.bias_table(RelativeBias(jnp.zeros((8, 3))), N)


def test_diagonal_sums_literal():
  """Lane u sums the entries whose column - row is u - (rows - 1)."""
  sums = jax.jit(flash.fk.diagonal_sums, static_argnums=1)
  x = jnp.arange(8, dtype=jnp.float32)[:, None]                 # (8, 1): row r holds r
  np.testing.assert_array_equal(sums(x, 128)[0, :9], [7, 6, 5, 4, 3, 2, 1, 0, 0])
  x = jax.random.normal(jax.random.key(0), (16, 24))
  want = [sum(float(x[r, r + u - 15]) for r in range(16) if 0 <= r + u - 15 < 24)
          for u in range(40)]
  np.testing.assert_allclose(sums(x, 128)[0, :40], want, atol=1e-5)
  np.testing.assert_array_equal(sums(x, 128)[0, 40:], 0.0)


def test_what_runs_the_flash_kernel():
  """On TPU 'auto' sends a mask with a bias value to 'flash' (splash has no bias), a bias
  matrix or a dense mask to 'xla'; off TPU 'flash' runs in Pallas's interpreter."""
  tpu = dict(backend='tpu')
  assert runnable_implementation('auto', bias=True, **tpu) == 'flash'
  assert runnable_implementation('auto', **tpu) == 'splash'
  assert runnable_implementation('auto', bias=True, dense=True, **tpu) == 'xla'
  assert runnable_implementation('splash', bias=True, **tpu) == 'flash'
  assert runnable_implementation('flash', **tpu) == 'flash'
  assert runnable_implementation('flash', dense=True, **tpu) == 'xla'
  assert runnable_implementation('flash', backend='cpu') == 'flash'
  assert runnable_implementation('flash', dtype=jnp.bfloat16, backend='gpu') == 'cudnn'
  assert runnable_implementation('auto', bias=True, dropout=True, **tpu) == 'reference'
  value = AttentionMask(bias=AlibiBias(SLOPES))
  assert kernel_readable(value, 4, 4)
  assert not kernel_readable(value.replace(bias=value.bias.dense(4, 4)), 4, 4)


@pytest.mark.parametrize('family,options', [('t5', {}), ('bert', dict(position_embedding='alibi'))])
def test_the_models_hand_the_kernel_a_value(family, options):
  """With attention_impl='flash' every attention is a kernel call and no (T, S) bias is made
  (no one-hot of the buckets: T5's table reaches the kernel as a value); 'reference' gets the
  matrix, made once per stack."""
  cfg = tiny(family, **options)
  args, kwargs = family_of(family).model_inputs(family_of(family).init_batch(8))
  params = jax.eval_shape(lambda: nn.unbox(build(cfg).init(jax.random.key(0), *args,
                                                           **kwargs)['params']))
  def program(impl):
    model = build(cfg.replace(attention_impl=impl))
    return str(jax.make_jaxpr(lambda p: model.apply({'params': p}, *args, **kwargs))(params))
  flash_program, reference = program('flash'), program('reference')
  calls = flash_program.count('name=flash_forward')
  assert calls == (3 * cfg.num_layers if family == 't5' else cfg.num_layers), calls
  assert 'pallas_call' not in reference
  shape = f'{cfg.num_heads},8,8]'                   # a (1, N, T, S) bias: reference only
  assert shape not in flash_program and shape in reference


@pytest.mark.slow   # two trainings through the kernel interpreter
def test_a_tiny_t5_trains_the_same_3_steps_with_flash():
  """3 Adam steps of a tiny T5 on packed, padded rows: the same losses and parameters with
  attention_impl='flash' (Pallas's interpreter) as with 'reference'."""
  config = tiny_config('t5', steps=3)
  config.model.scan_layers = True     # one layer's kernels to compile, not two
  data = synthetic.SyntheticDataset('t5', vocab_size=128, seq_len=16, batch_size=8)
  batches = [data.batch(i) for i in range(3)]
  for b in batches:               # two documents and padding in every row, both stacks
    b['encoder_segment_ids'][:] = [1] * 7 + [2] * 6 + [0] * 3
    b['decoder_segment_ids'][:] = [1] * 3 + [2] * 4 + [0] * 1
  mesh = mesh_lib.make_mesh(MeshConfig.from_config(config.mesh), jax.devices()[:1])
  results = {}
  for impl in ('reference', 'flash'):
    config.model.attention_impl = impl
    steps = step_lib.make_steps(ModelConfig.from_config(config.model),
                                TrainConfig.from_config(config.train), mesh)
    state, losses = steps.create_state(0), []
    for b in batches:
      state, metrics = steps.train_step(state, b)
      losses.append(float(metrics['loss']))
    results[impl] = losses, jax.device_get(state.params)
  np.testing.assert_allclose(results['flash'][0], results['reference'][0], atol=1e-4, rtol=0)
  for got, want in zip(jax.tree.leaves(results['flash'][1]),
                       jax.tree.leaves(results['reference'][1]), strict=True):
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def lowering(names):
  """Run as a script with libtpu: compile the gradient of the T5 encoder's, decoder's and
  ALiBi's flash attention (bf16, 384 tokens: three blocks) for each named TPU topology with
  the TPU compiler, and print its Mosaic kernel calls."""
  masks_of = {'encoder': lambda table, seg: AttentionMask(
                  q_segment_ids=seg, bias=RelativeBias(table, max_distance=128,
                                                       dtype=jnp.bfloat16)),
              'decoder': lambda table, seg: AttentionMask(
                  q_segment_ids=seg, causal=True,
                  bias=RelativeBias(table, bidirectional=False, max_distance=128,
                                    dtype=jnp.bfloat16)),
              'alibi': lambda table, seg: AttentionMask(q_segment_ids=seg,
                                                        bias=AlibiBias(SLOPES))}

  def loss(q, k, v, seg, table):
    return sum(jnp.sum(dot_product_attention(q, k, v, make(table, seg), implementation='flash'))
               for make in masks_of.values()).astype(jnp.float32)
  x = jax.ShapeDtypeStruct((2, 384, N, 64), jnp.bfloat16)
  args = (x, x, x, jax.ShapeDtypeStruct((2, 384), jnp.int32),
          jax.ShapeDtypeStruct((32, N), jnp.float32))
  out = {}
  for name in names:
    device = topologies.get_topology_desc(
        platform='tpu', topology_name=name, chip_config_name='default',
        chips_per_host_bounds=(2, 2, 1), num_slices=1).devices[0]
    step = jax.jit(ops.bind(backends.for_platform('tpu'), jax.grad(loss, argnums=(0, 1, 2, 4))),
                   in_shardings=jax.sharding.SingleDeviceSharding(device))
    text = step.lower(*args).compile().as_text()
    out[name] = {'device': device.device_kind,
                 'mosaic_calls': text.count('custom_call_target="tpu_custom_call"')}
  print(json.dumps(out))


def test_the_kernel_lowers_through_mosaic_for_v5e_and_v4(libtpu_python):
  """The TPU compiler (libtpu, ahead of time, no TPU attached) takes every kernel of the
  forward and backward pass, for three masks: 3 x (forward, dq, dk/dv)."""
  here = os.path.dirname(os.path.abspath(__file__))
  env = dict(os.environ, JAX_PLATFORMS='cpu', ALLOW_MULTIPLE_LIBTPU_LOAD='1',
             PYTHONPATH=os.pathsep.join([os.path.dirname(here), here]))
  done = subprocess.run([libtpu_python, __file__, 'lowering', 'v5e:2x4', 'v4:2x2x1'], env=env,
                        capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  report = json.loads(done.stdout.strip().splitlines()[-1])
  assert report == {'v5e:2x4': {'device': 'TPU v5 lite', 'mosaic_calls': 9},
                    'v4:2x2x1': {'device': 'TPU v4', 'mosaic_calls': 9}}, report


def sharded_vs_single():
  """Run as a script on 4 simulated devices: flash under the train step's mesh context
  (shard_map over batch and heads) against one device, outputs and the table's gradient."""
  mesh = mesh_lib.make_mesh(MeshConfig(data=2, fsdp=1, tensor=2))
  q, k, v, probe, table = (jnp.concatenate([x, x[::-1]]) if x.ndim == 4 else x
                           for x in _inputs(T))                       # 4 rows, 2 heads
  seg = np.concatenate([DEC_SEG, DEC_SEG[::-1]])

  def loss(q, k, v, seg, table):
    mask = CASES['t5_decoder'][1](table).replace(q_segment_ids=seg)
    return jnp.sum(dot_product_attention(q, k, v, mask, implementation='flash') * probe)
  rows = NamedSharding(mesh, P(mesh_lib.BATCH_AXES))
  grad = jax.grad(loss, argnums=(0, 4))
  sharded = jax.jit(mesh_lib.traced_in(mesh, grad),
                    in_shardings=(rows,) * 4 + (NamedSharding(mesh, P()),))
  text = sharded.lower(q, k, v, seg, table).as_text()
  got, want = sharded(q, k, v, seg, table), jax.jit(grad)(q, k, v, seg, table)
  print(json.dumps({'devices': jax.device_count(),
                    'max_diff': max(float(jnp.abs(a - b).max())
                                    for a, b in zip(got, want, strict=True)),
                    'manual': 'sdy.manual_computation' in text or 'shard_map' in text}))


@pytest.mark.slow
def test_flash_under_a_mesh_runs_per_shard_and_matches_one_device():
  here = os.path.dirname(os.path.abspath(__file__))
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=4',
             PYTHONPATH=os.pathsep.join([os.path.dirname(here), here]))
  done = subprocess.run([sys.executable, __file__, 'sharded'], env=env, capture_output=True,
                        text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  report = json.loads(done.stdout.strip().splitlines()[-1])
  assert report['devices'] == 4 and report['manual'], report
  assert report['max_diff'] <= 1e-5, report


if __name__ == '__main__':
  if sys.argv[1] == 'lowering':
    lowering(sys.argv[2:])
  else:
    sharded_vs_single()
