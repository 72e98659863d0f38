"""Pre-training on from an imported Hugging Face model with its own tokenizer (GPT-2's byte-level
BPE, BERT's WordPiece): pretrain-jax train reads the workdir's hf_tokenizer/, the run starts from
the imported weights, and evaluation reads the data the way training did.

Tiny random models written by our exporter; tokenizers trained here by `tokenizers` on the
embedded corpus (no downloads).
"""
import json
import os
import shutil

import commands
import helpers
import ml_collections
import modeling
import numpy as np
import pytest
import tokenizers
from helpers import ROOT

import configs
import pretrain_jax
from pretrain_jax import data, hf
from pretrain_jax.data import corpus
from pretrain_jax.data import tokenizer as data_tok
from pretrain_jax.data.config import DataConfig
from pretrain_jax.hf import convert as hf_workdir
from pretrain_jax.hf import weights
from pretrain_jax.objectives import mlm
from pretrain_jax.run import checkpoint as ckpt_lib
from pretrain_jax.run import loop
from pretrain_jax.run import workdir as train_workdir

VOCAB = 320
LR = 1e-4
STEPS = 3


def texts():
  return corpus.embedded_documents()[:300]


def hf_dir(path, family: str) -> str:
  """A tiny HF `family` model directory with tokenizer files trained on the embedded corpus."""
  if family == 'gpt':
    tok = tokenizers.ByteLevelBPETokenizer()
    tok.train_from_iterator(texts(), vocab_size=VOCAB, special_tokens=['<|endoftext|>'])
  else:
    tok = tokenizers.BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(texts(), vocab_size=VOCAB)
  cfg = modeling.tiny(family, vocab_size=tok.get_vocab_size(), max_len=32,
                      **({'nsp': True} if family == 'bert' else {}))
  hf.save_hf(str(path), cfg, modeling.init(cfg, seed=7))   # not what a run would draw
  tok.save_model(str(path))
  return str(path)


def short_run(config: dict) -> dict:
  """`config` (a workdir's config.json) trimmed to a few steps on the embedded corpus."""
  config = ml_collections.ConfigDict(config)
  config.train.update(batch_size=4, steps=STEPS, warmup_steps=1, learning_rate=LR,
                      log_every=1, eval_every=STEPS, eval_batches=1, checkpoint_every=STEPS)
  config.data.update(tfds_name='', files='', validation_fraction=0.05)
  return config


def max_change(a, b) -> float:
  fa, fb = weights.flatten(a), weights.flatten(b)
  assert sorted(fa) == sorted(fb)
  return max(float(np.max(np.abs(np.asarray(fa[k]) - np.asarray(fb[k])))) for k in fa)


