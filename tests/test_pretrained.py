"""Using checkpoints: load_pretrained, evaluate (deterministic, CLI), generate, fill_mask."""
import json
import os
import shutil
import subprocess
import sys

import commands
import jax
import ml_collections
import modeling
import numpy as np
import optax
import pytest
from helpers import ROOT
from modeling import small

import pretrain_jax
from configs import tiny_t5
from pretrain_jax import data, inference
from pretrain_jax.cli import terminal
from pretrain_jax.data import corpus
from pretrain_jax.finetune import transfer
from pretrain_jax.inference import load, sampling
from pretrain_jax.models import build
from pretrain_jax.objectives import mlm
from pretrain_jax.run import loop
from pretrain_jax.training import evaluate as eval_lib
from pretrain_jax.training import task

# gpt_workdir: a small GPT trained 6 steps, bert_nsp_workdir: a small BERT with NSP trained 3
# steps, once per session (tests/conftest.py).


@pytest.fixture(scope='module', autouse=True)
def cache(gpt_workdir):
  """PRETRAIN_JAX_CACHE for this module: gpt_workdir's, so the runs and commands here find the
  tokenizer and the prepared corpus already there."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv('PRETRAIN_JAX_CACHE', f'{gpt_workdir}_cache')
    yield f'{gpt_workdir}_cache'


def _logged_eval_loss(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  return [r for r in rows if r['split'] == 'eval'][-1]['loss']


def test_api_reproduces_the_logged_eval_loss_and_evaluate_is_deterministic(gpt_workdir):
  model = pretrain_jax.load_pretrained(gpt_workdir)
  assert model.family == 'gpt' and model.step == 6
  def batches():
    return data.make_dataset(model.data_config, model.tokenizer,
                             split=model.data_config.eval_split,
                             batch_size=model.config.train.batch_size, repeat=False)
  metrics = model.evaluate(batches(), max_batches=1)
  assert metrics['loss'] == pytest.approx(_logged_eval_loss(gpt_workdir), abs=1e-5)
  # The call API gives the same loss from logits.
  batch = next(batches())
  logits = np.asarray(model(batch['inputs'], attention_mask=batch['segment_ids'] > 0),
                      np.float64)
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                                                                            keepdims=True)) \
      - logits.max(-1, keepdims=True)
  nll = -np.take_along_axis(logp, batch['targets'][..., None], -1)[..., 0]
  w = batch['loss_weights']
  assert float((nll * w).sum() / w.sum()) == pytest.approx(metrics['loss'], abs=1e-4)
  # The CLI prints the same numbers, twice: a compact last line on stdout (it printed nothing
  # readable once), a summary on stderr. Once in a fresh process, once forked from
  # tests/commands.py's server: two processes, each with its own hash seed.
  args = ['--workdir', gpt_workdir, '--batches', '1']
  done = [subprocess.run([sys.executable, '-m', 'pretrain_jax.commands.evaluate', *args],
                         capture_output=True, text=True, check=True, env=dict(os.environ)),
          commands.run('evaluate', *args)]
  assert done[1].returncode == 0, done[1].stderr[-3000:]
  lines = [d.stdout.strip().splitlines()[-1] for d in done]
  assert len(lines[0].encode()) < terminal.LINE_BYTES
  runs = [json.loads(line) for line in lines]
  assert runs[0] == runs[1]
  assert runs[0]['loss'] == pytest.approx(metrics['loss'], abs=1e-6)
  line = runs[0]
  assert {'family', 'workdir', 'step', 'split', 'random_init', 'batches', 'target_tokens',
          'loss', 'lm_loss', 'lm_perplexity', 'lm_accuracy', 'lm_top5_accuracy'} <= set(line)
  head, numbers = done[0].stderr.strip().splitlines()[-2:]
  assert head.startswith(f"gpt {gpt_workdir} (step 6) on the embedded corpus, split "
                         f"'{line['split']}': 1 batch, {line['target_tokens']:,} target tokens")
  assert f'loss {line["loss"]:.4f}' in numbers
  assert f'perplexity {line["lm_perplexity"]:.2f}' in numbers
  assert f'accuracy {line["lm_accuracy"]:.3f}' in numbers


def test_random_init_scores_near_chance(gpt_workdir):
  model = pretrain_jax.load_pretrained(gpt_workdir)
  params = eval_lib.random_init_params(model.model_config, seed=3)
  batches = data.make_dataset(model.data_config, model.tokenizer, split='validation',
                              batch_size=4, repeat=False)
  metrics = model.evaluate(batches, max_batches=2, params=params)
  vocab = model.model_config.vocab_size
  assert abs(metrics['loss'] - np.log(vocab)) < 0.1       # uniform guessing: log V nats
  # A random network is not a uniform guesser: its argmax is nearly the same few pieces
  # everywhere, so it is "right" wherever one of them is the target (9 of 512 targets, 0.018,
  # with the 1,024-piece vocabulary). Bound: below the commonest piece's share of text (~5%).
  assert metrics['lm_accuracy'] < 0.05


def test_an_empty_continuation_says_why():
  assert inference.text.why_empty({'text': 'a b', 'ids': [4, 5]}) == ''
  assert 'end-of-sequence' in inference.text.why_empty({'text': '', 'ids': []})
  assert 'the 2 tokens generated decode to whitespace' in inference.text.why_empty(
      {'text': ' ', 'ids': [3, 3]})


def test_generate_text_gpt_and_t5(gpt_workdir, cache, tmp_path):
  model = pretrain_jax.load_pretrained(gpt_workdir)
  out = inference.generate_text(model, ['The list', 'A module is'], max_new_tokens=5)
  assert [r['prompt'] for r in out] == ['The list', 'A module is']
  assert all(len(r['ids']) <= 5 for r in out)
  again = inference.generate_text(model, ['The list', 'A module is'], max_new_tokens=5)
  assert out == again
  # The library checks what the CLI checked (a negative temperature sampled the inverted
  # distribution; max_new_tokens=0 was a TypeError from inside jit)
  for bad, expected in ((dict(max_new_tokens=0), 'max_new_tokens=0 is out of range'),
                        (dict(temperature=-1.0), 'temperature=-1.0 is out of range'),
                        (dict(top_p=0.0), 'top_p=0.0 is out of range'),
                        (dict(top_k=-1), 'top_k=-1 is out of range')):
    with pytest.raises(ValueError, match=expected):
      inference.generate_text(model, ['The list'], **bad)
  with pytest.raises(ValueError, match='a list of prompts'):
    inference.generate_text(model, 'The list')
  done = commands.run('generate', '--workdir', tmp_path / 'not_loaded', '--prompt', 'The',
                      '--temperature=-1')   # checked before the checkpoint is looked for
  assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
  assert done.stderr.startswith('error: temperature=-1.0 is out of range'), done.stderr
  t5_dir = str(tmp_path / 't5')
  config = small(tiny_t5.get_config(), steps=2)
  config.model.num_decoder_layers = 1   # (small's num_layers is the encoder's)
  config.train.eval_every = 0           # what is read is the checkpoint, not its loss
  loop.train_and_evaluate(config, t5_dir)
  t5 = pretrain_jax.load_pretrained(t5_dir)
  filled = inference.generate_text(t5, ['The <extra_id_0> of a list.'], max_new_tokens=4)
  assert len(filled[0]['ids']) <= 4
  # A sentinel past the tokenizer's 100 was encoded as text and "filled" anyway.
  with pytest.raises(ValueError, match=r'<extra_id_150>.* <extra_id_0> to <extra_id_99>'):
    inference.generate_text(t5, ['The <extra_id_0> of <extra_id_150>.'], max_new_tokens=4)
  with pytest.raises(ValueError, match='fill_mask'):
    inference.fill_mask(t5, 'a [MASK]')


def test_fill_mask_recovers_the_word_of_an_overfit_sentence(bert_nsp_workdir):
  model = pretrain_jax.load_pretrained(bert_nsp_workdir)
  tok = model.tokenizer
  sentence = 'the function returns a new list of strings'
  ids = np.array([[tok.cls_id] + tok.encode(sentence) + [tok.sep_id]] * 32, np.int32)
  # Overfit with the real train step: MLM corruption of the one sentence, 300 steps (at 150
  # the ALiBi tiny_bert's top-1 is right at p 0.33; the sinusoidal one it replaced was > 0.5).
  # The batches have no NSP labels, so the NSP head takes no part.
  cfg = model.model_config
  train_model = build(cfg.replace(dropout_rate=0.0, attention_dropout_rate=0.0,
                                  deterministic=True))
  tx = optax.adam(3e-3)
  params, opt = model.params, tx.init(model.params)
  rng = np.random.default_rng(0)
  selectable = np.ones(ids.shape, bool)
  selectable[:, 0] = selectable[:, -1] = False

  @jax.jit
  def step(params, opt, batch):
    def loss(p):
      sums = task.loss_sums(train_model, p, batch)
      return task.total_loss(sums, task.denominators('bert', batch))
    grads = jax.grad(loss)(params)
    updates, opt = tx.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt

  for _ in range(300):
    b = mlm.mask_tokens(ids, rng, selectable=selectable, random_ids=np.arange(10, tok.vocab_size),
                        mask_id=tok.mask_id, probability=0.3)
    batch = {'inputs': b['inputs'], 'targets': b['targets'], 'loss_weights': b['loss_weights'],
             'segment_ids': np.ones(ids.shape, np.int32)}
    params, opt = step(params, opt, batch)
  model.params = params
  word_ids = tok.encode('list')
  assert len(word_ids) == 1, 'the test needs a one-piece word'
  out = inference.fill_mask(model, 'the function returns a new [MASK] of strings', top_k=3)
  assert len(out) == 1
  assert out[0]['candidates'][0]['id'] == word_ids[0]
  assert out[0]['candidates'][0]['word'] == 'list'   # detokenised: the piece is '▁list'
  assert out[0]['candidates'][0]['probability'] > 0.5
  # fill_mask pads to a length bucket under an attention mask: the same probabilities as the
  # unpadded row through the model.
  row = [tok.cls_id] + tok.encode('the function returns a new') + [tok.mask_id] + \
      tok.encode('of strings') + [tok.sep_id]
  probs = jax.nn.softmax(model(np.array([row], np.int32)).logits[0, row.index(tok.mask_id)])
  for c in out[0]['candidates']:
    np.testing.assert_allclose(c['probability'], float(probs[c['id']]), rtol=1e-5, atol=1e-7)
  with pytest.raises(ValueError, match=r'has no \[MASK\]'):
    inference.fill_mask(model, 'no mask here')


def test_fill_mask_keeps_text_glued_to_the_mask_in_its_word(tmp_path, monkeypatch):
  """'[MASK]__ The' reaches the model as the text's own pieces after the mask, with no word
  boundary the text does not have; ' [MASK] fox' keeps fox's."""
  tok = data.Tokenizer(data.train_sentencepiece(corpus.embedded_documents()[:120],
                                                str(tmp_path / 't.model'), vocab_size=512))
  cfg = modeling.tiny('bert', vocab_size=tok.vocab_size)
  model = load.Pretrained(ml_collections.ConfigDict({'model': cfg.to_dict()}), cfg,
                          modeling.init(cfg), tok)
  seen = []
  real = load.Pretrained.__call__
  monkeypatch.setattr(load.Pretrained, '__call__',
                      lambda self, ids, **kw: seen.append(np.asarray(ids)[0]) or real(
                          self, ids, **kw))
  for text, after in (('instance.__[MASK]__ The', tok.encode('__ The', word_start=False)),
                      ('a [MASK]-in function', tok.encode('-in function', word_start=False)),
                      ('the [MASK] fox', tok.encode('fox'))):
    inference.fill_mask(model, text)
    row = list(seen[-1])
    start = row.index(tok.mask_id) + 1
    assert row[start:start + len(after)] == after, text
    assert row[start + len(after)] == tok.sep_id, text
  assert not tok.id_to_piece(tok.encode('__ The', word_start=False)[0]).startswith('▁')


