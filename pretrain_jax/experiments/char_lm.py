"""Character-level GPT vs BERT on one text: random training windows, full-coverage evaluation.

Data: a character vocabulary (sorted characters of the used text, then [MASK]); training
batches are random windows of `max_len` characters from the training slice (GPT predicts the
next character of every position; BERT masks 15% with 80/10/10). Evaluation covers every
non-overlapping window of the validation / held-out slice, with a fixed masking seed.
"""
import time

import jax
import numpy as np

from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.objectives import mlm
from pretrain_jax.training import mesh as mesh_lib, step as step_lib, task

MASK = '[MASK]'


def char_vocab(text: str) -> list:
  return sorted(set(text)) + [MASK]


def encode(text: str, vocab: list) -> np.ndarray:
  index = {c: i for i, c in enumerate(vocab)}
  missing = sorted(set(text) - set(index))
  if missing:
    raise ValueError(f'characters {missing[:10]} are not in the vocabulary')
  return np.array([index[c] for c in text], np.int32)


def _windows(ids: np.ndarray, length: int) -> np.ndarray:
  n = len(ids) // length
  return ids[:n * length].reshape(n, length)


def _mlm_batch(windows, rng, vocab_size, mask_id, probability):
  out = mlm.mask_tokens(windows, rng, selectable=np.ones(windows.shape, bool),
                        random_ids=np.arange(vocab_size - 1), mask_id=mask_id,
                        probability=probability)
  return {'inputs': out['inputs'], 'targets': out['targets'],
          'loss_weights': out['loss_weights']}


def _clm_batch(ids, starts, length):
  idx = starts[:, None] + np.arange(length + 1)[None]
  chunk = ids[idx]
  return {'inputs': chunk[:, :-1], 'targets': chunk[:, 1:],
          'loss_weights': np.ones((len(starts), length), np.float32)}


def train(family_config, mesh_config, train_ids, vocab_size, seed=0, mlm_probability=0.15):
  """Train one model; returns (ModelConfig, params, seconds)."""
  cfg = ModelConfig.from_config({**family_config.model.to_dict(), 'vocab_size': vocab_size})
  t = family_config.train
  length, batch = cfg.max_len, t.batch_size
  mesh = mesh_lib.make_mesh(mesh_config)
  trainer = step_lib.make_steps(cfg, t, mesh, init_length=length)
  state = trainer.create_state(t.seed)
  rng = np.random.default_rng(seed)
  make = {  # random training windows for the family's objective
      'clm': lambda: _clm_batch(train_ids, rng.integers(0, len(train_ids) - length - 1, batch),
                                length),
      'mlm': lambda: _mlm_batch(train_ids[rng.integers(0, len(train_ids) - length, batch)[:, None]
                                          + np.arange(length)], rng, vocab_size, vocab_size - 1,
                                mlm_probability)}[family_of(cfg).objective]
  first = make()
  jitted = trainer.train_step
  start = time.perf_counter()
  batch_data = first
  for _ in range(t.steps):
    state, metrics = jitted(state, batch_data)
    batch_data = make()
  jax.block_until_ready(state)
  return cfg, state.params, time.perf_counter() - start, float(metrics['loss'])


def gpt_windows(ids: np.ndarray, length: int, stride: int = 0) -> dict:
  """Evaluation batch covering `ids`: every target character counted exactly once.

  stride=0: non-overlapping windows of `length` inputs (the reading of the protocol: the loss
  averaged over all positions of a window, as in training, so early positions see little
  context). 0 < stride <= length: windows start every `stride` characters; the first window
  scores all its positions, each later one only its last `stride` (which see at least
  `length - stride` characters of context; stride=1 gives every character the full context).
  """
  if not 0 <= stride <= length:
    raise ValueError(f'stride={stride}; expected 0 (non-overlapping) or 1..{length}')
  if stride == 0:
    windows = _windows(ids, length + 1)                                  # (W, L + 1)
    weights = np.ones((len(windows), length), np.float32)
  else:
    starts = np.arange(0, len(ids) - length, stride)                     # (W,)
    windows = ids[starts[:, None] + np.arange(length + 1)]               # (W, L + 1)
    weights = np.zeros((len(windows), length), np.float32)
    weights[0] = 1.0
    weights[1:, length - stride:] = 1.0
  return {'inputs': windows[:, :-1], 'targets': windows[:, 1:], 'loss_weights': weights}