@pytest.mark.slow   # import, then pre-train end to end
def test_gpt2_bpe_import_pretrains_on_through_train_py(module_cache, tmp_path):
  """The README's flow: convert_hf.py import, then pretrain-jax train with the printed flags (its
  data.tokenizer is the workdir's hf_tokenizer/, which the sentencepiece pipeline refused)."""
  src = hf_dir(tmp_path / 'hf', 'gpt')
  work = str(tmp_path / 'work')
  summary = hf_workdir.import_hf(src, work, configs.base_config)
  assert f'--config.data.tokenizer={os.path.join(work, "hf_tokenizer")}' in summary['train_flags']
  run = short_run(json.load(open(os.path.join(work, 'config.json'))))
  flags = summary['train_flags'] + [
      f'--config.train.{k}={run.train[k]}' for k in
      ('batch_size', 'steps', 'warmup_steps', 'learning_rate', 'log_every', 'eval_every',
       'eval_batches', 'checkpoint_every')] + [
      "--config.data.tfds_name=", "--config.data.validation_fraction=0.05"]
  done = commands.run('train', '--config', os.path.join(ROOT, 'configs', 'gpt2_small.py'),
                      '--workdir', work, *flags, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert (result['start_step'], result['step']) == (0, STEPS) and np.isfinite(result['train_loss'])

  # It trained from the imported weights: Adam moves a parameter by about the learning rate per
  # step, while a fresh initialisation differs from the import by ~0.1.
  imported = hf.load_hf(src)[1]
  config, trained, step = ckpt_lib.restore_params(work)
  assert step == STEPS
  assert 0 < max_change(imported, trained) < 3 * STEPS * LR
  # The training-time evaluation and pretrain-jax evaluate's way (load_pretrained's tokenizer
  # into the pipeline) read the same tokens: the same numbers.
  with open(os.path.join(work, 'metrics.jsonl')) as f:
    logged = [json.loads(line) for line in f if '"eval"' in line][-1]
  model = pretrain_jax.load_pretrained(work)
  assert type(model.tokenizer).__name__ == 'HFTokenizer'
  batches = data.make_dataset(model.data_config, model.tokenizer, split='validation',
                              batch_size=run.train.batch_size, repeat=False,
                              model_max_len=model.model_config.max_len)
  metrics = model.evaluate(batches, 1)
  for name in ('loss', 'lm_loss', 'lm_accuracy'):
    assert metrics[name] == pytest.approx(logged[name], abs=1e-5), name
  assert config.data.tokenizer == os.path.join(work, 'hf_tokenizer')


@pytest.mark.slow   # import, then pre-train end to end
def test_bert_wordpiece_import_pretrains_with_whole_word_masking_and_nsp(module_cache, tmp_path):
  """In-process (train.py's few lines: hf.workdir.data_tokenizer, then the loop). WordPiece
  gives word boundaries ('##' continues a word), so whole-word masking needs no sentencepiece
  model; NSP reads [CLS] / [SEP] from the tokenizer. The import's checkpoint 0 holds weights
  nothing trained, so the run brings its own optimizer (Adafactor here, where the import wrote
  AdamW's fresh state); a changed model is still refused."""
  src = hf_dir(tmp_path / 'hf', 'bert')
  work = str(tmp_path / 'work')
  hf_workdir.import_hf(src, work, configs.base_config)
  config = short_run(json.load(open(os.path.join(work, 'config.json'))))
  config.data.update(whole_word_mask=True, nsp=True)
  config.train.optimizer = 'adafactor'
  other = ml_collections.ConfigDict(config.to_dict())
  other.model.num_layers = 1
  with pytest.raises(ValueError, match=r'model\.num_layers: 2 -> 1'):
    train_workdir.check_config(other, work, untrained=True)
  # how the weights run may change on an import (it writes float32, no remat); what they are
  # may not (above)
  config.model.update(remat='full', dropout_rate=0.0)
  tokenizer = hf_workdir.data_tokenizer(config, work)
  assert type(tokenizer).__name__ == 'HFTokenizer'
  result = loop.train_and_evaluate(config, work, tokenizer=tokenizer)
  assert (result['start_step'], result['step']) == (0, STEPS) and np.isfinite(result['train_loss'])
  history = sorted(os.listdir(os.path.join(work, 'config_history')))
  assert history == ['0_step0.json', '1_step0.json'], history   # the import's, then the run's
  first = ckpt_lib.restore_params(work)[1]
  # The first trained checkpoint damaged: it is moved aside and the run starts again from the
  # import's weights (the restore once fell back to checkpoint 0 as if it held a training state
  # and crashed on its missing data position), so it trains the same steps to the same weights.
  for path in modeling.data_files(work, STEPS):
    helpers.flip_bytes(path)
  again = loop.train_and_evaluate(config, work, tokenizer=tokenizer)
  assert (again['start_step'], again['step']) == (0, STEPS)
  aside = os.listdir(os.path.join(work, 'checkpoints'))
  assert any(n.startswith(f'{STEPS}.corrupt-') for n in aside), aside
  assert max_change(first, ckpt_lib.restore_params(work)[1]) == 0
  # From the imported weights: 3 small Adafactor steps move no parameter by 0.01, while the
  # model's own random initialisation lies >= 0.05 away from them somewhere.
  imported, trained = hf.load_hf(src)[1], ckpt_lib.restore_params(work)[1]
  assert 0 < max_change(imported, trained) < 0.01
  assert max_change(imported, modeling.init(hf.load_hf(src)[0])) > 0.05


def test_wordpiece_word_starts_and_whole_words_masked_together(tmp_path):
  """The WordPiece adapter's word_start is False exactly on '##' pieces; with it, MLM's
  whole-word selection takes a word's pieces together (never a '##' piece without its head)."""
  tok = hf.load_tokenizer(hf_dir(tmp_path / 'hf', 'bert'), 'bert')
  vocab = tok.tok.get_vocab()
  starts = data_tok.id_tables(tok).word_start
  assert starts is not None and starts.shape == (tok.vocab_size,)
  assert all(starts[i] == (not piece.startswith('##')) for piece, i in vocab.items())
  assert (~starts).sum() > 20   # the corpus made continuation pieces to test with
  ids = np.array([tok.encode(t)[:64] for t in texts()[:64] if len(tok.encode(t)) >= 64])
  tables = data_tok.id_tables(tok)
  out = mlm.mask_tokens(ids, np.random.default_rng(0), selectable=~tables.special[ids],
                        random_ids=tables.ordinary_ids, mask_id=tok.mask_id, probability=0.3,
                        word_starts=tables.word_start[ids])
  selected = out['selected']
  continuing = ~tables.word_start[ids]
  continuing[:, 0] = False
  # a continuing piece is selected exactly when the piece before it is
  assert np.array_equal(selected[:, 1:][continuing[:, 1:]], selected[:, :-1][continuing[:, 1:]])
  assert selected[continuing].sum() > 10


def test_bpe_has_no_word_starts_and_mlm_over_it_is_refused_naming_why(module_cache, tmp_path):
  """Byte-level BPE marks word starts with 'Ġ' except at a text's start: no word-start table.
  GPT-2's tokenizer has no [MASK], so BERT's objective over it is one clear error."""
  tok = hf.load_tokenizer(hf_dir(tmp_path / 'hf', 'gpt'), 'gpt')
  assert data_tok.id_tables(tok).word_start is None
  config = short_run(configs.base_config(None, 'bert_base')[1].to_dict())
  config.data.update(whole_word_mask=True, seq_len=32)
  with pytest.raises(ValueError, match=r'gpt tokenizer .*merges\.txt.*mask'):
    data.make_dataset(DataConfig.from_config(config.data), tok, split='train', batch_size=4)


def test_the_tokenizer_a_workdir_was_imported_with_is_the_one_it_trains_with(tmp_path):
  """data.tokenizer is a free key (a moved copy of the same files must resume), so the files
  are compared: another tokenizer directory, or a sentencepiece model instead, is refused; a
  named hf_tokenizer/ without the family's files is an error, not a fall back to the
  workdir's own."""
  src = hf_dir(tmp_path / 'hf', 'gpt')
  work = str(tmp_path / 'work')
  hf_workdir.import_hf(src, work, configs.base_config)
  config = ml_collections.ConfigDict(json.load(open(os.path.join(work, 'config.json'))))
  copy = str(tmp_path / 'moved' / 'hf_tokenizer')
  shutil.copytree(os.path.join(work, 'hf_tokenizer'), copy)
  config.data.tokenizer = copy
  assert hf_workdir.data_tokenizer(config, work).encode('the list') == hf.load_tokenizer(
      src, 'gpt').encode('the list')
  with open(os.path.join(copy, 'merges.txt'), 'a') as f:
    f.write('x y\n')
  with pytest.raises(ValueError, match=r'tokenizer .*moved/hf_tokenizer differs'):
    hf_workdir.data_tokenizer(config, work)
  config.data.tokenizer = ''
  with pytest.raises(ValueError, match=r'data\.tokenizer is empty'):
    hf_workdir.data_tokenizer(config, work)
  other = tmp_path / 'other' / 'hf_tokenizer'
  other.mkdir(parents=True)
  (other / 'spiece.model').write_bytes(b'not a gpt tokenizer')
  config.data.tokenizer = str(other)
  with pytest.raises(FileNotFoundError, match=r"no gpt tokenizer .*\['spiece.model'\]"):
    hf_workdir.data_tokenizer(config, str(tmp_path / 'fresh'))
