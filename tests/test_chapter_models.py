"""The chapter-41 skeleton: one GPT stack, the mask its only difference; PyTorch's init; parity
with scripts/shakespeare_torch.py's PyTorch model given the same weights."""
import importlib.util
import os

import flax.linen as nn
import jax
import numpy as np
import pytest
from helpers import ROOT
from modeling import forward, init, tiny, tokens

from configs import shakespeare_char
from pretrain_jax.hf import config as hf_config
from pretrain_jax.models import ModelConfig, build, family_of


def _chapter_cfg(causal: bool, vocab: int = 40, **kw) -> ModelConfig:
  model = shakespeare_char.get_config().gpt.model.to_dict()
  model.update(causal=causal, head_bias=not causal, vocab_size=vocab, **kw)
  return ModelConfig.from_config(model)


def test_the_mask_is_the_only_difference():
  """Same parameters, causal vs bidirectional: in one layer the last position sees every token
  either way, so its logits agree; earlier positions differ, and only the bidirectional ones
  see the future."""
  causal, bidi = tiny('gpt', num_layers=1), tiny('gpt', num_layers=1, causal=False)
  params = init(causal)
  assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, init(bidi))
  x = tokens((2, 10))
  a, b = forward(causal, params, x), forward(bidi, params, x)
  np.testing.assert_allclose(a[:, -1], b[:, -1], atol=1e-5)
  assert np.abs(a[:, 0] - b[:, 0]).max() > 1e-3
  y = x.at[:, 9].set((x[:, 9] + 1) % 97)
  np.testing.assert_array_equal(forward(causal, params, y)[:, :9], a[:, :9])
  assert np.abs(forward(bidi, params, y)[:, 0] - b[:, 0]).max() > 1e-4


def test_torch_default_init():
  """nn.Linear: weights and biases U(+-1/sqrt(fan_in)); nn.Embedding N(0, 1); LayerNorm 1/0."""
  cfg = _chapter_cfg(False, vocab=500, mlp_dim=512)
  params = init(cfg, length=48)

  def uniform(x, fan_in):
    bound = fan_in ** -0.5
    x = np.asarray(x).ravel()
    assert np.abs(x).max() <= bound
    np.testing.assert_allclose(x.std(), bound / np.sqrt(3), rtol=0.15)
  block = params['h_0']
  for name in ('query', 'key', 'value'):
    uniform(block['attn'][name]['kernel'], 96)
    uniform(block['attn'][name]['bias'], 96)
  uniform(block['attn']['out']['kernel'], 96)
  uniform(block['mlp']['wi']['kernel'], 96)
  uniform(block['mlp']['wo']['kernel'], 512)     # no GPT-2 residual shrink
  uniform(block['mlp']['wo']['bias'], 512)
  uniform(params['lm_head']['kernel'], 96)
  uniform(params['lm_head']['bias'], 96)
  np.testing.assert_allclose(np.std(params['wte']['embedding']), 1.0, rtol=0.05)
  np.testing.assert_array_equal(block['ln_1']['scale'], 1.0)
  np.testing.assert_array_equal(block['ln_1']['bias'], 0.0)
  assert 'bias' not in init(_chapter_cfg(True), length=48)['lm_head']   # GPT: no head bias


def _dropout_calls(cfg) -> int:
  calls = []

  def count(next_fun, args, kwargs, context):
    if isinstance(context.module, nn.Dropout) and context.method_name == '__call__':
      calls.append(context.module.name)
    return next_fun(*args, **kwargs)
  params = init(cfg.replace(deterministic=True))
  args, kwargs = family_of(cfg).model_inputs(family_of(cfg).init_batch(8))
  with nn.intercept_methods(count):
    build(cfg).apply({'params': params}, *args, **kwargs, rngs={'dropout': jax.random.key(0)})
  return len(calls)


@pytest.mark.parametrize('family', ['gpt', 'bert', 't5'])
def test_embedding_dropout_switch(family):
  """embedding_dropout=False removes exactly the dropout on the embeddings (one per stack)."""
  on = tiny(family, dropout_rate=0.1, deterministic=False)
  stacks = 2 if family == 't5' else 1
  assert _dropout_calls(on) - _dropout_calls(on.replace(embedding_dropout=False)) == stacks


def test_options_that_do_not_apply_are_refused():
  with pytest.raises(ValueError, match='causal=False'):
    tiny('bert', causal=False)
  with pytest.raises(ValueError, match='causal=False'):
    tiny('gpt', causal=False, decode=True)
  with pytest.raises(ValueError, match="kernel_init='torch_default'"):
    tiny('t5', kernel_init='torch_default')
  with pytest.raises(ValueError, match='causal=False'):
    hf_config.hf_config_from_model(tiny('gpt', causal=False, position_embedding='learned'))


def _torch_script():
  spec = importlib.util.spec_from_file_location(
      'shakespeare_torch', os.path.join(ROOT, 'scripts', 'shakespeare_torch.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _params_from_torch(model, cfg) -> dict:
  """The PyTorch model's weights in our parameter tree (kernels are Linear weights
  transposed, with the heads axis split out)."""
  t = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  n, h, e = cfg.num_heads, cfg.head_dim, cfg.emb_dim

  def norm(p):
    return {'scale': t[f'{p}.weight'], 'bias': t[f'{p}.bias']}

  def proj(p):
    return {'kernel': t[f'{p}.weight'].T.reshape(e, n, h), 'bias': t[f'{p}.bias'].reshape(n, h)}
  out = {'wte': {'embedding': t['tok.weight']}, 'ln_f': norm('ln_f'),
         'lm_head': {'kernel': t['head.weight'].T}}
  if 'head.bias' in t:
    out['lm_head']['bias'] = t['head.bias']
  for i in range(cfg.num_layers):
    p = f'blocks.{i}'
    out[f'h_{i}'] = {
        'ln_1': norm(f'{p}.ln_1'), 'ln_2': norm(f'{p}.ln_2'),
        'attn': {'query': proj(f'{p}.q'), 'key': proj(f'{p}.k'), 'value': proj(f'{p}.v'),
                 'out': {'kernel': t[f'{p}.o.weight'].T.reshape(n, h, e),
                         'bias': t[f'{p}.o.bias']}},
        'mlp': {'wi': {'kernel': t[f'{p}.ff.0.weight'].T, 'bias': t[f'{p}.ff.0.bias']},
                'wo': {'kernel': t[f'{p}.ff.2.weight'].T, 'bias': t[f'{p}.ff.2.bias']}}}
  return out


@pytest.mark.parametrize('causal', [True, False])
def test_same_logits_as_the_pytorch_reference(causal):
  """scripts/shakespeare_torch.py's model and ours, with the same weights, give the same logits:
  the two sides of the speed comparison train the same network."""
  torch = pytest.importorskip('torch')
  script = _torch_script()
  config = shakespeare_char.get_config()
  family = config.gpt if causal else config.bert
  torch.manual_seed(0)
  model = script.Model(40, family.model, causal=causal).eval()
  cfg = _chapter_cfg(causal)
  params = _params_from_torch(model, cfg)
  assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, init(cfg, length=48))
  ids = np.random.default_rng(0).integers(0, 40, (3, 48))
  with torch.no_grad():
    want = model(torch.from_numpy(ids)).numpy()
  np.testing.assert_allclose(forward(cfg, params, ids), want, atol=2e-4, rtol=1e-4)
