"""Bad Hugging Face input gives errors that name the tensor or field; other checkpoint layouts
(pytorch_model.bin, shards, bfloat16, pre-2020 names) import to the same parameters.

Directories here are written by our own exporter from a randomly initialised tiny model, so
most of these tests need neither torch nor transformers.
"""
import json
import os
import sys

import ml_dtypes
import modeling
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from pretrain_jax import hf
from pretrain_jax.hf import weights


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """family -> (directory of a tiny exported HF model, its ModelConfig, its params)."""
  out = {}
  for family in ('bert', 'gpt', 't5'):
    kw = dict(nsp=True) if family == 'bert' else {}
    cfg = modeling.tiny(family, **kw)
    params = modeling.init(cfg)
    path = hf.save_hf(str(tmp_path_factory.mktemp('hf') / family), cfg, params)
    out[family] = (path, cfg, params)
  return out


def rewrite(src, dst, *, config=None, tensors=None):
  """Copy of HF dir `src` at `dst` with config.json / tensors edited by the given functions."""
  os.makedirs(dst)
  with open(os.path.join(src, 'config.json')) as f:
    cfg = json.load(f)
  sd = load_file(os.path.join(src, 'model.safetensors'))
  if config:
    config(cfg)
  if tensors:
    tensors(sd)
  with open(os.path.join(dst, 'config.json'), 'w') as f:
    json.dump(cfg, f)
  save_file(sd, os.path.join(dst, 'model.safetensors'), metadata={'format': 'pt'})
  return str(dst)


def assert_same_params(a, b):
  fa, fb = weights.flatten(a), weights.flatten(b)
  assert sorted(fa) == sorted(fb)
  for k in fa:
    np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


def test_unsupported_model_type(exported, tmp_path):
  def llama(c):
    c.update(model_type='llama', architectures=['LlamaForCausalLM'])
  path = rewrite(exported['gpt'][0], tmp_path / 'd', config=llama)
  with pytest.raises(ValueError, match=r"model_type='llama'.*LlamaForCausalLM"):
    hf.load_hf(path)


def test_unsupported_architecture(exported, tmp_path):
  def classifier(c):
    c['architectures'] = ['BertForSequenceClassification']
  path = rewrite(exported['bert'][0], tmp_path / 'd', config=classifier)
  with pytest.raises(ValueError, match='BertForSequenceClassification'):
    hf.load_hf(path)


def test_missing_config_field_and_bad_activation(exported, tmp_path):
  path = rewrite(exported['gpt'][0], tmp_path / 'a', config=lambda c: c.pop('n_embd'))
  with pytest.raises(ValueError, match="'n_embd'"):
    hf.load_hf(path)
  path = rewrite(exported['bert'][0], tmp_path / 'b',
                 config=lambda c: c.update(hidden_act='silu'))
  with pytest.raises(ValueError, match="hidden_act='silu'"):
    hf.load_hf(path)


def test_missing_weight_file(exported, tmp_path):
  (tmp_path / 'config.json').write_text(open(os.path.join(exported['t5'][0],
                                                          'config.json')).read())
  with pytest.raises(FileNotFoundError, match='model.safetensors'):
    hf.load_hf(str(tmp_path))
  with pytest.raises(FileNotFoundError, match='config.json'):
    hf.load_hf(str(tmp_path / 'nowhere'))


def test_missing_tensor_is_named(exported, tmp_path):
  name = 'bert.encoder.layer.1.output.dense.weight'
  path = rewrite(exported['bert'][0], tmp_path / 'd', tensors=lambda sd: sd.pop(name))
  with pytest.raises(KeyError, match=name.replace('.', r'\.') + r".*layer_1/mlp/wo/kernel"):
    hf.load_hf(path)


def test_shape_mismatch_is_named(exported, tmp_path):
  name = 'transformer.h.0.mlp.c_fc.weight'
  def wrong(sd):
    sd[name] = np.zeros((32, 65), np.float32)
  path = rewrite(exported['gpt'][0], tmp_path / 'd', tensors=wrong)
  with pytest.raises(ValueError, match=name.replace('.', r'\.') + r".*\(32, 65\).*\(32, 64\)"):
    hf.load_hf(path)


def test_unexpected_tensor_is_named(exported, tmp_path):
  def extra(sd):
    sd['classifier.weight'] = np.zeros((2, 32), np.float32)
  path = rewrite(exported['bert'][0], tmp_path / 'd', tensors=extra)
  with pytest.raises(ValueError, match='classifier.weight'):
    hf.load_hf(path)


def test_untied_copy_that_differs_is_rejected(exported, tmp_path):
  def untie(sd):
    sd['cls.predictions.decoder.weight'] = sd['bert.embeddings.word_embeddings.weight'] + 1
  path = rewrite(exported['bert'][0], tmp_path / 'd', tensors=untie)
  with pytest.raises(ValueError, match='cls.predictions.decoder.weight'):
    hf.load_hf(path)
  def tie(sd):  # an equal copy is fine
    sd['cls.predictions.decoder.weight'] = sd['bert.embeddings.word_embeddings.weight']
  _, params, _ = hf.load_hf(rewrite(exported['bert'][0], tmp_path / 'e', tensors=tie))
  assert_same_params(params, exported['bert'][2])


