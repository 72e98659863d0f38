"""Logit parity with transformers' PyTorch models: import, export -> from_pretrained, round trip.

Each family's tiny random HF model is built once per module (every weight perturbed, so norms
and biases are not their trivial init and a swapped tensor shows up in the logits).
"""
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from pretrain_jax import hf
from pretrain_jax.hf import weights
from pretrain_jax.models import build

torch = pytest.importorskip('torch')
tr = pytest.importorskip('transformers')

TOL = 1e-4
VOCAB = 99


def perturbed(model, seed=0):
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(torch.randn(p.shape, generator=gen) * 0.05)
  return model.eval()


def hf_models():
  """name -> (transformers model, its HF class)."""
  torch.manual_seed(0)
  bert = tr.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
                       type_vocab_size=3)
  gpt = tr.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                      bos_token_id=1, eos_token_id=1)
  t5 = dict(vocab_size=VOCAB, d_model=32, d_kv=6, d_ff=37, num_layers=2, num_decoder_layers=3,
            num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20)
  return {
      'bert': perturbed(tr.BertForPreTraining(bert)),
      'bert_mlm': perturbed(tr.BertForMaskedLM(bert)),
      'gpt': perturbed(tr.GPT2LMHeadModel(gpt)),
      't5_v1_0': perturbed(tr.T5ForConditionalGeneration(tr.T5Config(**t5))),
      't5_v1_1': perturbed(tr.T5ForConditionalGeneration(tr.T5Config(
          **t5, feed_forward_proj='gated-gelu', tie_word_embeddings=False))),
  }


@pytest.fixture(scope='module')
def hf_dirs(tmp_path_factory):
  """name -> directory of a saved tiny HF model (T5 v1.1 with its own LM head)."""
  out = {}
  for name, model in hf_models().items():
    path = str(tmp_path_factory.mktemp(name))
    model.save_pretrained(path)
    if name == 't5_v1_1':  # transformers 5 ties T5's head; a real v1.1 checkpoint has its own
      tensors = load_file(path + '/model.safetensors')
      tensors['lm_head.weight'] = np.random.default_rng(1).normal(
          size=tensors['shared.weight'].shape).astype(np.float32)
      save_file(tensors, path + '/model.safetensors', metadata={'format': 'pt'})
    out[name] = path
  return out


def batch():
  rng = np.random.default_rng(0)
  ids = rng.integers(3, VOCAB, (2, 10))
  mask = np.ones((2, 10), np.int64)
  mask[1, 6:] = 0                                       # tail padding in row 1
  return dict(ids=ids, mask=mask, token_types=rng.integers(0, 3, (2, 10)),
              dec=np.concatenate([np.zeros((2, 1), np.int64), rng.integers(3, VOCAB, (2, 6))],
                                 axis=1))


def hf_logits(model, b) -> list:
  def t(x):
    return torch.tensor(x)
  with torch.no_grad():
    if isinstance(model, tr.BertForPreTraining):
      o = model(input_ids=t(b['ids']), attention_mask=t(b['mask']),
                token_type_ids=t(b['token_types']))
      return [o.prediction_logits.numpy(), o.seq_relationship_logits.numpy()]
    if isinstance(model, tr.BertForMaskedLM):
      return [model(input_ids=t(b['ids']), attention_mask=t(b['mask']),
                    token_type_ids=t(b['token_types'])).logits.numpy()]
    if isinstance(model, tr.GPT2LMHeadModel):
      return [model(input_ids=t(b['ids']), attention_mask=t(b['mask'])).logits.numpy()]
    return [model(input_ids=t(b['ids']), attention_mask=t(b['mask']),
                  decoder_input_ids=t(b['dec'])).logits.numpy()]


def our_logits(cfg, params, b) -> list:
  model = build(cfg)
  seg = b['mask'].astype(np.int32)
  if cfg.family == 'bert':
    mlm, nsp = model.apply({'params': params}, b['ids'], token_type_ids=b['token_types'],
                           segment_ids=seg)
    return [np.asarray(mlm)] + ([np.asarray(nsp)] if cfg.nsp else [])
  if cfg.family == 'gpt':
    return [np.asarray(model.apply({'params': params}, b['ids'], segment_ids=seg))]
  return [np.asarray(model.apply({'params': params}, b['ids'], b['dec'],
                                 encoder_segment_ids=seg))]


def max_diff(family, ours, ref, mask) -> float:
  """Largest |difference| over real positions (T5: every decoder position; NSP: every row)."""
  diffs = []
  for a, r in zip(ours, ref, strict=True):
    assert a.shape == r.shape
    real = mask.astype(bool) if family in ('bert', 'gpt') and a.ndim == 3 else Ellipsis
    diffs.append(float(np.abs(a[real] - r[real]).max()))
  return max(diffs)


@pytest.fixture(scope='module')
def reference(hf_dirs):
  """name -> HF logits of the model loaded back from its directory."""
  b = batch()
  classes = {'bert': tr.BertForPreTraining, 'bert_mlm': tr.BertForMaskedLM,
             'gpt': tr.GPT2LMHeadModel, 't5_v1_0': tr.T5ForConditionalGeneration,
             't5_v1_1': tr.T5ForConditionalGeneration}
  return {name: hf_logits(classes[name].from_pretrained(path).eval(), b)
          for name, path in hf_dirs.items()}