def evaluate_gpt(cfg, params, ids, stride: int = 0) -> dict:
  """Per-character loss, perplexity and accuracy of `ids` (see gpt_windows for `stride`)."""
  batch = gpt_windows(ids, cfg.max_len, stride)
  sums = jax.jit(lambda p, b: task.loss_sums(build(cfg), p, b))(params, batch)
  loss = float(sums['lm'] / sums['lm_weight'])
  return {'loss': loss, 'perplexity': float(np.exp(loss)),
          'accuracy': float(sums['lm_correct'] / sums['lm_weight']),
          'characters': int(sums['lm_weight'])}


def evaluate_bert(cfg, params, ids, seed, probability) -> dict:
  windows = _windows(ids, cfg.max_len)
  batch = _mlm_batch(windows, np.random.default_rng(seed), cfg.vocab_size, cfg.vocab_size - 1,
                     probability)
  logits = jax.jit(lambda p, x: build(cfg).apply({'params': p}, x)[0])(params, batch['inputs'])
  selected = batch['loss_weights'] > 0
  top5 = np.asarray(jax.lax.top_k(logits, 5)[1])[selected]        # (M, 5)
  targets = batch['targets'][selected]
  return {'top1': float(np.mean(top5[:, 0] == targets)),
          'top5': float(np.mean(np.any(top5 == targets[:, None], axis=1))),
          'masked_positions': int(selected.sum())}


def run(config) -> dict:
  """The whole protocol; returns the numbers the script prints."""
  with open(config.corpus, encoding='utf-8') as f:
    text = f.read()
  end = config.heldout_chars[1]
  if len(text) < end:
    raise ValueError(f'corpus {config.corpus!r} has {len(text)} characters; the protocol '
                     f'needs at least {end}')
  vocab = char_vocab(text[:end])
  ids = encode(text[:end], vocab)
  cut = lambda span: ids[span[0]:span[1]]
  gpt_cfg, gpt_params, gpt_s, gpt_train_loss = train(config.gpt, config.mesh,
                                                     cut(config.train_chars), len(vocab))
  gpt_eval_cfg = gpt_cfg.replace(deterministic=True)
  gpt = evaluate_gpt(gpt_eval_cfg, gpt_params, cut(config.valid_chars))
  gpt_full = evaluate_gpt(gpt_eval_cfg, gpt_params, cut(config.valid_chars), stride=1)
  bert_cfg, bert_params, bert_s, bert_train_loss = train(
      config.bert, config.mesh, cut(config.train_chars), len(vocab),
      mlm_probability=config.mlm_probability)
  eval_cfg = bert_cfg.replace(deterministic=True)
  heldout = cut(config.heldout_chars)
  bert = evaluate_bert(eval_cfg, bert_params, heldout, config.eval_seed, config.mlm_probability)
  random_params = jax.jit(build(eval_cfg).init)(jax.random.key(1), heldout[None, :48])['params']
  random_init = evaluate_bert(eval_cfg, jax.tree.map(lambda x: getattr(x, 'value', x),
                                                     random_params,
                                                     is_leaf=lambda x: hasattr(x, 'value')),
                              heldout, config.eval_seed, config.mlm_probability)
  return {'vocab_size': len(vocab),
          'gpt': {'steps': config.gpt.train.steps, 'train_seconds': round(gpt_s, 2),
                  'final_train_loss': gpt_train_loss, 'valid_perplexity': gpt['perplexity'],
                  'valid_accuracy': gpt['accuracy'],
                  # every character predicted from its full 48-character context
                  'valid_perplexity_full_context': gpt_full['perplexity']},
          'bert': {'steps': config.bert.train.steps, 'train_seconds': round(bert_s, 2),
                   'final_train_loss': bert_train_loss, 'heldout_top1': bert['top1'],
                   'heldout_top5': bert['top5'], 'random_init_top1': random_init['top1'],
                   'random_init_top5': random_init['top5'],
                   'masked_positions': bert['masked_positions']}}
