"""HF directory <-> training workdir (pretrain_jax.hf.convert, pretrain-jax convert_hf)."""
import json
import os
import shutil

import commands
import modeling
import numpy as np
import pytest
import sentencepiece as spm
import tokenizers

import configs
import pretrain_jax
from configs import gpt2_small
from pretrain_jax import hf
from pretrain_jax.hf import convert as workdir_lib
from pretrain_jax.hf import weights
from pretrain_jax.models import ModelConfig
from pretrain_jax.run import checkpoint

TEXT = ['the quick brown fox jumps over the lazy dog', 'hello world, hello dogs'] * 30


def hf_dir_with_tokenizer(path, family):
  """A tiny HF directory of `family` written by our exporter, with tokenizer files."""
  cfg = modeling.tiny(family, vocab_size=256 if family == 't5' else 300)
  hf.save_hf(str(path), cfg, modeling.init(cfg))
  if family == 'gpt':
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXT, vocab_size=300, min_frequency=1,
                            special_tokens=['<|endoftext|>'])
    bpe.save_model(str(path))
  else:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXT), model_prefix=str(path / 'spiece'), vocab_size=40,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False, minloglevel=2)
  return str(path)


def same_params(a, b):
  fa, fb = weights.flatten(a), weights.flatten(b)
  return sorted(fa) == sorted(fb) and all(np.array_equal(fa[k], np.asarray(fb[k])) for k in fa)


@pytest.mark.parametrize('family', ['gpt', 't5'])
def test_import_then_export_through_a_workdir(tmp_path, family):
  src = hf_dir_with_tokenizer(tmp_path / 'hf', family)
  cfg, params, tokenizer = hf.load_hf(src)
  work = str(tmp_path / 'work')
  summary = workdir_lib.import_hf(src, work, configs.base_config)
  assert summary['family'] == family and summary['params'] == modeling_count(params)

  config, restored, step = checkpoint.restore_params(work)
  assert step == 0
  assert ModelConfig.from_config(config.model) == cfg
  assert config.data.seq_len == cfg.max_len == 32   # the base config's 512 / 128 would not fit
  assert same_params(params, restored)
  assert os.path.isdir(os.path.join(work, 'hf_tokenizer'))
  if family == 't5':  # the project's sentencepiece Tokenizer reads the copied model
    assert config.data.tokenizer == os.path.join(work, 'tokenizer.model')
    assert os.path.isfile(config.data.tokenizer)

  out = str(tmp_path / 'export')
  result = workdir_lib.export_hf(work, out)
  assert result['step'] == 0
  files = sorted(os.listdir(out))
  assert 'model.safetensors' in files and 'config.json' in files
  assert ('spiece.model' if family == 't5' else 'merges.txt') in files
  cfg2, params2, tokenizer2 = hf.load_hf(out)
  assert cfg2 == cfg and same_params(params, params2)
  assert tokenizer2.encode('the lazy dogs') == tokenizer.encode('the lazy dogs')
  assert (tokenizer2.pad_id, tokenizer2.eos_id) == (tokenizer.pad_id, tokenizer.eos_id)


def modeling_count(params) -> int:
  return sum(int(np.size(v)) for v in weights.flatten(params).values())


def test_train_flags_rebuild_the_imported_model(tmp_path):
  """The printed pretrain-jax train flags applied to the base config give the imported model."""
  src = hf_dir_with_tokenizer(tmp_path / 'hf', 'gpt')
  summary = workdir_lib.import_hf(src, str(tmp_path / 'work'), configs.base_config)
  config = gpt2_small.get_config()
  for flag in summary['train_flags']:
    key, value = flag.removeprefix('--config.').split('=')
    section, name = key.split('.')
    config[section][name] = type(config[section][name])(value)
  assert ModelConfig.from_config(config.model) == hf.load_hf(src)[0]


def test_import_is_all_or_nothing(tmp_path):
  src = hf_dir_with_tokenizer(tmp_path / 'hf', 'gpt')
  (tmp_path / 'taken').mkdir()
  (tmp_path / 'taken' / 'notes.txt').write_text('mine')
  with pytest.raises(FileExistsError, match='taken'):
    workdir_lib.import_hf(src, str(tmp_path / 'taken'), configs.base_config)
  assert os.listdir(tmp_path / 'taken') == ['notes.txt']
  with pytest.raises(FileNotFoundError, match='config.json not found'):
    workdir_lib.import_hf(str(tmp_path / 'taken'), str(tmp_path / 'w'), configs.base_config)
  # a failure after writing has begun (here: a checkpoint write error) removes everything

  def broken(*a, **k):
    raise OSError('disk full')
  original = checkpoint.Checkpointer.save
  checkpoint.Checkpointer.save = broken
  try:
    with pytest.raises(OSError, match='disk full'):
      workdir_lib.import_hf(src, str(tmp_path / 'w'), configs.base_config)
  finally:
    checkpoint.Checkpointer.save = original
  assert sorted(os.listdir(tmp_path)) == ['hf', 'taken']


def test_cli_import_scan_layers_and_export(tmp_path):
  cfg = modeling.tiny('bert', nsp=True)
  params = modeling.init(cfg)
  src = hf.save_hf(str(tmp_path / 'hf'), cfg, params)
  def run(*args):
    return commands.run('convert_hf', *args)
  done = run('import', f'--hf_dir={src}', f'--workdir={tmp_path / "work"}', '--scan_layers')
  assert done.returncode == 0, done.stderr[-2000:]
  assert json.loads(done.stdout.strip().splitlines()[-1])['family'] == 'bert'
  assert f'imported {src}: a bert of ' in done.stderr   # the summary, for a person
  with open(tmp_path / 'work' / 'config.json') as f:
    assert json.load(f)['model']['scan_layers'] is True
  done = run('export', f'--workdir={tmp_path / "work"}', f'--hf_dir={tmp_path / "out"}')
  assert done.returncode == 0, done.stderr[-2000:]
  assert f'exported step 0 of {tmp_path / "work"} (bert) to {tmp_path / "out"}' in done.stderr
  cfg2, params2, _ = hf.load_hf(str(tmp_path / 'out'))
  assert cfg2 == cfg and same_params(params, params2)
  done = run('frobnicate', f'--workdir={tmp_path}', f'--hf_dir={tmp_path}')
  assert done.returncode != 0 and 'import or export' in done.stderr


def test_a_fine_tune_from_a_hugging_face_directory_keeps_its_tokenizer(tmp_path):
  """The fine-tuned workdir holds the tokenizer files (hf_tokenizer/), so it loads after the
  Hugging Face directory it started from is gone."""
  src = hf_dir_with_tokenizer(tmp_path / 'hf', 'gpt')
  ft = str(tmp_path / 'ft')
  modeling.two_step_finetune(src, ft)
  assert sorted(os.listdir(os.path.join(ft, 'hf_tokenizer'))) == ['merges.txt', 'vocab.json']
  shutil.rmtree(src)
  assert set(pretrain_jax.load_pretrained(ft).predict(['the dog'])) <= {'original', 'shuffled'}