EXPECTED = {  # name -> ModelConfig fields the import must produce
    'bert': dict(family='bert', nsp=True, activation='gelu', type_vocab_size=3, max_len=64,
                 head_dim=8, mlp_dim=37, layer_norm_eps=1e-12),
    'bert_mlm': dict(family='bert', nsp=False),
    'gpt': dict(family='gpt', activation='gelu_tanh', mlp_dim=128, layer_norm_eps=1e-5),
    't5_v1_0': dict(family='t5', activation='relu', tie_embeddings=True, num_decoder_layers=3,
                    head_dim=6, relative_buckets=8, relative_max_distance=20),
    't5_v1_1': dict(family='t5', activation='gated-gelu', tie_embeddings=False),
}


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_import_matches_transformers(hf_dirs, reference, name):
  cfg, params, _ = hf.load_hf(hf_dirs[name])
  for field, value in EXPECTED[name].items():
    assert getattr(cfg, field) == value, field
  b = batch()
  diff = max_diff(cfg.family, our_logits(cfg, params, b), reference[name], b['mask'])
  print(f'{name}: max |logit difference| = {diff:.3g}')
  assert diff <= TOL


def test_padding_is_not_compared_blindly(hf_dirs, reference):
  """The padded positions of BERT differ (HF computes garbage rows, ours zeros); the check
  above must therefore be restricted to real positions, and a perturbed weight must show."""
  cfg, params, _ = hf.load_hf(hf_dirs['bert'])
  b = batch()
  params['layer_1']['output_norm']['bias'] = params['layer_1']['output_norm']['bias'] + 1e-2
  assert max_diff('bert', our_logits(cfg, params, b), reference['bert'], b['mask']) > TOL


@pytest.mark.parametrize('name', ['bert', 'gpt', 't5_v1_0', 't5_v1_1'])
def test_export_loads_in_transformers_with_same_logits(hf_dirs, reference, tmp_path, name):
  cfg, params, _ = hf.load_hf(hf_dirs[name])
  out = hf.save_hf(str(tmp_path / 'export'), cfg, params)
  model = tr.AutoModelForPreTraining.from_pretrained(out) if name == 'bert' else (
      tr.AutoModelForSeq2SeqLM.from_pretrained(out) if name.startswith('t5')
      else tr.AutoModelForCausalLM.from_pretrained(out))
  b = batch()
  diff = max_diff(cfg.family, hf_logits(model.eval(), b), reference[name], b['mask'])
  assert diff <= TOL


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_import_export_import_is_bit_identical(hf_dirs, tmp_path, name):
  cfg, params, _ = hf.load_hf(hf_dirs[name])
  cfg2, params2, _ = hf.load_hf(hf.save_hf(str(tmp_path / 'export'), cfg, params))
  assert cfg2 == cfg
  flat, flat2 = weights.flatten(params), weights.flatten(params2)
  assert sorted(flat) == sorted(flat2)
  for path, value in flat.items():
    assert value.dtype == flat2[path].dtype == np.float32
    assert np.array_equal(value, flat2[path]), path


@pytest.mark.parametrize('name', ['gpt', 't5_v1_1'])
def test_scan_layout_imports_and_exports(hf_dirs, reference, tmp_path, name):
  cfg, params, _ = hf.load_hf(hf_dirs[name], scan_layers=True)
  stacked = params['h'] if name == 'gpt' else params['decoder']['layers']
  assert weights.flatten(stacked)['mlp/wo/kernel'].shape[0] == (2 if name == 'gpt' else 3)
  b = batch()
  assert max_diff(cfg.family, our_logits(cfg, params, b), reference[name], b['mask']) <= TOL
  _, unrolled, _ = hf.load_hf(hf.save_hf(str(tmp_path / 'export'), cfg, params))
  _, original, _ = hf.load_hf(hf_dirs[name])
  for path, value in weights.flatten(original).items():
    assert np.array_equal(value, weights.flatten(unrolled)[path]), path


def test_t5_head_tied_but_unscaled_is_copied(tmp_path):
  """transformers 5 builds a 'v1.1' T5 with its head tied to `shared` but no output scaling;
  ours has no such mode, so the import keeps an untied copy and the logits still agree."""
  torch.manual_seed(0)
  model = perturbed(tr.T5ForConditionalGeneration(tr.T5Config(
      vocab_size=VOCAB, d_model=16, d_kv=4, d_ff=24, num_layers=1, num_heads=4,
      feed_forward_proj='gated-gelu', tie_word_embeddings=False)))
  model.save_pretrained(str(tmp_path))
  cfg, params, _ = hf.load_hf(str(tmp_path))
  assert not cfg.tie_embeddings
  np.testing.assert_array_equal(params['decoder']['lm_head']['kernel'],
                                params['shared']['embedding'].T)
  b = batch()
  assert max_diff('t5', our_logits(cfg, params, b), hf_logits(model, b), b['mask']) <= TOL
