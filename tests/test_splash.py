"""Splash attention (Pallas, TPU) against the reference path, in Pallas's TPU interpreter on CPU.

The mask value's translation to kernel calls is checked against literals; the kernel's
outputs and gradients against the einsum path for each family's masks (float32, 1e-5).
"""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import train_losses
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from modeling import forward, init, tiny, tiny_config

from pretrain_jax.models import build, family_of, masks, splash
from pretrain_jax.models.attention import dot_product_attention, runnable_implementation
from pretrain_jax.objectives import prefix_lm
from pretrain_jax.run import loop
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import synthetic
from pretrain_jax.training.config import MeshConfig

N, H = 2, 8
SEG = np.array([[1] * 8 + [2] * 9 + [0] * 3, [1] * 20])         # packed + padded, one document
PADDED = np.array([[1] * 14 + [0] * 6, [1] * 20])               # BERT: padding only
PREFIX = np.array([[1] * 3 + [0] * 5 + [1] * 4 + [0] * 8, [1] * 7 + [0] * 13])
ENC_SEG = np.array([[1] * 6 + [2] * 7, [1] * 10 + [0] * 3])     # T5 cross-attention: 13 keys
DEC_SEG = np.array([[1] * 8 + [2] * 9 + [3] * 3, [1] * 20])     # document 3 has no encoder part

CASES = {   # (mask, key length)
    'bert_padding': (masks.AttentionMask(q_segment_ids=PADDED), 20),
    'gpt_and_t5_decoder_causal_packed': (masks.AttentionMask(q_segment_ids=SEG, causal=True), 20),
    't5_encoder': (masks.AttentionMask(q_segment_ids=SEG), 20),
    't5_cross': (masks.AttentionMask(q_segment_ids=DEC_SEG, kv_segment_ids=ENC_SEG), 13),
    'prefix_lm': (masks.AttentionMask(q_segment_ids=SEG, causal=True, prefix=PREFIX), 20),
    'one_document_causal': (masks.AttentionMask(causal=True), 20),
}


def _qkv(s, seed=0):
  ks = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(ks[0], (2, 20, N, H)), jax.random.normal(ks[1], (2, s, N, H)),
          jax.random.normal(ks[2], (2, s, N, H)))


def test_block_sizes_and_padding():
  assert [splash.padded_length(n) for n in (1, 128, 129, 1000)] == [128, 128, 256, 1024]
  assert [splash.block_size(n) for n in (128, 256, 384, 1024, 2048)] == [128, 256, 128, 512, 512]


def test_mask_to_kernel_calls_literal():
  """Segments pad with id 0; a prefix adds a full-mask call whose ids match only prefix
  tokens (-1 for other queries, -2 for other keys, so those never meet)."""
  mask = masks.AttentionMask(q_segment_ids=np.array([[1, 1, 1, 2, 2]]), causal=True,
                             prefix=np.array([[1, 1, 0, 1, 0]]))
  parts, prefix = splash.calls(mask, (5, 5), (8, 8))
  (kind0, q0, kv0), (kind1, q1, kv1) = parts
  assert (kind0, kind1) == ('causal', 'full')
  np.testing.assert_array_equal(q0, [[1, 1, 1, 2, 2, 0, 0, 0]])
  np.testing.assert_array_equal(kv0, q0)
  np.testing.assert_array_equal(q1, [[1, 1, -1, 2, -1, -1, -1, -1]])
  np.testing.assert_array_equal(kv1, [[1, 1, -2, 2, -2, -2, -2, -2]])
  np.testing.assert_array_equal(prefix, [[1, 1, 0, 1, 0, 0, 0, 0]])
  # No segment ids: one document, its padding to the block still hidden (id 0).
  (kind, q, kv), = splash.calls(masks.AttentionMask(), (3, 2), (4, 4))[0]
  assert kind == 'full'
  np.testing.assert_array_equal(q, [[1, 1, 1, 0]])
  np.testing.assert_array_equal(kv, [[1, 1, 0, 0]])


