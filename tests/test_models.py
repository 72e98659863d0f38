"""Model behaviour: causality, packing isolation, padding, precision, parameter counts."""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from modeling import VOCAB, forward, init, tiny, tokens

from pretrain_jax.hf import config as hf_config
from pretrain_jax.models import ModelConfig, describe


@pytest.mark.parametrize('family,causal', [('gpt', True), ('bert', False)])
def test_future_token_changes_only_noncausal_logits(family, causal):
  cfg = tiny(family)
  params = init(cfg)
  x = tokens((1, 10))
  t = 4
  y = x.at[0, t + 1].set((x[0, t + 1] + 1) % 97)
  a, b = forward(cfg, params, x), forward(cfg, params, y)
  if causal:
    np.testing.assert_array_equal(a[0, :t + 1], b[0, :t + 1])
  else:
    assert np.abs(a[0, :t + 1] - b[0, :t + 1]).max() > 1e-4


def test_prefix_lm_sees_its_prefix_both_ways_and_the_rest_causally():
  """A prefix LM (gpt, prefix_lm=True): changing a prefix token changes the logits of the
  prefix tokens before it; changing a token after the prefix changes nothing before it; and
  without a prefix it is the causal GPT (the same parameters)."""
  cfg = tiny('gpt', prefix_lm=True)
  params = init(cfg)
  x = tokens((1, 10))
  prefix = jnp.array([[1] * 4 + [0] * 6])
  def run(x, **kw):
    return forward(cfg, params, x, **kw)
  def changed(t):
    return x.at[0, t].set((x[0, t] + 1) % VOCAB)
  a = run(x, prefix=prefix)
  assert np.abs(run(changed(3), prefix=prefix)[0, :3] - a[0, :3]).max() > 1e-4
  np.testing.assert_array_equal(run(changed(6), prefix=prefix)[0, :6], a[0, :6])
  np.testing.assert_array_equal(run(x), forward(tiny('gpt'), params, x))
  assert np.abs(run(x)[0, :4] - a[0, :4]).max() > 1e-4      # the prefix is read both ways
  with pytest.raises(ValueError, match=r'model\.prefix_lm=False'):
    forward(tiny('gpt'), params, x, prefix=prefix)
  with pytest.raises(ValueError, match=r'prefix_lm=True;'):
    tiny('bert', prefix_lm=True)


def _packed(doc_a, doc_b, length):
  """Row with A then B then padding; returns inputs, segment_ids, positions."""
  la, lb = len(doc_a), len(doc_b)
  pad = length - la - lb
  inputs = jnp.concatenate([doc_a, doc_b, jnp.zeros(pad, jnp.int32)])[None]
  seg = jnp.array([1] * la + [2] * lb + [0] * pad)[None]
  pos = jnp.array(list(range(la)) + list(range(lb)) + [0] * pad)[None]
  return inputs, seg, pos


@pytest.mark.parametrize('family,options', [('gpt', {}), ('bert', {}),
                                            ('bert', dict(position_embedding='alibi'))])
def test_packed_document_is_isolated(family, options):
  cfg = tiny(family, **options)
  params = init(cfg)
  doc_a, doc_b = tokens((7,), 2), tokens((5,), 3)
  alone, seg, pos = _packed(doc_a, jnp.zeros(0, jnp.int32), 16)
  packed, seg2, pos2 = _packed(doc_a, doc_b, 16)
  a = forward(cfg, params, alone, segment_ids=seg, positions=pos)
  b = forward(cfg, params, packed, segment_ids=seg2, positions=pos2)
  np.testing.assert_allclose(a[0, :7], b[0, :7], atol=1e-5)
  # And document B alone at the start of a row matches B packed after A.
  b_alone, seg3, pos3 = _packed(doc_b, jnp.zeros(0, jnp.int32), 16)
  c = forward(cfg, params, b_alone, segment_ids=seg3, positions=pos3)
  np.testing.assert_allclose(c[0, :5], b[0, 7:12], atol=1e-5)


