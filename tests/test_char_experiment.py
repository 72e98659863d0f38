"""The character-level BERT-vs-GPT protocol, shortened, on text that ships with CPython."""
from pydoc_data import topics

import jax
import numpy as np
import pytest
from modeling import forward, init

from configs import shakespeare_char
from pretrain_jax.experiments import char_lm, char_transfer
from pretrain_jax.models import ModelConfig
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training.config import MeshConfig, TrainConfig


def test_char_vocab_and_encoding():
  vocab = char_lm.char_vocab('abca')
  assert vocab == ['a', 'b', 'c', '[MASK]']
  np.testing.assert_array_equal(char_lm.encode('cab', vocab), [2, 0, 1])
  with pytest.raises(ValueError, match=r"\['z'\]"):
    char_lm.encode('az', vocab)


@pytest.mark.slow   # ~30 s
def test_short_protocol_learns(tmp_path):
  text = ''.join(topics.topics[k] for k in sorted(topics.topics))[:12_000]
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text(text, encoding='utf-8')
  config = shakespeare_char.get_config()
  config.corpus = str(corpus)
  config.train_chars, config.valid_chars, config.heldout_chars = (0, 9000), (9000, 10_000), \
      (10_000, 12_000)
  config.gpt.train.steps, config.bert.train.steps = 60, 80
  result = char_lm.run(config)
  vocab = result['vocab_size']
  # Uniform guessing has perplexity = vocab size; a few dozen steps must do far better.
  assert result['gpt']['valid_perplexity'] < vocab / 3
  bert = result['bert']
  assert bert['heldout_top1'] > bert['random_init_top1'] + 0.1
  assert bert['heldout_top5'] > bert['heldout_top1']
  assert bert['heldout_draws'] == config.eval_draws > 1
  assert bert['heldout_top1_mean'] > bert['random_init_top1'] + 0.1
  with pytest.raises(ValueError, match='needs at least'):
    config.heldout_chars = (10_000, 1_000_000)
    char_lm.run(config)


def test_gpt_windows_count_every_target_once():
  ids = np.arange(20)
  for stride in (1, 3, 4):
    batch = char_lm.gpt_windows(ids, 4, stride)
    scored = batch['targets'][batch['loss_weights'] > 0]
    np.testing.assert_array_equal(np.sort(scored), np.arange(1, 1 + len(scored)))
    assert len(scored) > 20 - 1 - stride
  with pytest.raises(ValueError, match='stride=5'):
    char_lm.gpt_windows(ids, 4, 5)


def test_full_context_perplexity_matches_one_prefix_at_a_time():
  """stride=1: the loss of character j is -log p(ids[j] | ids[max(0, j - L):j])."""
  cfg = ModelConfig(family='gpt', vocab_size=7, num_layers=1, emb_dim=16, num_heads=2,
                    head_dim=8, mlp_dim=32, max_len=5, activation='relu',
                    position_embedding='sinusoidal', kernel_init='fan_in')
  ids = np.random.default_rng(0).integers(0, 7, 23).astype(np.int32)
  params = init(cfg, length=5)
  got = char_lm.evaluate_gpt(cfg, params, ids, stride=1)
  nll = []
  for j in range(1, len(ids)):
    context = ids[max(0, j - cfg.max_len):j]
    logits = forward(cfg, params, context[None])[0, -1]
    nll.append(float(jax.nn.logsumexp(logits) - logits[ids[j]]))
  assert got['characters'] == len(nll)
  np.testing.assert_allclose(got['loss'], np.mean(nll), rtol=1e-5)



def test_scan_steps_are_the_same_steps():
  """K steps in one jitted lax.scan == K calls of the train step (dropout keys fold in the
  step, so the same masks are drawn). One layer and 'rbg' dropout keys (compiled faster than
  threefry's): the keys fold in the step alike."""
  config = shakespeare_char.get_config()
  family = config.gpt
  family.train.update(steps=6, prng_impl='rbg')
  family.model.num_layers = 1
  cfg = ModelConfig.from_config({**family.model.to_dict(), 'vocab_size': 30,
                                 'max_len': 12, 'deterministic': False})
  train = {k: v for k, v in family.train.items() if k != 'steps_per_call'}
  trainer = step_lib.make_steps(cfg, TrainConfig.from_config(train),
                                mesh_lib.make_mesh(MeshConfig.from_config(config.mesh)),
                                init_length=12)
  make = char_lm.batch_maker('clm', np.arange(500) % 29, 12, 4, 30, np.random.default_rng(0))
  batches = [make() for _ in range(3)]
  one = trainer.create_state(0)
  losses = []
  for b in batches:
    one, m = trainer.train_step(one, b)
    losses.append(float(m['loss']))
  scanned, metrics = trainer.scan_steps(
      trainer.create_state(0), {k: np.stack([b[k] for b in batches]) for k in batches[0]})
  assert int(scanned.step) == int(one.step) == 3
  np.testing.assert_allclose(metrics['loss'], losses, rtol=1e-5)
  # The two compilations round differently; Adam turns a rounding-level gradient difference on
  # a near-zero gradient element into up to 2 * lr per step, so that is the parameter bound.
  bound = 2 * family.train.learning_rate * 3
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=bound),
               scanned.params, one.params)