def test_training_time_eval_and_evaluate_script_print_the_same_numbers(bert_nsp_workdir):
  """BERT with NSP (where `loss` once meant two things): every metric of the train loop's last
  validation row equals evaluate.py's number of the same name for that checkpoint and data."""
  workdir = bert_nsp_workdir
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    logged = [json.loads(line) for line in f if '"eval"' in line][-1]
  # (no --batches: it defaults to the run's train.eval_batches, as a user runs it)
  done = commands.run('evaluate', '--workdir', workdir)
  assert done.returncode == 0, done.stderr[-3000:]
  printed = json.loads(done.stdout.strip().splitlines()[-1])
  names = {'loss', 'lm_loss', 'lm_perplexity', 'lm_accuracy', 'lm_top5_accuracy', 'z_loss',
           'nsp_loss', 'nsp_accuracy'}
  assert names <= set(logged) and names <= set(printed), (sorted(logged), sorted(printed))
  for name in names:
    assert printed[name] == pytest.approx(logged[name], abs=1e-5), name
  assert printed['loss'] == pytest.approx(printed['lm_loss'] + printed['z_loss']
                                          + printed['nsp_loss'], abs=1e-5)


def test_a_checkpoint_directory_and_another_step_is_refused(gpt_workdir):
  checkpoint_dir = os.path.join(gpt_workdir, 'checkpoints', '6')
  assert pretrain_jax.load_pretrained(checkpoint_dir).step == 6
  with pytest.raises(ValueError, match='is checkpoint 6 but step=3 was asked for'):
    pretrain_jax.load_pretrained(checkpoint_dir, step=3)


