"""The big published configs (configs/gpt2_large.py ... t5_v1_1_xxl.py) have the shapes of the
published models: transformers builds each model from its published config.json values on
torch's meta device (no weights), the project's conversion rules (pretrain_jax/hf) map every
tensor to our layout, and the result must equal our parameter tree (jax.eval_shape of init, in
the config's scanned layout) path by path, shape by shape."""
import importlib
import re

import flax.linen as nn
import numpy as np
import pytest

from pretrain_jax.hf import families
from pretrain_jax.hf.weights import IGNORED, flatten, normalize_names
from pretrain_jax.models import ModelConfig
from pretrain_jax.models.describe import abstract_variables

torch = pytest.importorskip('torch')
tr = pytest.importorskip('transformers')

GPT2 = dict(model_type='gpt2', vocab_size=50257, n_positions=1024,
            activation_function='gelu_new', layer_norm_epsilon=1e-5)
T5_V1_1 = dict(model_type='t5', vocab_size=32128, d_kv=64, num_layers=24,
               feed_forward_proj='gated-gelu', tie_word_embeddings=False,
               relative_attention_num_buckets=32, relative_attention_max_distance=128,
               layer_norm_epsilon=1e-6)
# config name -> (the published model's config.json values, its parameter count; T5 v1.1 with
# its own LM head, as the published checkpoints hold it)
PUBLISHED = {
    'gpt2_large': (dict(GPT2, n_layer=36, n_embd=1280, n_head=20), 774_030_080),
    'gpt2_xl': (dict(GPT2, n_layer=48, n_embd=1600, n_head=25), 1_557_611_200),
    'gpt3_6_7b': (dict(GPT2, n_layer=32, n_embd=4096, n_head=32, n_positions=2048),
                  6_658_404_352),
    't5_v1_1_large': (dict(T5_V1_1, d_model=1024, num_heads=16, d_ff=2816), 783_150_080),
    't5_v1_1_xl': (dict(T5_V1_1, d_model=2048, num_heads=32, d_ff=5120), 2_849_757_184),
    't5_v1_1_xxl': (dict(T5_V1_1, d_model=4096, num_heads=64, d_ff=10240), 11_135_332_352),
}
# What config_from_hf reads that decides a shape or the architecture (dropout rates excepted:
# the big configs set their own).
STRUCTURE = ('vocab_size', 'num_layers', 'num_decoder_layers', 'emb_dim', 'num_heads',
             'head_dim', 'mlp_dim', 'max_len', 'activation', 'position_embedding',
             'layer_norm_eps', 'tie_embeddings', 'relative_buckets', 'relative_max_distance')


def ours(name: str) -> ModelConfig:
  return ModelConfig.from_config(importlib.import_module(f'configs.{name}').get_config().model)


def hf_shapes(published: dict) -> dict:
  """{tensor name: shape} of the model transformers builds from `published` (meta device)."""
  values = dict(published)
  config = tr.CONFIG_MAPPING[values.pop('model_type')](**values)
  model_cls = tr.GPT2LMHeadModel if config.model_type == 'gpt2' else tr.T5ForConditionalGeneration
  with torch.device('meta'):
    model = model_cls(config)
  return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def mapped_shapes(cfg: ModelConfig, shapes: dict) -> dict:
  """HF shapes through the family's rules -> {our unscanned path: shape}; every HF tensor must
  be taken by a rule, be a tied copy of one, or be a buffer the import ignores."""
  record = families.of(cfg)
  # Zero-stride arrays: the rules' transposes, splits and reshapes are views, no memory.
  sd = {k: np.broadcast_to(np.zeros((), np.int8), s) for k, s in shapes.items()}
  sd = record.complete(cfg, normalize_names(cfg.family, sd))
  out, used = {}, set()
  for rule in record.rules(cfg):
    assert rule.hf in sd, f'{rule.hf} is not in the published model'
    for path, value in zip(rule.ours, rule.to_ours(sd[rule.hf]), strict=True):
      out[path] = tuple(value.shape)
    used.add(rule.hf)
  for dup, original in record.tied:
    if dup in sd and dup not in used:
      assert sd[dup].shape == sd[original].shape, dup
      used.add(dup)
  left = [n for n in sd if n not in used and not any(p.match(n) for p in IGNORED)]
  assert not left, f'published tensors no rule takes: {left}'
  return out


def stacked(cfg: ModelConfig, shapes: dict) -> dict:
  """{path: shape} of unscanned layers `name_i` as nn.scan lays them out: one `name` with the
  layer axis first."""
  out = {}
  for path, shape in shapes.items():
    for stack in families.of(cfg).stacks:
      prefix = '/'.join(stack[:-1] + (re.escape(stack[-1]),))
      match = re.fullmatch(rf'({prefix})_(\d+)/(.*)', path)
      if match:
        key = f'{match.group(1)}/{match.group(3)}'
        out.setdefault(key, []).append((int(match.group(2)), shape))
        break
    else:
      out[path] = shape
  for key, value in out.items():
    if isinstance(value, list):
      layers = sorted(value)
      assert [i for i, _ in layers] == list(range(len(layers))), key
      assert len({s for _, s in layers}) == 1, f'{key}: layers of different shapes'
      out[key] = (len(layers),) + layers[0][1]
  return out


def our_shapes(cfg: ModelConfig) -> dict:
  """{path: shape} of the config's parameters (jax.eval_shape of init: nothing allocated)."""
  params = nn.unbox(abstract_variables(cfg)['params'])
  return {path: tuple(leaf.shape) for path, leaf in flatten(params).items()}


def published_shapes(cfg: ModelConfig, published: dict) -> dict:
  """{our path: shape} of the published model, in `cfg`'s layout (scanned or not)."""
  shapes = mapped_shapes(cfg, hf_shapes(published))
  return stacked(cfg, shapes) if cfg.scan_layers else shapes


@pytest.mark.parametrize('name', sorted(PUBLISHED))
def test_big_config_has_the_published_shapes(name):
  published, count = PUBLISHED[name]
  cfg = ours(name)
  assert cfg.scan_layers
  params = our_shapes(cfg)
  assert params == published_shapes(cfg, published)
  assert sum(int(np.prod(s)) for s in params.values()) == count
  # Importing the published config.json gives this config's architecture.
  imported = ModelConfig(family=cfg.family,
                         **families.of(cfg).config_from_hf(published, {}))
  assert {k: getattr(imported, k) for k in STRUCTURE} == {k: getattr(cfg, k) for k in STRUCTURE}


def test_a_published_shape_that_differs_is_found():
  cfg = ours('gpt2_large')
  params = our_shapes(cfg)
  wider = published_shapes(cfg, dict(PUBLISHED['gpt2_large'][0], n_inner=5248))
  assert wider != params
  assert [k for k in params if params[k] != wider[k]] == ['h/mlp/wi/bias', 'h/mlp/wi/kernel',
                                                          'h/mlp/wo/kernel']
  assert wider['h/mlp/wi/kernel'] == (36, 1280, 5248)
