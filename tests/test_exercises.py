"""The chapter's exercises: GPT fine-tuned as text generation, zero- and few-shot scoring, T5
summarisation with ROUGE (and beam search), the comparison figure, and their one-line errors."""
import itertools
import json
import os
import types

import commands
import jax
import jax.numpy as jnp
import ml_collections
import modeling
import numpy as np
import pytest
from modeling import small

import pretrain_jax
from configs import finetune as finetune_config
from configs import tiny_gpt, tiny_prefix_lm, tiny_t5
from pretrain_jax import paths
from pretrain_jax.data import prompts, tasks
from pretrain_jax.finetune import evaluators, figures, transfer
from pretrain_jax.finetune import run as run_lib
from pretrain_jax.inference import beam, sampling, scoring
from pretrain_jax.models import build
from pretrain_jax.run import loop
from pretrain_jax.training import state


class WordTokenizer:
  """One id per word (10 + its position in VOCAB); the pad id is 0."""
  VOCAB = ('a', 'b', 'c', 'd', 'e', 'Q:', 'yes', 'no', 'maybe', 'so')
  pad_id, eos_id = 0, 1

  def encode(self, text):
    return [10 + self.VOCAB.index(w) for w in text.split()]


TASK = tasks.Task('t', {'train': [{'text': 'a b c', 'label': 'yes'},
                                  {'text': 'd', 'label': 'maybe so'}]},
                  ('maybe so', 'yes'), question='Q')


# ---- GPT's generation format: the prompt, and the loss on the label alone ------------------

def test_generation_rows_put_the_loss_on_the_label_tokens_only():
  rows = prompts.encode_generation(TASK, 'train', WordTokenizer(), seq_len=6,
                                   question='Q').rows
  # row 0: 'a b c\nQ:' + ' yes' = a b c Q: yes (5 ids): inputs the first 4, targets the last 4
  np.testing.assert_array_equal(rows['inputs'][0], [10, 11, 12, 15, 0, 0])
  np.testing.assert_array_equal(rows['targets'][0], [11, 12, 15, 16, 0, 0])
  np.testing.assert_array_equal(rows['loss_weights'][0], [0, 0, 0, 1, 0, 0])
  np.testing.assert_array_equal(rows['segment_ids'][0], [1, 1, 1, 1, 0, 0])
  # row 1: d Q: maybe so -- two label tokens, both weighted; the class id is 'maybe so' (0)
  np.testing.assert_array_equal(rows['targets'][1], [15, 18, 19, 0, 0, 0])
  np.testing.assert_array_equal(rows['loss_weights'][1], [0, 1, 1, 0, 0, 0])
  assert rows['class_ids'].tolist() == [1, 0] and 'prefix' not in rows
  # Every weighted target is a label token, and every label token is weighted.
  labels = {16, 18, 19}
  assert set(rows['targets'][rows['loss_weights'] > 0].tolist()) <= labels
  assert np.all(rows['loss_weights'][np.isin(rows['targets'], list(labels))] == 1)
  # A prefix LM reads the prompt as its prefix; a long prompt loses its first tokens.
  cut = prompts.encode_generation(TASK, 'train', WordTokenizer(), seq_len=3, question='Q',
                                  prefix_lm=True)
  np.testing.assert_array_equal(cut.rows['inputs'][0], [11, 12, 15])     # b c Q: (a cut)
  np.testing.assert_array_equal(cut.rows['prefix'][0], [1, 1, 1])
  np.testing.assert_array_equal(cut.rows['loss_weights'][0], [0, 0, 1])
  np.testing.assert_array_equal(cut.rows['prefix'][1], [1, 1, 0])         # d Q: | maybe so
  assert cut.truncated == 1


def test_fewshot_prompt_against_a_literal():
  shots = prompts.draw_shots(TASK.splits['train'], 2, seed=0, index=3)
  assert sorted(s['text'] for s in shots) == ['a b c', 'd']
  assert prompts.draw_shots(TASK.splits['train'], 1, 0, 3) == prompts.draw_shots(
      TASK.splits['train'], 1, 0, 3)
  text = prompts.fewshot_context({'text': 'e', 'text_pair': 'a'}, TASK.splits['train'], 'Q')
  assert text == 'a b c\nQ: yes\n\nd\nQ: maybe so\n\ne\na\nQ:'
  with pytest.raises(ValueError, match='3 shots; the training split has only 2'):
    prompts.draw_shots(TASK.splits['train'], 3, 0, 0)