def test_old_bert_names_and_sharded_bf16_safetensors(exported, tmp_path):
  src, _, params = exported['bert']
  sd = load_file(os.path.join(src, 'model.safetensors'))
  old = {k.replace('LayerNorm.weight', 'LayerNorm.gamma').replace('LayerNorm.bias',
                                                                    'LayerNorm.beta'): v
         for k, v in sd.items()}
  names = sorted(old)
  os.makedirs(tmp_path / 'd')
  shards = {'model-00001-of-00002.safetensors': names[:10],
            'model-00002-of-00002.safetensors': names[10:]}
  for shard, keys in shards.items():
    save_file({k: old[k] for k in keys}, str(tmp_path / 'd' / shard), metadata={'format': 'pt'})
  (tmp_path / 'd' / 'model.safetensors.index.json').write_text(json.dumps(
      {'weight_map': {k: s for s, keys in shards.items() for k in keys}}))
  (tmp_path / 'd' / 'config.json').write_text(open(os.path.join(src, 'config.json')).read())
  _, loaded, _ = hf.load_hf(str(tmp_path / 'd'))
  assert_same_params(loaded, params)

  torch = pytest.importorskip('torch')
  from safetensors.torch import save_file as save_torch  # noqa: PLC0415 (torch: this test only)
  os.makedirs(tmp_path / 'bf16')
  save_torch({k: torch.tensor(v).bfloat16() for k, v in sd.items()},
             str(tmp_path / 'bf16' / 'model.safetensors'), metadata={'format': 'pt'})
  (tmp_path / 'bf16' / 'config.json').write_text(open(os.path.join(src, 'config.json')).read())
  _, loaded, _ = hf.load_hf(str(tmp_path / 'bf16'))
  rounded = weights.flatten(params)
  for k, v in weights.flatten(loaded).items():
    assert v.dtype == np.float32
    np.testing.assert_array_equal(v, rounded[k].astype(ml_dtypes.bfloat16).astype(np.float32))


def test_legacy_gpt2_pytorch_bin(exported, tmp_path):
  """GPT2Model-era names (no 'transformer.' prefix), attention-mask buffers and a tied
  lm_head copy, in a pickled pytorch_model.bin."""
  torch = pytest.importorskip('torch')
  src, cfg, params = exported['gpt']
  sd = load_file(os.path.join(src, 'model.safetensors'))
  legacy = {k.removeprefix('transformer.'): torch.tensor(v) for k, v in sd.items()}
  for i in range(cfg.num_layers):
    legacy[f'h.{i}.attn.bias'] = torch.ones(1, 1, 32, 32).tril()
    legacy[f'h.{i}.attn.masked_bias'] = torch.tensor(-1e4)
  legacy['lm_head.weight'] = torch.tensor(sd['transformer.wte.weight'])
  os.makedirs(tmp_path / 'd')
  torch.save(legacy, str(tmp_path / 'd' / 'pytorch_model.bin'))
  (tmp_path / 'd' / 'config.json').write_text(open(os.path.join(src, 'config.json')).read())
  loaded_cfg, loaded, _ = hf.load_hf(str(tmp_path / 'd'))
  assert loaded_cfg == cfg
  assert_same_params(loaded, params)


def test_pytorch_bin_without_torch_says_so(tmp_path, monkeypatch, exported):
  (tmp_path / 'pytorch_model.bin').write_bytes(b'not read')
  (tmp_path / 'config.json').write_text(open(os.path.join(exported['gpt'][0],
                                                          'config.json')).read())
  monkeypatch.setitem(sys.modules, 'torch', None)
  with pytest.raises(ImportError, match='needs torch'):
    hf.load_hf(str(tmp_path))


def test_export_refuses_to_overwrite_and_leaves_nothing_on_failure(exported, tmp_path):
  _, cfg, params = exported['gpt']
  (tmp_path / 'taken').mkdir()
  (tmp_path / 'taken' / 'keep.txt').write_text('mine')
  with pytest.raises(FileExistsError, match='taken'):
    hf.save_hf(str(tmp_path / 'taken'), cfg, params)
  assert os.listdir(tmp_path / 'taken') == ['keep.txt']
  bad = dict(params, wte={'embedding': np.zeros((5, 32), np.float32)})
  with pytest.raises(ValueError, match=r"'wte/embedding'.*\(5, 32\)"):
    hf.save_hf(str(tmp_path / 'new'), cfg, bad)
  assert sorted(os.listdir(tmp_path)) == ['taken']        # no target, no temporary directory
  with pytest.raises(ValueError, match='position_embedding'):
    hf.save_hf(str(tmp_path / 'new'), cfg.replace(position_embedding='sinusoidal'), params)
  assert sorted(os.listdir(tmp_path)) == ['taken']


def test_is_hf_dir_tells_hf_from_workdir(exported, tmp_path):
  assert hf.is_hf_dir(exported['t5'][0])
  (tmp_path / 'config.json').write_text(json.dumps({'model': {'family': 'gpt'}}))
  assert not hf.is_hf_dir(str(tmp_path))
