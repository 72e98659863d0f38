"""One Hugging Face record per family (pretrain_jax.hf.families), and the tokenizer.json a
BERT / GPT-2 run trained with the project's sentencepiece tokenizer exports."""
import json
import os

import modeling
import pytest

import configs
from pretrain_jax import hf, models
from pretrain_jax.data import tokenizer as data_tok
from pretrain_jax.hf import config as hf_config
from pretrain_jax.hf import convert, families

TEXT = ['the quick brown fox jumps over the lazy dog', 'hello world, hello dogs',
        'Tabs\tand ünïcode 42, lower UPPER MiXeD'] * 30
SENTENCES = ['The quick brown fox jumps over the lazy dog.', '  hello,   ünïcode world 42 ',
             'MiXeD\tcase\nand lines']


def test_one_record_per_model_family():
  assert set(families.BY_NAME) == set(models.FAMILIES)
  assert len(families.BY_MODEL_TYPE) == len(families.RECORDS)
  for name in models.FAMILIES:
    cfg = modeling.tiny(name)
    assert families.of(cfg) is families.of(name) is families.BY_NAME[name]
    assert families.of_config_json(hf_config.hf_config_from_model(cfg)).name == name


def run_with_own_tokenizer(tmp_path, family):
  """(workdir, tokenizer path) of a tiny `family` run as if trained with a sentencepiece
  tokenizer of this project (an import whose config.json names it)."""
  cfg = modeling.tiny(family, vocab_size=256)
  src = hf.save_hf(str(tmp_path / 'hf'), cfg, modeling.init(cfg))
  work = tmp_path / 'work'
  convert.import_hf(src, str(work), configs.base_config)
  sp_path = data_tok.train_sentencepiece(TEXT, str(tmp_path / 'sp.model'), vocab_size=256)
  with open(work / 'config.json') as f:
    config = json.load(f)
  config['data']['tokenizer'] = sp_path
  (work / 'config.json').write_text(json.dumps(config))
  return work, sp_path


@pytest.mark.parametrize('family', ['bert', 'gpt'])
def test_sentencepiece_run_exports_a_tokenizer_json(tmp_path, family):
  tr = pytest.importorskip('transformers')
  work, sp_path = run_with_own_tokenizer(tmp_path, family)

  result = convert.export_hf(str(work), str(tmp_path / 'out'))
  assert result['tokenizer_files'] == ['tokenizer.json', 'tokenizer_config.json']
  ours = data_tok.Tokenizer(sp_path)
  fast = tr.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / 'out' / 'tokenizer.json'))
  loaded = hf.load_hf(str(tmp_path / 'out'))[2]
  for text in SENTENCES:
    assert fast.encode(text, add_special_tokens=False) == ours.encode(text), text
    assert loaded.encode(text) == ours.encode(text), text
  roles = ('pad_id', 'cls_id', 'sep_id', 'mask_id') if family == 'bert' else ('pad_id', 'eos_id')
  assert [getattr(loaded, r) for r in roles] == [getattr(ours, r) for r in roles]
  # With special tokens (what HF users and pipelines call): the inputs our BERT trained on
  a, b = SENTENCES[0], SENTENCES[1]
  fast = tr.AutoTokenizer.from_pretrained(str(tmp_path / 'out'))
  pair = fast(a, b)
  if family == 'bert':
    first = [ours.cls_id] + ours.encode(a) + [ours.sep_id]
    assert pair['input_ids'] == first + ours.encode(b) + [ours.sep_id]
    assert pair['token_type_ids'] == [0] * len(first) + [1] * (len(ours.encode(b)) + 1)
    assert fast(a)['input_ids'] == first
  else:
    assert fast(a)['input_ids'] == ours.encode(a)    # GPT-2 adds nothing
  with open(tmp_path / 'out' / 'config.json') as f:
    assert json.load(f)['pad_token_id'] == ours.pad_id


def test_t5_run_exports_spiece_with_its_sentinels_where_hf_puts_them(tmp_path):
  """A tokenizer trained here ends with ▁<extra_id_99> ... ▁<extra_id_0> as pieces;
  transformers' T5Tokenizer adds 100 <extra_id_N> after the pieces of spiece.model. The export
  drops the pieces, so HF's sentinels get the ids the run trained with and len(tokenizer) is the
  model's vocabulary (it was 100 more, the sentinels past the embedding), and the export loads
  back here."""
  tr = pytest.importorskip('transformers')
  work, sp_path = run_with_own_tokenizer(tmp_path, 't5')
  assert not (work / 'hf_tokenizer').exists()    # (an imported one would be exported as is)

  result = convert.export_hf(str(work), str(tmp_path / 'out'))
  assert result['tokenizer_files'] == ['spiece.model']
  ours = data_tok.Tokenizer(sp_path)
  theirs = tr.T5Tokenizer.from_pretrained(str(tmp_path / 'out'))
  assert len(theirs) == ours.vocab_size == 256
  for i in (0, 1, 99):
    assert theirs.convert_tokens_to_ids(f'<extra_id_{i}>') == ours.sentinel_id(i)
  loaded = hf.load_hf(str(tmp_path / 'out'))[2]
  assert [loaded.sentinel_id(i) for i in (0, 99)] == [ours.sentinel_id(i) for i in (0, 99)]
  for text in SENTENCES:
    assert theirs.encode(text, add_special_tokens=False) == ours.encode(text), text
    assert loaded.encode(text) == ours.encode(text), text


def test_bpe_sentencepiece_is_not_converted(tmp_path):
  sp_path = data_tok.train_sentencepiece(TEXT, str(tmp_path / 'sp.model'), vocab_size=256,
                                         model_type='bpe')
  assert families.of('gpt').from_sentencepiece(sp_path) == {}
  assert os.path.isfile(sp_path)