def test_what_splash_takes_and_what_falls_back():
  """Splash reads causal / full masks and segment ids; a bias value runs on the flash kernel,
  a dense matrix as 'xla'; 'auto' picks it on TPU only where the mask allows."""
  tpu = dict(backend='tpu')
  assert runnable_implementation('splash', **tpu) == 'splash'
  assert runnable_implementation('splash', bias=True, **tpu) == 'flash'
  assert runnable_implementation('splash', dense=True, **tpu) == 'xla'
  assert runnable_implementation('auto', **tpu) == 'splash'
  assert runnable_implementation('auto', bias=True, **tpu) == 'flash'
  assert runnable_implementation('auto', dropout=True, **tpu) == 'reference'
  assert runnable_implementation('splash', backend='cpu') == 'splash'       # the interpreter
  assert runnable_implementation('splash', dtype=jnp.bfloat16, backend='gpu') == 'cudnn'
  assert runnable_implementation('auto', dtype=jnp.float32, backend='gpu') == 'xla'


@pytest.mark.parametrize('case', sorted(CASES))
def test_splash_matches_reference_outputs_and_gradients(case):
  mask, s = CASES[case]
  q, k, v = _qkv(s)
  probe = jax.random.normal(jax.random.key(7), q.shape)

  def loss(impl):
    return lambda q, k, v: jnp.sum(
        dot_product_attention(q, k, v, mask=mask, implementation=impl) * probe)
  want = dot_product_attention(q, k, v, mask=mask, implementation='reference')
  got = jax.jit(lambda q, k, v: dot_product_attention(q, k, v, mask=mask,
                                                       implementation='splash'))(q, k, v)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  grads = jax.jit(jax.grad(loss('splash'), argnums=(0, 1, 2)))(q, k, v)
  for g, w in zip(grads, jax.grad(loss('reference'), argnums=(0, 1, 2))(q, k, v), strict=True):
    np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)
  if case == 't5_cross':      # decoder document 3 has no encoder tokens: zeros, as reference
    np.testing.assert_array_equal(got[0, 17:], 0.0)


def test_a_bias_matrix_runs_as_xla_under_splash():
  """A bias matrix is no kernel's: the same call gives the 'xla' result."""
  q, k, v = _qkv(20, seed=3)
  bias = jax.random.normal(jax.random.key(4), (1, N, 20, 20))
  mask = masks.AttentionMask(q_segment_ids=SEG, causal=True, bias=bias)
  np.testing.assert_array_equal(dot_product_attention(q, k, v, mask=mask, implementation='splash'),
                                dot_product_attention(q, k, v, mask=mask, implementation='xla'))


@pytest.mark.parametrize('family', ['gpt', 'bert', 't5'])
def test_the_models_reach_the_kernel(family):
  """attention_impl='splash' reaches a kernel from each model (T5: splash for its
  cross-attention, flash for its biased self-attentions), and 'reference' never does."""
  params = init(tiny(family))
  args, kwargs = family_of(family).model_inputs(family_of(family).init_batch(8))
  def program(impl):
    model = build(tiny(family, attention_impl=impl))
    return str(jax.make_jaxpr(lambda p: model.apply({'params': p}, *args, **kwargs))(params))
  assert 'pallas_call' in program('splash')
  assert 'pallas_call' not in program('reference')


def test_splash_runs_inside_scanned_layers():
  """With scan_layers the kernel is first made inside nn.scan's trace; the cached kernel still
  serves the next trace (its block maps are concrete), with the reference's outputs."""
  cfg = tiny('gpt', scan_layers=True)
  params, x = init(cfg), jnp.arange(3, 11)[None]
  np.testing.assert_allclose(forward(cfg.replace(attention_impl='splash'), params, x),
                             forward(cfg.replace(attention_impl='reference'), params, x),
                             atol=1e-5, rtol=0)