# ---- zero- and few-shot scoring -------------------------------------------------------------

@pytest.mark.parametrize('prefix_lm', [False, True])
def test_loglikelihoods_against_a_hand_computed_forward(prefix_lm):
  cfg = modeling.tiny('gpt', prefix_lm=prefix_lm)
  params = modeling.init(cfg)
  rows = [([5, 6, 7, 8, 9], 3), ([11, 12, 13], 1), ([20, 21, 22, 23, 24, 25, 26], 6)]
  got = scoring.loglikelihoods(params, cfg, rows, batch_size=2)
  for (ids, n), value in zip(rows, got, strict=True):
    inputs = jnp.asarray([ids[:-1]])
    kw = {'prefix': jnp.asarray([[1] * n + [0] * (len(ids) - 1 - n)])} if prefix_lm else {}
    logp = jax.nn.log_softmax(build(cfg).apply({'params': params}, inputs, **kw)[0], -1)
    hand = sum(float(logp[t - 1, ids[t]]) for t in range(n, len(ids)))   # the answer's tokens
    np.testing.assert_allclose(value, hand, rtol=1e-5, atol=1e-5)


def test_label_ranking_and_its_length_normalisation_against_literals():
  # 'ab' at -4 beats 'abcdef' at -6; per character -2 loses to -1 (lm-evaluation-harness's
  # acc_norm divides by the label's characters, not its tokens).
  pred, pred_norm = scoring.rank([[-4.0, -6.0], [-1.0, -9.0]], ('ab', 'abcdef'))
  assert pred.tolist() == [0, 0] and pred_norm.tolist() == [1, 0]
  out = scoring.class_scores([0, 1, 1, 0], [0, 1, 0, 0], 2)
  assert out['accuracy'] == 0.75
  np.testing.assert_allclose(out['f1'], 2 / 3, rtol=1e-6)   # class 1: TP 1, FN 1, FP 0


def test_scoring_a_task_ranks_its_labels_with_the_shots_first():
  cfg = modeling.tiny('gpt')
  params = modeling.init(cfg)
  task = tasks.Task('t', {'train': TASK.splits['train'] * 3,
                          'validation': TASK.splits['train']}, TASK.labels, question='Q')
  zero = scoring.fewshot(params, cfg, WordTokenizer(), task, shots=0, question='Q')
  two = scoring.fewshot(params, cfg, WordTokenizer(), task, shots=2, question='Q')
  assert zero['examples'] == two['examples'] == 2 and zero['truncated'] == 0
  assert 0 <= zero['acc'] <= 1 and two['shots'] == 2
  # The same numbers from the prompts written out, and the first one's ranking by hand.
  direct = scoring.score_labels(params, cfg, WordTokenizer(), ['a b c\nQ:', 'd\nQ:'],
                                TASK.labels, [1, 0])
  assert (direct['acc'], direct['acc_norm']) == (zero['acc'], zero['acc_norm'])
  rows, _ = scoring.choice_rows(WordTokenizer(), ['a b c\nQ:'], TASK.labels, 33)
  assert [n for _, n in rows] == [4, 4] and rows[0][0] == [10, 11, 12, 15, 18, 19]
  ll = scoring.loglikelihoods(params, cfg, rows)
  assert direct['pred'][0] == int(np.argmax(ll))
  assert direct['pred_norm'][0] == int(np.argmax(ll / np.array([8.0, 3.0])))   # characters
  with pytest.raises(ValueError, match='text to text'):
    scoring.fewshot(params, cfg, WordTokenizer(), tasks.Task('s', {'train': [
        {'inputs': 'a', 'targets': 'b'}]}), shots=0, question='Q')


@pytest.mark.parametrize('family, kw, named', [('t5', {}, 'is t5'), ('bert', {}, 'is bert'),
                                                ('gpt', {'num_classes': 2}, 'num_classes=2')])
def test_scoring_needs_a_causal_language_model(family, kw, named):
  with pytest.raises(ValueError, match=named) as error:
    scoring.check_scores(modeling.tiny(family, **kw), '--shots', 'ckpt')
  assert '--shots needs a' in str(error.value) and '\n' not in str(error.value)


