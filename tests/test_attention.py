"""The attention core: both implementations agree; empty rows are zeros, never NaN."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from modeling import tiny_config

from pretrain_jax.models import ModelConfig, masks
from pretrain_jax.models.attention import (
  by_segments,
  document_lengths,
  dot_product_attention,
  runnable_implementation,
)
from pretrain_jax.run import loop
from pretrain_jax.run.notes import implementation_notes
from pretrain_jax.training import synthetic

B, T, N, H = 2, 6, 3, 8


def _qkv(seed=0):
  ks = jax.random.split(jax.random.key(seed), 3)
  return [jax.random.normal(k, (B, T, N, H), jnp.float32) for k in ks]


SEGMENTS = jnp.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 0, 0]])
EVERYWHERE = masks.AttentionMask()
CASES = {
    'none': EVERYWHERE,
    'causal': masks.AttentionMask(causal=True),
    'padded': masks.AttentionMask(q_segment_ids=jnp.array([[1] * 4 + [0] * 2, [1] * 6])),
    'packed_causal': masks.AttentionMask(q_segment_ids=SEGMENTS, causal=True),
    'biased': masks.AttentionMask(q_segment_ids=SEGMENTS,
                                  bias=jax.random.normal(jax.random.key(9), (1, N, T, T))),
    'matrix': masks.AttentionMask(dense_mask=masks.combine_masks(
        masks.causal_mask(T), masks.segment_mask(SEGMENTS))),
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_reference_and_xla_agree(case):
  q, k, v = _qkv()
  ref = dot_product_attention(q, k, v, CASES[case], implementation='reference')
  xla = dot_product_attention(q, k, v, CASES[case], implementation='xla')
  np.testing.assert_allclose(ref, xla, atol=1e-5, rtol=0)


def test_the_mask_is_an_attention_mask():
  """One way to pass a mask: a bool matrix is refused, naming its type and the wrapper."""
  q, k, v = _qkv()
  with pytest.raises(TypeError, match=r'mask of type ArrayImpl; .*AttentionMask\(dense_mask='):
    dot_product_attention(q, k, v, masks.causal_mask(T))
  with pytest.raises(TypeError, match='mask of type NoneType'):
    dot_product_attention(q, k, v, None)


def test_reference_matches_numpy_softmax():
  q, k, v = _qkv(1)
  logits = np.einsum('btnh,bsnh->bnts', q, k) / np.sqrt(H)
  logits = np.where(np.tril(np.ones((T, T), bool)), logits, -np.inf)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  expected = np.einsum('bnts,bsnh->btnh', p, v)
  np.testing.assert_allclose(dot_product_attention(q, k, v, CASES['causal']), expected,
                             atol=1e-5)


@pytest.mark.parametrize('impl', ['reference', 'xla'])
def test_row_that_sees_nothing_is_zero_with_finite_gradients(impl):
  q, k, v = _qkv(2)
  mask = masks.AttentionMask(q_segment_ids=SEGMENTS)  # row 0's last token, row 1's last two:
  out = dot_product_attention(q, k, v, mask, implementation=impl)   # padding
  assert np.all(np.isfinite(out))
  np.testing.assert_array_equal(out[0, 5], 0.0)
  np.testing.assert_array_equal(out[1, 4:], 0.0)
  grads = jax.grad(lambda q: dot_product_attention(q, k, v, mask,
                                                   implementation=impl).sum())(q)
  assert np.all(np.isfinite(grads))


def test_scale_and_dropout_arguments():
  q, k, v = _qkv(3)
  a = dot_product_attention(q * H ** -0.5, k, v, EVERYWHERE, scale=1.0)
  b = dot_product_attention(q, k, v, EVERYWHERE)
  np.testing.assert_allclose(a, b, atol=1e-5)
  dropped = dot_product_attention(q, k, v, EVERYWHERE, dropout_rng=jax.random.key(0),
                                  dropout_rate=0.5)
  assert not np.allclose(dropped, b)
  # no key or no rate: no dropout
  np.testing.assert_array_equal(dot_product_attention(q, k, v, EVERYWHERE, dropout_rate=0.5), b)
  np.testing.assert_array_equal(
      dot_product_attention(q, k, v, EVERYWHERE, dropout_rng=jax.random.key(0)), b)
  with pytest.raises(ValueError, match='no attention dropout'):
    dot_product_attention(q, k, v, EVERYWHERE, dropout_rng=jax.random.key(0), dropout_rate=0.5,
                          implementation='xla')
  with pytest.raises(ValueError, match="'flex'"):
    dot_product_attention(q, k, v, EVERYWHERE, implementation='flex')


@pytest.mark.parametrize('impl', ['reference', 'xla'])
@pytest.mark.parametrize('segments', ['none', 'packed'])
def test_factored_causal_equals_the_materialized_causal_mask(impl, segments):
  """causal=True is exactly `mask AND causal_mask`: the same output and gradients."""
  q, k, v = _qkv(4)
  seg = None if segments == 'none' else SEGMENTS
  flag = masks.AttentionMask(q_segment_ids=seg, causal=True)
  full = masks.AttentionMask(dense_mask=masks.combine_masks(
      None if seg is None else masks.segment_mask(seg), masks.causal_mask(T)))

  def run(q, mask):
    return dot_product_attention(q, k, v, mask, implementation=impl)
  np.testing.assert_array_equal(run(q, flag), run(q, full))
  np.testing.assert_array_equal(jax.grad(lambda q: run(q, flag).sum())(q),
                                jax.grad(lambda q: run(q, full).sum())(q))
  # and causal=True really hides the future: it differs from the mask alone
  assert not np.allclose(run(q, flag), run(q, masks.AttentionMask(q_segment_ids=seg)))


@pytest.mark.skipif(jax.default_backend() == 'gpu', reason='cuDNN runs there')
def test_cudnn_runs_as_xla_where_there_is_no_gpu():
  """A GPU config ('cudnn') smoke-tests on a CPU and its checkpoints evaluate there."""
  assert runnable_implementation('cudnn') == 'xla'
  assert runnable_implementation('reference') == 'reference'
  with pytest.raises(ValueError, match=r"attention implementation 'flex'; expected one of"):
    runnable_implementation('flex')
  q, k, v = (jax.random.normal(jax.random.key(i), (2, 6, 2, 4), jnp.bfloat16) for i in range(3))
  mask = masks.AttentionMask(q_segment_ids=jnp.array([[1, 1, 1, 2, 2, 0], [1] * 6]),
                             causal=True)
  got = dot_product_attention(q, k, v, mask, implementation='cudnn')
  want = dot_product_attention(q, k, v, mask, implementation='xla')
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
  # What cuDNN would refuse on a GPU is refused here too (float32), naming the fix.
  with pytest.raises(ValueError, match=r"'cudnn' .*float32"):
    dot_product_attention(*(x.astype(jnp.float32) for x in (q, k, v)), EVERYWHERE,
                          implementation='cudnn')
  with pytest.raises(ValueError, match=r"'cudnn' .*dropout \(rate 0\.1\)"):
    dot_product_attention(q, k, v, EVERYWHERE, implementation='cudnn', dropout_rate=0.1,
                          dropout_rng=jax.random.key(0))


@pytest.mark.skipif(jax.default_backend() == 'gpu', reason='cuDNN runs there')
def test_training_a_cudnn_config_on_cpu_says_so_and_trains_as_xla(tmp_path, capsys):
  results = {}
  for impl in ('cudnn', 'xla'):
    config = tiny_config('gpt', steps=2, log_every=1)
    config.model.update(attention_impl=impl, dtype='bfloat16')
    results[impl] = loop.train_and_evaluate(config, str(tmp_path / impl),
                                            datasets=synthetic.synthetic_datasets(config))
    err = capsys.readouterr().err
    assert bool(re.search(r"note: model.attention_impl='cudnn' .* on cpu .*'xla'", err)) == (
        impl == 'cudnn'), err
  assert results['cudnn']['train_loss'] == results['xla']['train_loss']


def test_document_lengths_literal():
  n, ok = document_lengths(jnp.array([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]))
  np.testing.assert_array_equal(n, [3, 4, 0])
  assert bool(ok)
  for rows in ([[1, 1, 2, 0]], [[0, 1, 1, 1]]):     # packed; left-padded (generation prompts)
    assert not bool(document_lengths(jnp.array(rows))[1])


@pytest.mark.parametrize('rows,causal', [('one_document', False), ('one_document', True),
                                         ('packed', False), ('packed', True), ('cross', False)])
def test_segments_as_sequence_lengths_give_the_reference(rows, causal):
  """cuDNN's reading of segment ids (attention.by_segments), run by XLA's implementation here:
  tail-padded one-document rows go as sequence lengths, packed ones as the segment mask."""
  q, k, v = _qkv(5)
  seg = {'one_document': jnp.array([[1] * 4 + [0] * 2, [1] * 6]),
         'packed': SEGMENTS, 'cross': jnp.array([[1] * 4 + [0] * 2, [1] * 6])}[rows]
  kv = jnp.array([[1] * 3 + [0] * 3, [1] * 5 + [0]]) if rows == 'cross' else None
  mask = masks.AttentionMask(q_segment_ids=seg, kv_segment_ids=kv, causal=causal)
  want = dot_product_attention(q, k, v, mask, implementation='reference')
  got = by_segments(q, k, v, None, mask, H ** -0.5, causal, 'xla')
  sees = np.asarray(mask.rows_that_see(T, T))[..., None]        # rows the core zeroes after
  np.testing.assert_allclose(np.where(sees, got, 0), want, atol=1e-5, rtol=0)


def test_notes_name_each_fallback():
  def cfg(family, **kw):
    return ModelConfig(family=family, vocab_size=8, num_layers=1, emb_dim=8,
                       num_heads=2, head_dim=4, mlp_dim=8, **kw)
  assert implementation_notes(cfg('gpt', attention_dropout_rate=0.0), 'tpu') == []
  assert re.match(r"note: model.attention_impl='cudnn' .* on cpu .*'xla'",
                  implementation_notes(cfg('gpt', attention_impl='cudnn'), 'cpu')[0])
  t5 = implementation_notes(cfg('t5', position_embedding='relative', attention_impl='splash',
                                attention_dropout_rate=0.0), 'tpu')
  assert t5 == ["note: splash attention takes no additive bias: the attentions with T5's "
                "relative position bias run on the 'flash' kernel"]
  assert "runs in Pallas's interpreter" in implementation_notes(
      cfg('t5', position_embedding='relative', attention_impl='flash'), 'cpu')[0]
  # (on a GPU model.dtype='auto' computes bf16, which cuDNN runs; float32 runs on 'xla')
  assert re.match(r"note: model.attention_impl='flash' is a TPU kernel; on gpu .*'cudnn'",
                  implementation_notes(cfg('gpt', attention_impl='flash'), 'gpu')[0])
  assert re.match(r"note: model.attention_impl='flash' is a TPU kernel; on gpu .*'xla'",
                  implementation_notes(cfg('gpt', attention_impl='flash', dtype='float32'),
                                       'gpu')[0])
  assert "runs in Pallas's interpreter" in implementation_notes(
      cfg('bert', attention_impl='splash', attention_dropout_rate=0.0), 'cpu')[0]
  dropout = implementation_notes(cfg('gpt', attention_dropout_rate=0.1), 'tpu')
  assert dropout == ["note: model.attention_dropout_rate=0.1: training attention runs as "
                     "'reference' (no kernel has attention dropout); set it to 0 for 'splash'"]