class Packed:
  """Synthetic GPT batches repacked as two documents and tail padding per row; with `prefix`,
  prefix-LM rows (objectives/prefix_lm.py) seeded by the batch index."""

  def __init__(self, inner, prefix: bool):
    self.inner, self.prefix = inner, prefix

  def __iter__(self):
    return self

  def __next__(self):
    index = self.inner.index
    b = dict(next(self.inner))
    rows, t = b['inputs'].shape
    seg = np.zeros((rows, t), np.int32)
    seg[:, :t // 2], seg[:, t // 2:t - 3] = 1, 2
    pos = np.where(seg == 1, np.arange(t), np.arange(t) - t // 2) * (seg > 0)
    b.update(segment_ids=seg, positions=pos.astype(np.int32),
             loss_weights=(seg > 0).astype(np.float32))
    if self.prefix:
      b.update(prefix_lm.features(seg, pos, np.random.default_rng(index)))
    return b

  def get_state(self):
    return self.inner.get_state()

  def set_state(self, state):
    self.inner.set_state(state)


@pytest.mark.slow
@pytest.mark.parametrize('objective', ['clm', 'prefix_lm'])
def test_a_tiny_gpt_trains_the_same_3_steps_with_splash(tmp_path, capsys, objective):
  """3 Adam steps of a tiny GPT on packed rows (and as a prefix LM): the same losses with
  attention_impl='splash' (Pallas's interpreter here) as with 'reference'."""
  losses = {}
  for impl in ('reference', 'splash'):
    config = tiny_config('gpt', steps=3, log_every=1)
    config.model.update(attention_impl=impl, prefix_lm=objective == 'prefix_lm')
    config.data.objective = objective
    inner = synthetic.synthetic_datasets(config)

    def datasets(inner=inner, **kw):   # this iteration's inner, not the last one's
      return Packed(inner(**kw), objective == 'prefix_lm')
    loop.train_and_evaluate(config, str(tmp_path / impl), datasets=datasets)
    losses[impl] = train_losses(str(tmp_path / impl))
    err = capsys.readouterr().err
    assert ("note: model.attention_impl='splash' is a TPU kernel; on cpu it runs in Pallas's "
            'interpreter' in err) == (impl == 'splash'), err
  assert sorted(losses['splash']) == [1, 2, 3]
  for step, loss in losses['reference'].items():
    assert abs(losses['splash'][step] - loss) <= 1e-4, losses


def sharded_vs_single():
  """Run as a script on 4 simulated devices: splash under the train step's mesh context
  (training/mesh.traced_in: shard_map over batch and heads) against one device."""
  mesh = mesh_lib.make_mesh(MeshConfig(data=2, fsdp=1, tensor=2))
  q, k, v = (jnp.concatenate([x, x[::-1]]) for x in _qkv(20))        # 4 rows, 2 heads
  seg, prefix = np.concatenate([SEG, SEG[::-1]]), np.concatenate([PREFIX, PREFIX[::-1]])

  def attend(q, k, v, seg, prefix):
    mask = masks.AttentionMask(q_segment_ids=seg, causal=True, prefix=prefix)
    return dot_product_attention(q, k, v, mask=mask, implementation='splash')
  rows = NamedSharding(mesh, P(mesh_lib.BATCH_AXES))
  sharded = jax.jit(mesh_lib.traced_in(mesh, attend), in_shardings=(rows,) * 5,
                    out_shardings=rows)
  text = sharded.lower(q, k, v, seg, prefix).as_text()
  got, want = sharded(q, k, v, seg, prefix), jax.jit(attend)(q, k, v, seg, prefix)
  print(json.dumps({'devices': jax.device_count(), 'max_diff': float(jnp.abs(got - want).max()),
                    'manual': 'sdy.manual_computation' in text or 'shard_map' in text,
                    'all_gathers': text.count('all_gather') + text.count('all-gather')}))


@pytest.mark.slow
def test_splash_under_a_mesh_runs_per_shard_and_matches_one_device():
  here = os.path.dirname(os.path.abspath(__file__))
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=4',
             PYTHONPATH=os.pathsep.join([os.path.dirname(here), here]))
  done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                        timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  report = json.loads(done.stdout.strip().splitlines()[-1])
  assert report['devices'] == 4 and report['manual'] and report['all_gathers'] == 0, report
  assert report['max_diff'] <= 1e-6, report


if __name__ == '__main__':
  sharded_vs_single()
