"""User errors around Hugging Face directories and text use: each is one clear error naming the
bad value (or file) and what was expected, never a library traceback or a silent wrong result.

Models are tiny and random, written by our own exporter; calls are in-process except the CLI
runs (tests/commands.py: the one against the GCS emulator in a process of its own, so its gcsfs
instance dies with it).
"""
import json
import os
import re
import shutil

import commands
import gcs_emulator
import jax
import jax.numpy as jnp
import ml_collections
import modeling
import pytest
import sentencepiece as spm

import configs
import pretrain_jax
from configs import finetune as finetune_config
from configs import tiny_bert
from pretrain_jax import data, hf
from pretrain_jax.data import tokenizer as data_tok
from pretrain_jax.data.config import DataConfig
from pretrain_jax.finetune import run as run_lib
from pretrain_jax.hf import convert
from pretrain_jax.run import checkpoint as ckpt_lib
from pretrain_jax.run import loop
from pretrain_jax.run import workdir as train_workdir
from pretrain_jax.run import workdir as workdir_lib
from pretrain_jax.training import optimizer as opt_lib
from pretrain_jax.training import state as state_lib
from pretrain_jax.training.config import TrainConfig

WORDS = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'the', 'quick', 'brown', 'fox', 'dog']
TEXT = ['the quick brown fox jumps over the lazy dog', 'hello world, hello dogs'] * 30


@pytest.fixture(scope='module')
def dirs(tmp_path_factory):
  """name -> path: a BERT HF dir with vocab.txt ('bert'), the same without ('bert_notok'), and a
  fine-tuned GPT classifier workdir ('classifier', labels neg / pos, a fitting tokenizer)."""
  root = tmp_path_factory.mktemp('hfu')
  cfg = modeling.tiny('bert', vocab_size=40)
  out = {'bert': hf.save_hf(str(root / 'bert'), cfg, modeling.init(cfg)),
         'bert_notok': hf.save_hf(str(root / 'bert_notok'), cfg, modeling.init(cfg, seed=1))}
  words = WORDS + [f'w{i}' for i in range(40 - len(WORDS))]
  (root / 'bert' / 'vocab.txt').write_text('\n'.join(words) + '\n')
  out['classifier'] = classifier_workdir(root)
  return out


def classifier_workdir(root) -> str:
  """A workdir as pretrain-jax finetune leaves it: model.num_classes, task.labels, GPT's `score`."""
  sp_path = data_tok.train_sentencepiece(TEXT, str(root / 'sp.model'), vocab_size=256)
  cfg = modeling.tiny('gpt', vocab_size=data_tok.Tokenizer(sp_path).vocab_size, num_classes=2)
  params = jax.tree.map(jnp.asarray, modeling.init(cfg))
  config = convert.training_config(cfg, configs.base_config(cfg)[1])
  config.data.tokenizer = sp_path
  config.task = ml_collections.ConfigDict({'name': 'toy', 'labels': ['neg', 'pos'],
                                           'metric': 'class_accuracy', 'prefix': ''})
  work = root / 'classifier'
  work.mkdir()
  train_workdir.write_config(config, str(work), config.data.tokenizer, None)
  tx = opt_lib.make_optimizer(TrainConfig.from_config(config.train))
  state = state_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                               opt_state=tx.init(params))
  checkpointer = ckpt_lib.Checkpointer(str(work), keep=0, async_save=False)
  checkpointer.save(0, state, None)
  checkpointer.close()
  return str(work)


def test_fill_mask_on_hf_bert_dir_and_its_import(dirs, tmp_path):
  direct = pretrain_jax.load_pretrained(dirs['bert']).fill_mask('the [MASK] fox', top_k=3)
  assert [len(m['candidates']) for m in direct] == [3]
  work = str(tmp_path / 'work')
  convert.import_hf(dirs['bert'], work, configs.base_config)
  imported = pretrain_jax.load_pretrained(work).fill_mask('the [MASK] fox', top_k=3)
  for a, b in zip(direct[0]['candidates'], imported[0]['candidates'], strict=True):
    assert a['token'] == b['token'] and a['token'] in WORDS + [f'w{i}' for i in range(30)]
    assert a['probability'] == pytest.approx(b['probability'], abs=1e-5)