# ---- T5: ROUGE and beam search ---------------------------------------------------------------

def test_rouge_against_literals_of_the_reference_package():
  pytest.importorskip('rouge_score')
  # 'the cat lay on the mat' vs 'the cat sat on the mat': 5 of 6 unigrams, 3 of 5 bigrams, an
  # LCS of 5; with the stemmer 'cats running' is 'cat run'.
  scores = evaluators.rouge_scores(['the cat lay on the mat', 'cats running'],
                                   ['the cat sat on the mat', 'cat run'])
  np.testing.assert_allclose([scores['rouge1'], scores['rouge2'], scores['rougeL']],
                             [(5 / 6 + 1) / 2, (0.6 + 1) / 2, (5 / 6 + 1) / 2], rtol=1e-9)


def test_beam_of_one_is_greedy_and_a_wide_beam_finds_the_likeliest_sequence():
  """Against greedy decoding, and against every sequence of 3 tokens of an 8-token vocabulary
  scored by one teacher-forced forward pass (64 beams keep every 2-token prefix)."""
  cfg = modeling.tiny('t5', vocab_size=8, num_layers=1, num_decoder_layers=1)
  rng = np.random.default_rng(0)
  inputs = jnp.asarray(rng.integers(2, 8, (8, 5)), jnp.int32)
  seg = jnp.ones_like(inputs)
  # one jitted program (eagerly, the init runs an op at a time)
  params = state.run_once(lambda key: build(cfg).init(key, inputs, jnp.ones((8, 3), jnp.int32),
                                                      encoder_segment_ids=seg)['params'],
                          jax.random.key(1))
  kw = dict(max_new_tokens=3, eos_id=1, pad_id=0)
  greedy = sampling.t5_generate(params, cfg, inputs, seg, jax.random.key(0), **kw)
  one, _ = beam.t5_beam_search(params, cfg, inputs, seg, beam_size=1, **kw)
  np.testing.assert_array_equal(one, greedy)
  wide, score = beam.t5_beam_search(params, cfg, inputs, seg, beam_size=64, **kw)
  seqs = np.array(list(itertools.product(range(8), repeat=3)))                # (512, 3)
  dec = jnp.asarray(np.concatenate([np.zeros((512, 1), np.int32), seqs[:, :-1]], 1))
  forward = jax.jit(lambda row: jax.nn.log_softmax(build(cfg).apply(
      {'params': params}, jnp.repeat(row[None], 512, 0), dec), -1))      # (512, 3, V)
  for b in range(8):
    logp = np.take_along_axis(np.asarray(forward(inputs[b])), seqs[..., None], -1)[..., 0]
    after_eos = np.cumsum(seqs == 1, 1) - (seqs == 1) > 0     # tokens after EOS cost nothing
    totals = np.where(after_eos, 0.0, logp).sum(1)
    np.testing.assert_allclose(score[b], totals.max(), atol=1e-5)
    best = seqs[np.argmax(totals)]
    best = np.where(np.cumsum(best == 1) - (best == 1) > 0, 0, best)   # pad after EOS
    np.testing.assert_array_equal(wide[b], best)
  assert np.any(np.asarray(wide) != np.asarray(greedy))   # the search found something else


# ---- the comparison figure ------------------------------------------------------------------

def _fake_runs(root):
  rows = []
  for checkpoint, fmt, mode, size, seed in itertools.product(
      ('bert', 'gpt'), ('head', 'generation'), ('scratch', 'full', 'lora'), (8, 16), (0, 1)):
    if (checkpoint == 'bert' and fmt == 'generation') or (mode == 'lora' and checkpoint == 'gpt'):
      continue
    workdir = os.path.join(root, checkpoint, transfer.run_name(mode, size, seed, fmt))
    value = 0.5 + 0.01 * size + 0.1 * (mode == 'full') + 0.01 * seed
    paths.write_atomic(paths.resolve(workdir) / 'metrics.jsonl', ''.join(
        json.dumps({'split': 'eval', 'step': s, 'class_accuracy': value * s / 4}) + '\n'
        for s in (2, 4)))
    rows.append({'checkpoint': checkpoint, 'mode': mode, 'format': fmt, 'size': size,
                 'requested_size': size, 'seed': seed, 'metric': 'class_accuracy',
                 'final': value, 'best': value, 'steps': 4, 'wall_sec': 1.0,
                 'step_time_sec': None, 'workdir': workdir, 'family': checkpoint})
  return rows