def test_t5_packed_documents_are_isolated():
  cfg = tiny('t5')
  params = init(cfg)
  enc_a, enc_b, dec_a, dec_b = tokens((6,), 4), tokens((5,), 5), tokens((4,), 6), tokens((3,), 7)
  e1, es1, _ = _packed(enc_a, jnp.zeros(0, jnp.int32), 16)
  d1, ds1, _ = _packed(dec_a, jnp.zeros(0, jnp.int32), 8)
  e2, es2, _ = _packed(enc_a, enc_b, 16)
  d2, ds2, _ = _packed(dec_a, dec_b, 8)
  a = forward(cfg, params, e1, d1, encoder_segment_ids=es1, decoder_segment_ids=ds1)
  b = forward(cfg, params, e2, d2, encoder_segment_ids=es2, decoder_segment_ids=ds2)
  np.testing.assert_allclose(a[0, :4], b[0, :4], atol=1e-5)


def test_t5_decoder_is_causal_and_encoder_padding_is_ignored():
  cfg = tiny('t5')
  params = init(cfg)
  enc, dec = tokens((1, 10), 8), tokens((1, 6), 9)
  enc_seg = jnp.array([[1] * 7 + [0] * 3])
  base = forward(cfg, params, enc, dec, encoder_segment_ids=enc_seg)
  dec2 = dec.at[0, 3].set((dec[0, 3] + 1) % 97)
  changed = forward(cfg, params, enc, dec2, encoder_segment_ids=enc_seg)
  np.testing.assert_array_equal(base[0, :3], changed[0, :3])
  assert np.abs(base[0, 3:] - changed[0, 3:]).max() > 1e-4
  enc_pad_changed = enc.at[0, 8].set((enc[0, 8] + 5) % 97)
  np.testing.assert_allclose(
      forward(cfg, params, enc_pad_changed, dec, encoder_segment_ids=enc_seg), base, atol=1e-6)
  enc_real_changed = enc.at[0, 2].set((enc[0, 2] + 5) % 97)
  assert np.abs(forward(cfg, params, enc_real_changed, dec, encoder_segment_ids=enc_seg)
                - base).max() > 1e-4


@pytest.mark.parametrize('family,options', [
    ('gpt', {}), ('bert', {}), ('t5', {}),
    ('bert', dict(position_embedding='alibi', alibi_bias_max=1.0))])
def test_attention_implementations_agree_in_the_model(family, options):
  ref = tiny(family, **options)
  params = init(ref)
  x = tokens((2, 12), 10)
  seg = jnp.array([[1] * 5 + [2] * 5 + [0] * 2, [1] * 12])
  args = (x, x) if family == 't5' else (x,)
  kw = (dict(encoder_segment_ids=seg, decoder_segment_ids=seg) if family == 't5'
        else dict(segment_ids=seg))
  a = forward(ref, params, *args, **kw)
  b = forward(ref.replace(attention_impl='xla'), params, *args, **kw)
  np.testing.assert_allclose(a, b, atol=1e-5)