def test_mlm_draws_summarise_separate_maskings():
  """draws=K: the first draw is the protocol's single masking; the mean and spread are those of
  K evaluations masked with seeds s .. s + K - 1, scored one by one."""
  vocab_size, length, seed = 9, 6, 5
  ids = np.random.default_rng(0).integers(0, vocab_size - 1, 300).astype(np.int32)
  weights = np.random.default_rng(1).standard_normal((vocab_size, vocab_size))
  def logits_of(inputs):
    return weights[inputs]                       # a fixed toy "model"
  got = char_lm.mlm_draws(logits_of, ids, length, vocab_size, seed, 0.15, draws=4)
  one_by_one = []
  for i in range(4):
    batch = char_lm.mlm_eval_batch(ids, length, vocab_size, seed + i, 0.15)
    one_by_one.append(char_lm.topk_accuracy(logits_of(batch['inputs']), batch))
  assert len({r['top1'] for r in one_by_one}) > 1          # the maskings do differ
  for key in ('top1', 'top5', 'masked_positions'):
    assert got[key] == one_by_one[0][key]
  for key in ('top1', 'top5'):
    values = [r[key] for r in one_by_one]
    np.testing.assert_allclose(got[f'{key}_mean'], np.mean(values), rtol=1e-12)
    np.testing.assert_allclose(got[f'{key}_draw_std'], np.std(values, ddof=1), rtol=1e-12)
    np.testing.assert_allclose(got[f'{key}_se'], np.std(values, ddof=1) / 2, rtol=1e-12)
  single = char_lm.mlm_draws(logits_of, ids, length, vocab_size, seed, 0.15)
  assert single['top1'] == single['top1_mean'] == one_by_one[0]['top1']
  assert single['top1_se'] == 0.0
  for bad in (0, -1, 2.5, True):
    with pytest.raises(ValueError, match=f'eval_draws={bad!r}; expected a positive'):
      char_lm.mlm_draws(logits_of, ids, length, vocab_size, seed, 0.15, draws=bad)
  config = shakespeare_char.get_config()   # refused before the corpus is read or a step runs
  config.eval_draws = 0
  with pytest.raises(ValueError, match='eval_draws=0; expected a positive'):
    char_lm.run(config)


def test_progress_reports_every_call_and_ends_on_the_last_step():
  """train(progress=...) hears of every jitted call, one call late, and of the last when
  training ends: the steps done and that call's metrics (its last step's loss is returned).
  One layer, 'rbg' dropout keys: what is checked is the calls, not the model."""
  config = shakespeare_char.get_config()
  family = config.gpt
  family.model.update(max_len=12, num_layers=1)
  family.train.update(steps=5, steps_per_call=2, batch_size=4, prng_impl='rbg')
  heard = []
  ids = (np.arange(400) % 29).astype(np.int32)
  _, _, _, final_loss = char_lm.train(
      family, config.mesh, ids, 30,
      progress=lambda done, metrics: heard.append((done, np.ravel(metrics['loss']).copy())))
  assert [done for done, _ in heard] == [2, 4, 5]
  assert [len(losses) for _, losses in heard] == [2, 2, 1]
  assert float(heard[-1][1][-1]) == final_loss


def test_word_order_windows_keep_their_characters_and_half_are_shuffled():
  space = 0
  window = np.array([5, 6, space, 7, space, 8, 9, 9], np.int32)   # 'ab c dee'
  out = char_transfer.shuffle_words(window, space, np.random.default_rng(0))
  assert len(out) == 8 and not np.array_equal(out, window)
  assert sorted(out.tolist()) == sorted(window.tolist())
  words = [tuple(w) for w in np.split(out, np.flatnonzero(out == space))]
  assert {w[1:] if w[0] == space else w for w in words} == {(5, 6), (7,), (8, 9, 9)}
  assert char_transfer.shuffle_words(np.array([5, 6, 7]), space, np.random.default_rng(0)) is None
  ids = np.random.default_rng(1).choice([space, 5, 6, 7, 8], 5000).astype(np.int32)
  inputs, labels = char_transfer.word_order_examples(ids, 400, 12, space, seed=3)
  assert inputs.shape == (400, 12) and 0.4 < labels.mean() < 0.6


def test_the_pooled_head_fine_tunes_gpt_and_bert_alike():
  """A task the mean of the hidden states decides (does the window hold id 3?): both stacks
  learn it with the same head; the head reads every position (no [CLS], no last token)."""
  rng = np.random.default_rng(0)
  inputs = rng.integers(4, 20, (512, 12)).astype(np.int32)
  labels = rng.integers(0, 2, 512).astype(np.int32)
  inputs[labels == 1, rng.integers(0, 12, int(labels.sum()))] = 3
  data = (inputs[:384], labels[:384]), (inputs[384:], labels[384:])
  for causal in (True, False):
    cfg = ModelConfig(family='gpt', causal=causal, vocab_size=20, num_layers=1, emb_dim=16,
                      num_heads=2, head_dim=8, mlp_dim=32, max_len=12, dropout_rate=0.0,
                      attention_dropout_rate=0.0)
    out = char_transfer.finetune(cfg, init(cfg, length=12), *data, steps=150, batch_size=32,
                                 learning_rate=1e-2, seed=0)
    assert out['accuracy'] > 0.9, (causal, out)


@pytest.mark.parametrize('key, value, match', [
    ('models', 'gpt,t5', "models='gpt,t5'"), ('masking', 'word', "masking='word'"),
    ('finetune.steps', -1, 'finetune.steps=-1'), ('finetune.learning_rate', 0.0,
                                                  'finetune.learning_rate=0.0'),
    ('finetune.scratch', True, 'finetune.scratch=True')])
def test_bad_experiment_settings_fail_before_training(key, value, match, tmp_path):
  config = shakespeare_char.get_config()
  config.corpus = str(tmp_path / 'missing.txt')    # never read: the check comes first
  section, _, name = key.rpartition('.')
  (config[section] if section else config)[name] = value
  with pytest.raises(ValueError, match=match):
    char_lm.run(config)