def test_the_comparison_figure_has_one_line_per_checkpoint_mode_and_format(tmp_path, capsys):
  rows = _fake_runs(str(tmp_path))
  fig = figures.comparison_figure(rows)
  expected = {'bert scratch', 'bert full', 'bert lora', 'gpt scratch', 'gpt full',
              'gpt scratch (gen)', 'gpt full (gen)'}
  for ax in fig.axes:
    lines = {line.get_label(): line for line in ax.get_lines()
             if not line.get_label().startswith('_')}
    assert set(lines) == expected and len(lines) == len(expected)
    for name, line in lines.items():
      assert line.get_linestyle() == ('--' if 'scratch' in name else '-.' if 'lora' in name
                                      else '-'), name
      assert line.get_marker() == ('^' if '(gen)' in name else 'o'), name
  left, right = fig.axes
  # The step curve is the largest set's mean over the seeds; the size curve the finals' mean.
  gpt_full = {curve.get_label(): curve for curve in left.get_lines()}['gpt full']
  np.testing.assert_allclose(gpt_full.get_ydata(), [(0.76 + 0.77) / 4, (0.76 + 0.77) / 2])
  sizes = {curve.get_label(): curve for curve in right.get_lines()}['bert scratch']
  assert list(sizes.get_xdata()) == [8, 16]
  np.testing.assert_allclose(sizes.get_ydata(), [0.585, 0.665])
  # transfer's report writes it as comparison.png when the rows hold several checkpoints.
  result = transfer.report(rows, str(tmp_path), 'title', init='a,b', task='t')
  assert result['comparison_png'] == str(tmp_path / 'comparison.png') == result['png']
  assert open(result['png'], 'rb').read(8) == b'\x89PNG\r\n\x1a\n'
  assert 'gpt        full (gen)' in capsys.readouterr().err
  # Its numbers beside it: each seed's final value, their mean and standard error (seeds 0 and
  # 1 are 0.01 apart: 0.005), per line and size, and the curve's.
  assert result['comparison_json'] == str(tmp_path / 'comparison.json')
  data = {line['label']: line for line in json.load(open(result['comparison_json']))['lines']}
  small = data['bert scratch']['by_size'][0]
  assert small['size'] == 8 and small['seeds'] == [0, 1] and small['finals'] == [0.58, 0.59]
  np.testing.assert_allclose([small['mean'], small['se']], [0.585, 0.005])
  np.testing.assert_allclose(data['gpt full']['curve']['mean'], gpt_full.get_ydata())
  assert len(right.collections) == len(expected)   # one standard-error band per line
  line = dict(data['bert lora'], trainable_params=53634, step_time_sec=0.16)
  assert figures.legend_label(line) == 'bert lora (54k trained, 160 ms/step)'
  assert figures.legend_label(dict(line, trainable_params=256.0)) == (   # a probe's head: not 0k
      'bert lora (256 trained, 160 ms/step)')
  assert transfer.checkpoint_names(['runs/tiny/gpt', 'x/t5/', 'w/checkpoints/300']) == [
      'gpt', 't5', 'w-300']
  with pytest.raises(ValueError, match='different names'):
    transfer.checkpoint_names(['a/gpt', 'b/gpt'])


# ---- the one-line errors of a wrong family ----------------------------------------------------

def _init(family, **kw):
  cfg = modeling.tiny(family, **kw)
  return types.SimpleNamespace(model_config=cfg, family=family,
                               config=ml_collections.ConfigDict())


@pytest.mark.parametrize('family, overrides, task, match', [
    ('bert', {'task.format': 'generation'}, TASK, r"task.format='generation' needs a causal "
     r"language model .* is bert"),
    ('t5', {'task.format': 'generation'}, TASK, r"needs a causal language model .* is t5"),
    ('gpt', {'task.beam_size': 4}, TASK, r'task.beam_size=4 decodes text-to-text targets'),
    ('bert', {}, tasks.Task('s', {'train': [{'inputs': 'a', 'targets': 'b'}]}),
     r"is text-to-text .*a bert model"),
    ('gpt', {'task.format': 'generation', 'mode': 'linear_probe'}, TASK,
     r"mode=linear_probe on gpt with task.format='generation'"),
    ('gpt', {'task.format': 'prose'}, TASK, r"task.format='prose'; expected one of"),
])
def test_a_wrong_family_or_format_is_one_line_naming_what_is_expected(family, overrides, task,
                                                                       match):
  c = finetune_config.get_config()
  c.init = 'ckpt'
  for key, value in overrides.items():
    section, _, name = key.rpartition('.')
    (c[section] if section else c)[name] = value
  with pytest.raises(ValueError, match=match) as error:
    run_lib.build_config(c, _init(family), task)
  assert '\n' not in str(error.value)