def test_t5_predict_gives_labels_back_and_text_for_text_to_text(tmp_path, monkeypatch):
  """predict maps T5's decoded text to the label it reads back as (' neg' decodes to 'neg',
  'café' to 'caf ⁇' without 'é' in the vocabulary); a T5 fine-tuned on inputs -> targets
  (no labels) gets its decoded text instead of a refusal."""
  tok = data.Tokenizer(data.train_sentencepiece(corpus.embedded_documents()[:120],
                                                str(tmp_path / 't.model'), vocab_size=512))
  cfg = modeling.tiny('t5', vocab_size=tok.vocab_size)
  said = [' neg', 'caf\u00e9', 'no label']      # what the stubbed decoder says, row by row
  monkeypatch.setattr(sampling, 't5_generate', lambda params, cfg, inputs, *a, **k: np.asarray(
      [tok.encode(t) + [tok.eos_id] * (8 - len(tok.encode(t))) for t in said][:inputs.shape[0]]))

  def model(labels):
    config = ml_collections.ConfigDict({'model': cfg.to_dict(), 'data': {
        'seq_len': 16, 'target_len': 8}, 'task': {'labels': labels, 'prefix': ''}})
    return load.Pretrained(config, cfg, modeling.init(cfg), tok)
  assert model([' neg', 'caf\u00e9']).predict(['a', 'b', 'c']) == [
      ' neg', 'caf\u00e9', 'no label']
  assert model([]).predict(['a', 'b']) == ['neg', tok.decode(tok.encode('caf\u00e9')).strip()]
  with pytest.raises(ValueError, match='expected the inputs alone'):
    model([]).predict(['a'], ['b'])