def test_t5_gradients_agree_across_attention_implementations():
  """The reference path broadcasts T5's position bias over the batch once per stack (so its
  gradient is reduced over the batch once); 'xla' keeps (1, N, T, S) per layer. Same gradients,
  the relative-position table's (shared by every layer) included."""
  ref = tiny('t5')
  params = init(ref)
  x, y = tokens((2, 12), 10), tokens((2, 7), 11)
  seg = jnp.array([[1] * 5 + [2] * 5 + [0] * 2, [1] * 12])
  weights = jax.random.normal(jax.random.key(3), (2, 7, VOCAB))

  def grads(cfg):
    def loss(p):
      return (forward(cfg, p, x, y, encoder_segment_ids=seg) * weights).sum()
    return jax.jit(jax.grad(loss))(params)

  a, b = grads(ref), grads(ref.replace(attention_impl='xla'))
  for name in ('encoder', 'decoder'):
    table_grad = a[name]['relpos_bias']['rel_embedding']
    assert np.abs(table_grad).max() > 1e-3          # the bias really gets a gradient
  for ga, gb in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(ga, gb, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('family', ['gpt', 'bert', 't5'])
def test_bf16_compute_with_fp32_params_is_finite_and_close(family):
  cfg = tiny(family)
  params = init(cfg)
  x = tokens((2, 12), 11)
  args = (x, x) if family == 't5' else (x,)
  full = forward(cfg, params, *args)
  half = forward(cfg.replace(dtype=jnp.bfloat16), params, *args)
  assert half.dtype == jnp.float32 and np.all(np.isfinite(half))
  assert np.abs(half - full).max() < 0.05 * np.abs(full).max() + 0.05
  assert np.mean(np.argmax(half, -1) == np.argmax(full, -1)) > 0.9


def test_auto_dtype_computes_float32_on_cpu_bit_for_bit():
  """model.dtype='auto' (the default) built on a CPU is the float32 model: the same logits,
  bit for bit, so CPU results did not move when it became the default."""
  cfg = tiny('gpt')
  params, x = init(cfg), tokens((2, 12), 11)
  assert cfg.dtype == 'auto' and jax.default_backend() == 'cpu'
  auto = forward(cfg, params, x)
  np.testing.assert_array_equal(auto, forward(cfg.replace(dtype='float32'), params, x))
  assert not np.array_equal(auto, forward(cfg.replace(dtype='bfloat16'), params, x))


PUBLISHED = {'bert_base': 110_106_428, 'gpt2_small': 124_439_808, 'gpt2_medium': 354_823_168,
             't5_small': 60_506_624, 't5_v1_1_base': 247_577_856}


@pytest.mark.parametrize('name', sorted(PUBLISHED))
def test_published_parameter_counts(name):
  config = importlib.import_module(f'configs.{name}').get_config()
  _, total = describe.parameter_table(ModelConfig.from_config(config.model))
  assert total == PUBLISHED[name]


def test_parameter_table_counts_layers_in_order():
  config = importlib.import_module('configs.gpt2_small').get_config()
  rows, _ = describe.parameter_table(ModelConfig.from_config(config.model))
  layers = list(dict.fromkeys(r[0].split('/')[0] for r in rows))
  assert layers == [f'h_{i}' for i in range(12)] + ['ln_f', 'wpe', 'wte']   # h_2 before h_10
  assert sorted(['b/h_10/x', 'b/h_9/x', 'a', 'b/h_1/y', 'b/h_1/x'],
                key=describe.counting_order) == ['a', 'b/h_1/x', 'b/h_1/y', 'b/h_9/x', 'b/h_10/x']


def test_bert_encoder_and_pooler_count_without_heads():
  cfg = ModelConfig.from_config(importlib.import_module('configs.bert_base').get_config().model)
  rows, total = describe.parameter_table(cfg)
  heads = sum(r[3] for r in rows
              if r[0].split('/')[0] in ('mlm_transform', 'mlm_bias', 'nsp'))
  assert total - heads == 109_482_240


def test_bad_model_config_names_the_value():
  with pytest.raises(ValueError, match="activation='swish'"):
    tiny('gpt', activation='swish')
  with pytest.raises(ValueError, match=r"unknown config.model keys \['hidden'\]"):
    ModelConfig.from_config({'family': 'gpt', 'hidden': 3})


@pytest.mark.parametrize('family,head', [('gpt', 'lm_head'), ('bert', 'mlm_decoder')])
def test_untied_lm_head_is_its_own_layer(family, head):
  tied, untied = init(tiny(family)), init(tiny(family, tie_embeddings=False))
  assert head not in tied and untied[head]['kernel'].shape == (32, 97)
  # A zero kernel (plus GPT's zero-init bias / BERT's mlm_bias) gives the head's bias as logits,
  # whatever the input: the head no longer reads the token embedding.
  untied[head]['kernel'] = jnp.zeros_like(untied[head]['kernel'])
  bias = jnp.arange(97, dtype=jnp.float32) / 97
  if family == 'gpt':
    untied[head]['bias'] = bias
  else:
    untied['mlm_bias'] = bias
  logits = forward(tiny(family, tie_embeddings=False), untied, tokens((2, 8)))
  np.testing.assert_allclose(logits, np.broadcast_to(bias, (2, 8, 97)), atol=1e-6)


@pytest.mark.parametrize('family', ['gpt', 'bert'])
def test_untied_head_is_not_exported_to_hugging_face(family):
  with pytest.raises(ValueError, match='tie_embeddings=False; Hugging Face'):
    hf_config.hf_config_from_model(tiny(family, tie_embeddings=False, position_embedding='learned'))