def test_pretraining_data_refuses_an_hf_tokenizer_directory(dirs, tmp_path):
  """An imported BERT keeps its WordPiece files in hf_tokenizer/; the import's train flags name
  that directory as data.tokenizer. pretrain-jax train reads it (hf.workdir.data_tokenizer,
  tests/test_hf_pretrain.py); data.load_tokenizer, which reads sentencepiece models only, says
  where it is read instead of that the directory 'does not exist'."""
  work = str(tmp_path / 'work')
  summary = convert.import_hf(dirs['bert'], work, configs.base_config)
  flag = f'--config.data.tokenizer={os.path.join(work, "hf_tokenizer")}'
  assert flag in summary['train_flags']
  config = json.load(open(os.path.join(work, 'config.json')))
  with pytest.raises(ValueError, match=r"hf_tokenizer' is a directory"):
    data.load_tokenizer(DataConfig.from_config(config['data']))


def test_fill_mask_top_k_past_the_vocabulary(dirs):
  model = pretrain_jax.load_pretrained(dirs['bert'])
  with pytest.raises(ValueError, match=r'top_k=5000 .*vocabulary size 40'):
    model.fill_mask('the [MASK] fox', top_k=5000)
  with pytest.raises(ValueError, match='top_k=0'):
    model.fill_mask('the [MASK] fox', top_k=0)


def test_tokenizer_with_more_ids_than_the_model_is_refused(tmp_path):
  cfg = modeling.tiny('t5')  # vocab_size 97 < ~40 pieces + 100 sentinels
  src = hf.save_hf(str(tmp_path / 'hf'), cfg, modeling.init(cfg))
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(TEXT), model_prefix=os.path.join(src, 'spiece'), vocab_size=40,
      pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False, minloglevel=2)
  pattern = r'spiece\.model.* has 1[0-9][0-9] ids .*vocab_size=97'
  with pytest.raises(ValueError, match=pattern):
    hf.load_hf(src)
  with pytest.raises(ValueError, match=pattern):
    pretrain_jax.load_pretrained(src)
  with pytest.raises(ValueError, match=pattern):
    convert.import_hf(src, str(tmp_path / 'work'), configs.base_config)
  assert not os.path.exists(tmp_path / 'work')


def test_import_without_tokenizer_warns_and_text_use_refuses(dirs, tmp_path):
  work = str(tmp_path / 'work')
  summary = convert.import_hf(dirs['bert_notok'], work, configs.base_config)
  assert summary['tokenizer'] is None
  assert 'no tokenizer files' in summary['warning'] and 'vocab.txt' in summary['warning']
  with pytest.raises(FileNotFoundError, match=r'no tokenizer files .*hf_tokenizer'):
    pretrain_jax.load_pretrained(work)
  model = pretrain_jax.load_pretrained(dirs['bert_notok'])  # an HF dir: weights are usable
  with pytest.raises(ValueError, match=r'bert_notok has no tokenizer files; fill_mask'):
    model.fill_mask('the [MASK] fox')
  # the tokenizer files copied where the message says make the workdir whole
  os.makedirs(os.path.join(work, 'hf_tokenizer'))
  with open(os.path.join(work, 'hf_tokenizer', 'vocab.txt'), 'w') as f:
    f.write('\n'.join(WORDS + [f'w{i}' for i in range(30)]) + '\n')
  assert pretrain_jax.load_pretrained(work).tokenizer.mask_id == 4


def test_export_refuses_a_classifier(dirs, tmp_path):
  out = str(tmp_path / 'out')
  with pytest.raises(ValueError, match=r"classifier .*'neg', 'pos'.*'score'.*pretrained LM"):
    convert.export_hf(dirs['classifier'], out)
  assert not os.path.exists(out)
  cfg = modeling.tiny('gpt', num_classes=2)
  with pytest.raises(ValueError, match='num_classes=2'):
    hf.save_hf(out, cfg, modeling.init(cfg))
  assert not os.path.exists(out)


def test_generate_refuses_a_classifier(dirs):
  model = pretrain_jax.load_pretrained(dirs['classifier'])
  assert model.predict(['the fox']) in (['neg'], ['pos'])  # what it is for still works
  with pytest.raises(ValueError, match=r'model\.num_classes=\d+.*\bgeneration\b'):
    model.generate(['The'], max_new_tokens=2)
  with pytest.raises(ValueError, match=dirs['classifier']):
    pretrain_jax.inference.generate_text(model, ['The'], max_new_tokens=2)


def test_export_refuses_an_hf_dir(dirs, tmp_path):
  with pytest.raises(ValueError, match=re.escape(dirs['bert'])):
    convert.export_hf(dirs['bert'], str(tmp_path / 'out'))
  assert not os.path.exists(tmp_path / 'out')