def test_a_fine_tuned_workdir_keeps_its_tokenizer_when_the_init_moves(gpt_workdir, cache,
                                                                        tmp_path):
  """finetune.py used to record the init's tokenizer path only: moving the pre-training workdir
  made the fine-tuned classifier unloadable."""
  init = str(tmp_path / 'gpt')
  shutil.copytree(gpt_workdir, init)   # a pre-training workdir of its own, to move
  ft = str(tmp_path / 'ft')
  modeling.two_step_finetune(init, ft)
  saved = json.load(open(os.path.join(ft, 'config.json')))
  assert saved['data']['tokenizer'] == os.path.join(ft, 'tokenizer.model')
  # Short sentences padded to the task's length: tokens/s counts every position, and the log
  # says how much of it is text (packed pre-training rows are nearly all text).
  for workdir, low, high in ((ft, 0.0, 0.9), (init, 0.9, 1.0)):
    with open(os.path.join(workdir, 'metrics.jsonl')) as f:
      timed = [r for r in map(json.loads, f) if 'tokens_per_sec' in r]
    assert timed and all(low < r['non_padding_fraction'] <= high for r in timed), timed
  shutil.move(init, str(tmp_path / 'moved'))
  fine_tuned = pretrain_jax.load_pretrained(ft)
  assert set(fine_tuned.predict(['a b c'])) <= {'original', 'shuffled'}
  # Single sentences: pairs are refused (they were read as one longer input); and the other way.
  assert saved['task']['pairs'] is False
  with pytest.raises(ValueError, match=r"text_pairs given: .*'word_order' of single sentences"):
    fine_tuned.predict(['a b c'], ['d e'])
  fine_tuned.config.task.pairs = True
  with pytest.raises(ValueError, match=r'text_pairs missing: .* of sentence pairs'):
    fine_tuned.predict(['a b c'])


def test_transfer_runs_share_the_loaded_init_and_each_starts_from_it(gpt_workdir, cache,
                                                                      tmp_path):
  """run_transfer loads the init once for all runs; the train step donates its state, so a run
  that started from the init's arrays themselves deleted them for the next ('Array has been
  deleted')."""
  rows = transfer.run_transfer(modeling.tiny_finetune_config(gpt_workdir), str(tmp_path / 'tr'),
                               modes=('linear_probe', 'full'), seeds=(0, 1))
  assert [(r['mode'], r['steps']) for r in rows] == [('linear_probe', 2)] * 2 + [('full', 2)] * 2


def test_load_pretrained_in_a_notebook_prints_no_orbax_notes(gpt_workdir):
  """A read-only checkpoint manager logged three warnings that it is read-only on every load
  (the CLI quiets absl; a notebook does not)."""
  code = (f'import pretrain_jax; m = pretrain_jax.load_pretrained({gpt_workdir!r}); '
          'print("step", m.step)')
  run = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ), timeout=300, check=True)
  assert run.stdout.strip().splitlines()[-1] == 'step 6'
  assert 'read_only' not in run.stderr and 'read only' not in run.stderr, run.stderr[-2000:]