# ---- the four from the command line, on the embedded data (slow) ------------------------------

@pytest.fixture(scope='module')
def tiny_inits(module_cache, tmp_path_factory):
  """A 3-step GPT, prefix LM and T5 of the main job's shape, smaller."""
  out = {}
  for name, module in (('gpt', tiny_gpt), ('prefix_lm', tiny_prefix_lm), ('t5', tiny_t5)):
    out[name] = str(tmp_path_factory.mktemp('inits') / name)
    loop.train_and_evaluate(small(module.get_config(), steps=3), out[name])
  return out


def _cli(*args, cache=None):
  env = dict(os.environ, **({'PRETRAIN_JAX_CACHE': cache} if cache else {}))
  return commands.run('pretrain_jax', *args, env=env, timeout=600)


STEPS = ['--config.train.steps=2', '--config.train.batch_size=4', '--config.train.warmup_steps=1',
         '--config.train.eval_every=2', '--config.train.log_every=1', '--config.data.seq_len=48',
         '--config.task.max_train_examples=8', '--config.task.max_eval_examples=6']


@pytest.mark.slow
def test_the_four_exercises_from_the_command_line(tiny_inits, tmp_path):
  # 1. GPT fine-tuned as text generation; its workdir predicts labels by ranking them.
  done = _cli('finetune', '--init', tiny_inits['gpt'], '--task', 'word_order', '--workdir',
              tmp_path / 'gen', '--config.task.format=generation', *STEPS)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result['format'] == 'generation' and result['metric'] == 'class_accuracy'
  assert 'class_accuracy_norm' in result['eval_metrics']
  assert set(pretrain_jax.load_pretrained(str(tmp_path / 'gen')).predict(
      ['The list is sorted.', 'sorted The is list.'])) <= {'original', 'shuffled'}
  # 2. zero- and few-shot scoring; a T5 is refused in one line naming it.
  done = _cli('fewshot', '--init', tiny_inits['prefix_lm'], '--task', 'word_order', '--shots',
              '0,2', '--max_examples', 6)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert [r['shots'] for r in result['results']] == [0, 2] and len(done.stdout) < 1000
  assert all(r['examples'] == 6 and 0 <= r['acc_norm'] <= 1 for r in result['results'])
  done = _cli('fewshot', '--init', tiny_inits['t5'], '--task', 'word_order')
  assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
  assert '--shots needs a causal language model' in done.stderr and 'is t5' in done.stderr
  # 3. T5 summarising the embedded sections by their titles, beam-decoded, scored by ROUGE.
  done = _cli('finetune', '--init', tiny_inits['t5'], '--task', 'doc_titles', '--workdir',
              tmp_path / 'sum', '--config.task.beam_size=2', '--config.data.target_len=24',
              *STEPS)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result['metric'] == 'rougeL' and result['final'] == result['eval_metrics']['rougeL']
  assert {'rouge1', 'rouge2', 'exact_match'} <= set(result['eval_metrics'])
  # 4. the comparison: two checkpoints, two sizes, scratch and full, one figure.
  done = _cli('transfer', '--init', f'{tiny_inits["gpt"]},{tiny_inits["t5"]}', '--task',
              'word_order', '--workdir', tmp_path / 'cmp', '--modes', 'scratch,full',
              '--sizes', '4,8', '--formats', 'head,generation', *STEPS[:-2],
              '--config.task.max_eval_examples=6')
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result['png'] == str(tmp_path / 'cmp' / 'comparison.png')
  assert {(r['checkpoint'], r['mode'], r['format']) for r in result['runs']} == {
      ('gpt', m, f) for m in ('scratch', 'full') for f in ('head', 'generation')} | {
      ('t5', 'scratch', 'head'), ('t5', 'full', 'head')}
  assert 't5: no generation format' in done.stderr