def test_broken_hf_dirs_name_the_file(dirs, tmp_path):
  broken = {name: shutil.copytree(dirs['bert'], tmp_path / name)
            for name in ('truncated', 'layers', 'json')}
  with open(broken['truncated'] / 'model.safetensors', 'r+b') as f:
    f.truncate(5000)
  config = json.loads((broken['layers'] / 'config.json').read_text())
  (broken['layers'] / 'config.json').write_text(json.dumps(dict(config, num_hidden_layers=3)))
  (broken['json'] / 'config.json').write_text('{"model_type": "bert",}')
  with pytest.raises(ValueError, match=r'truncated/model\.safetensors cannot be read'):
    hf.load_hf(str(broken['truncated']))
  with pytest.raises(ValueError, match=r"layers: .*no tensor 'bert\.encoder\.layer\.2\..*3 layers"):
    hf.load_hf(str(broken['layers']))
  with pytest.raises(KeyError):  # still a KeyError for callers that caught one
    hf.load_hf(str(broken['layers']))
  for load in (hf.load_hf, pretrain_jax.load_pretrained):
    with pytest.raises(ValueError, match=r'json/config\.json is not valid JSON'):
      load(str(broken['json']))


def test_missing_hf_dir_local_and_gcs(tmp_path):
  with pytest.raises(FileNotFoundError, match=r'nowhere does not exist'):
    convert.import_hf(str(tmp_path / 'nowhere'), str(tmp_path / 'w'), configs.base_config)
  with gcs_emulator.serve() as env:
    done = commands.run('convert_hf', 'import', '--hf_dir=gs://bucket/hf/none',
                        f'--workdir={tmp_path / "x"}', env=dict(os.environ, **env), timeout=120)
  assert done.returncode == 2, done.stderr[-2000:]
  assert done.stderr.strip().splitlines()[-1].startswith(
      'error: gs://bucket/hf/none does not exist'), done.stderr[-2000:]
  assert not os.path.exists(tmp_path / 'x')


def test_evaluate_script_on_an_hf_dir_is_one_clear_error(dirs):
  """It named no data to read: an AttributeError "'data'" from inside the script."""
  done = commands.run('evaluate', '--workdir', dirs['bert'], timeout=300)
  assert done.returncode != 0 and 'Traceback' not in done.stderr, done.stderr
  assert done.stderr.strip().splitlines()[-1].startswith(
      f'error: {dirs["bert"]} is a Hugging Face model directory'), done.stderr


def test_training_in_a_hugging_face_directory_is_refused_before_writing_to_it(dirs):
  """It used to write the LOCK and a tokenizer.model into the user's HF directory, then refuse
  with a 3 KB config diff."""
  before = sorted(os.listdir(dirs['bert']))
  with pytest.raises(ValueError, match=r"Hugging Face model directory .*model_type 'bert'"):
    loop.train_and_evaluate(tiny_bert.get_config(), dirs['bert'])
  assert sorted(os.listdir(dirs['bert'])) == before


def test_fine_tuning_into_a_hugging_face_directory_is_refused_before_writing(dirs):
  c = finetune_config.get_config()
  c.init, c.task.name = dirs['bert'], 'word_order'
  before = sorted(os.listdir(dirs['bert']))
  with pytest.raises(ValueError, match='is a Hugging Face model directory'):
    run_lib.finetune(c, dirs['bert'])
  assert sorted(os.listdir(dirs['bert'])) == before


@pytest.mark.parametrize('saved, is_hf', [
    ({'model_type': 'gpt2', 'n_layer': 2}, True),
    ({'architectures': ['GPT2LMHeadModel']}, True),                # no model_type: still HF
    ({'model': {'family': 'gpt'}, 'train': {'steps': 1}}, False),   # a training workdir
    ({'model_type': 'gpt2', 'train': {'steps': 1}}, False),         # has a train section
    (['not', 'a', 'dict'], False),
])
def test_one_rule_decides_what_a_hugging_face_directory_is(tmp_path, saved, is_hf):
  """The import (hf.is_hf_dir), the workdir check and evaluate.py used three different rules
  (an `architectures`-only config.json was HF to one and not to another)."""
  (tmp_path / 'config.json').write_text(json.dumps(saved))
  assert hf.is_hf_dir(str(tmp_path)) is is_hf
  if is_hf:
    with pytest.raises(ValueError, match='is a Hugging Face model directory'):
      workdir_lib.check_not_foreign(str(tmp_path))
  else:
    workdir_lib.check_not_foreign(str(tmp_path))
