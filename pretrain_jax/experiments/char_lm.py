"""Character-level GPT vs BERT on one text: random training windows, full-coverage evaluation.

Data: a character vocabulary (sorted characters of the used text, then [MASK]); training
batches are random windows of `max_len` characters from the training slice (GPT predicts the
next character of every position; BERT masks 15% with 80/10/10, by characters or, with
`masking='span'`, by SpanBERT's spans: objectives/mlm.py). Evaluation covers every
non-overlapping window of the validation / held-out slice, with a fixed masking seed (token
masking for either). With `finetune.steps` > 0 each model is then fine-tuned on a labelled
task with one shared head (char_transfer.py).
"""
import functools
import time

import flax.linen as nn
import jax
import numpy as np

from pretrain_jax.experiments import char_transfer
from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.objectives import mlm
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import state as state_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training import task
from pretrain_jax.training.config import MeshConfig, TrainConfig

MASK = '[MASK]'
DRAW_KEYS = ('draws', 'top1_mean', 'top1_draw_std', 'top1_se', 'top5_mean', 'top5_draw_std',
             'top5_se')


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


MASKINGS = ('token', 'span')


def _mlm_batch(windows, rng, vocab_size, mask_id, probability, masking='token', span_length=0):
  kw = dict(selectable=np.ones(windows.shape, bool), random_ids=np.arange(vocab_size - 1),
            mask_id=mask_id, probability=probability)
  if masking == 'span':   # SpanBERT: spans of geometric(0.2) lengths up to 10, or fixed ones
    out = mlm.mask_spans(windows, rng, segment_ids=np.ones_like(windows),
                         span_length=span_length, **kw)
  else:
    out = mlm.mask_tokens(windows, rng, **kw)
  return {'inputs': out['inputs'], 'targets': out['targets'],
          'loss_weights': out['loss_weights']}


def _clm_batch(ids, starts, length):
  idx = starts[:, None] + np.arange(length + 1)[None]
  chunk = ids[idx]
  return {'inputs': chunk[:, :-1], 'targets': chunk[:, 1:],
          'loss_weights': np.ones((len(starts), length), np.float32)}


def batch_maker(objective, ids, length, batch, vocab_size, rng, mlm_probability=0.15,
                masking='token', span_length=0):
  """() -> one training batch of random windows of `ids` ([MASK] is the last id); MLM selects
  characters one by one (`masking='token'`) or in spans ('span', `span_length` 0: SpanBERT's
  geometric lengths)."""
  if masking not in MASKINGS:
    raise ValueError(f'masking={masking!r}; expected one of {MASKINGS}')
  if objective == 'clm':
    return lambda: _clm_batch(ids, rng.integers(0, len(ids) - length - 1, batch), length)
  if objective == 'mlm':
    return lambda: _mlm_batch(ids[rng.integers(0, len(ids) - length, batch)[:, None]
                                  + np.arange(length)], rng, vocab_size, vocab_size - 1,
                              mlm_probability, masking, span_length)
  raise ValueError(f'objective {objective!r}; the character experiment has clm and mlm')


def _stacked(make, k):
  batches = [make() for _ in range(k)]
  return {key: np.stack([b[key] for b in batches]) for key in batches[0]}


def train(family_config, mesh_config, train_ids, vocab_size, seed=0, mlm_probability=0.15,
          progress=None, masking='token', span_length=0):
  """Train one model; returns (ModelConfig, params, seconds, final train loss).

  `train.steps_per_call` K > 1 runs K steps per jitted call (a lax.scan over K pre-drawn
  batches): the same steps, one dispatch and one set of step buffers per K of them.
  `progress(steps_done, metrics)`, if given, is called once per call with that call's metrics
  (the last step's loss is `metrics['loss'][-1]`), one call late so that reading them never
  holds up the next dispatch; the last call's when training ends.
  """
  cfg = ModelConfig.from_config({**family_config.model.to_dict(), 'vocab_size': vocab_size})
  t = family_config.train.to_dict()
  k = t.pop('steps_per_call')   # the experiment's one key beside the train section's
  if isinstance(k, bool) or not isinstance(k, int) or k < 1:
    raise ValueError(f'train.steps_per_call={k!r}; expected a positive integer')
  t = TrainConfig.from_config(t)
  length, batch = cfg.max_len, t.batch_size
  mesh = mesh_lib.make_mesh(MeshConfig.from_config(mesh_config))
  trainer = step_lib.make_steps(cfg, t, mesh, init_length=length)
  make = batch_maker(family_of(cfg).pretrain_objective(cfg), train_ids, length, batch, vocab_size,
                     np.random.default_rng(seed), mlm_probability, masking, span_length)
  start = time.perf_counter()
  state = trainer.create_state(t.seed)
  done, unreported = 0, None
  while done < t.steps:
    n = min(k, t.steps - done)
    if n == 1:
      state, metrics = trainer.train_step(state, make())
    else:
      state, metrics = trainer.scan_steps(state, _stacked(make, n))
    if progress is not None and unreported is not None:
      progress(*unreported)
    done += n
    unreported = (done, metrics)
  jax.block_until_ready(state)
  if progress is not None:
    progress(*unreported)
  return cfg, state.params, time.perf_counter() - start, float(np.ravel(metrics['loss'])[-1])


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


def mlm_eval_batch(ids, length, vocab_size, seed, probability) -> dict:
  """Every non-overlapping window of `ids`, masked with a fixed seed."""
  return _mlm_batch(_windows(ids, length), np.random.default_rng(seed), vocab_size,
                    vocab_size - 1, probability)


def topk_accuracy(logits, batch) -> dict:
  """Top-1 / top-5 accuracy and the mean cross-entropy (nats) of (W, T, V) logits on the
  batch's loss-weighted positions."""
  selected = batch['loss_weights'] > 0
  chosen = np.asarray(logits, np.float64)[selected]                               # (M, V)
  top5 = np.argsort(-chosen, axis=-1, kind='stable')[:, :5]                       # (M, 5)
  targets = batch['targets'][selected]
  shifted = chosen - chosen.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  return {'top1': float(np.mean(top5[:, 0] == targets)),
          'top5': float(np.mean(np.any(top5 == targets[:, None], axis=1))),
          'loss': float(-np.mean(log_probs[np.arange(len(targets)), targets])),
          'masked_positions': int(selected.sum())}


def check_draws(draws):
  if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
    raise ValueError(f'eval_draws={draws!r}; expected a positive number of maskings')


def mlm_draws(logits_of, ids, length, vocab_size, seed, probability, draws=1) -> dict:
  """Held-out top-1 / top-5 over `draws` maskings of the same windows (seeds seed, seed + 1,
  ...). `logits_of(inputs (W, T)) -> (W, T, V)` is the model, any framework.

  Returns the first draw's numbers (top1, top5, masked_positions: the protocol's one fixed
  masking) and, over all draws, their means (top1_mean, top5_mean), the draw-to-draw standard
  deviation (top1_draw_std, top5_draw_std: how far one masking's number may sit from the
  mean) and the mean's standard error (top1_se, top5_se).
  """
  check_draws(draws)
  results = []
  for i in range(draws):
    batch = mlm_eval_batch(ids, length, vocab_size, seed + i, probability)
    results.append(topk_accuracy(logits_of(batch['inputs']), batch))
  out = dict(results[0], draws=draws)
  for key in ('top1', 'top5'):
    values = np.array([r[key] for r in results])
    std = float(values.std(ddof=1)) if draws > 1 else 0.0
    out.update({f'{key}_mean': float(values.mean()), f'{key}_draw_std': std,
                f'{key}_se': std / np.sqrt(draws)})
  return out


def draws_line(result) -> str:
  """One line on how much the held-out numbers move with the masking drawn."""
  r = {k: result[f'heldout_{k}'] for k in DRAW_KEYS}
  return (f"     over {r['draws']} maskings of the held-out windows: top-1 "
          f"{r['top1_mean']:.3f} +- {r['top1_se']:.3f} (one masking's spread "
          f"{r['top1_draw_std']:.3f}), top-5 {r['top5_mean']:.3f} +- {r['top5_se']:.3f} "
          f"({r['top5_draw_std']:.3f})")


def evaluate_bert(cfg, params, ids, seed, probability, draws=1) -> dict:
  logits = jax.jit(lambda p, x: _lm_logits(cfg, p, x))
  return mlm_draws(lambda inputs: logits(params, inputs), ids, cfg.max_len, cfg.vocab_size,
                   seed, probability, draws)


def _lm_logits(cfg, params, inputs):
  out = build(cfg).apply({'params': params}, inputs)
  return out[0] if isinstance(out, tuple) else out      # BERT: (mlm, nsp); gpt stack: logits


def load_splits(config):
  """(vocabulary, {'train', 'valid', 'heldout': ids}) of the protocol's corpus."""
  with open(config.corpus, encoding='utf-8') as f:  # noqa: PTH123 (the bundled local corpus)
    text = f.read()
  end = config.heldout_chars[1]
  if len(text) < end:
    raise ValueError(f'corpus {config.corpus!r} has {len(text)} characters; the protocol '
                     f'needs at least {end}')
  vocab = char_vocab(text[:end])
  ids = encode(text[:end], vocab)
  def cut(span):
    return ids[span[0]:span[1]]
  return vocab, {'train': cut(config.train_chars), 'valid': cut(config.valid_chars),
                 'heldout': cut(config.heldout_chars)}


def _with_seed(family_config, seed):
  out = family_config.copy_and_resolve_references()
  out.train.seed = family_config.train.seed + seed
  return out


MODELS = ('gpt', 'bert')


def models_of(config) -> tuple:
  """config.models ('gpt,bert', 'bert', ...) as a tuple; a one-line error for another name."""
  names = tuple(m.strip() for m in config.models.split(',') if m.strip())
  if not names or any(m not in MODELS for m in names) or len(set(names)) != len(names):
    raise ValueError(f'models={config.models!r}; expected distinct comma-separated names of '
                     f'{", ".join(MODELS)}')
  return names


def _gpt(config, ids, vocab_size, seed, progress):
  """(eval config, params, results) of the GPT side of the protocol."""
  cfg, params, seconds, train_loss = train(_with_seed(config.gpt, seed), config.mesh,
                                           ids['train'], vocab_size, seed, progress=progress)
  cfg = cfg.replace(deterministic=True)
  valid = evaluate_gpt(cfg, params, ids['valid'])
  full = evaluate_gpt(cfg, params, ids['valid'], stride=1)
  return cfg, params, {'steps': config.gpt.train.steps, 'train_seconds': round(seconds, 2),
                       'final_train_loss': train_loss, 'valid_perplexity': valid['perplexity'],
                       'valid_loss': valid['loss'], 'valid_accuracy': valid['accuracy'],
                       # every character predicted from its full 48-character context
                       'valid_perplexity_full_context': full['perplexity']}


def _bert(config, ids, vocab_size, seed, progress):
  """(eval config, params, results) of the BERT side of the protocol."""
  cfg, params, seconds, train_loss = train(
      _with_seed(config.bert, seed), config.mesh, ids['train'], vocab_size, seed,
      mlm_probability=config.mlm_probability, progress=progress, masking=config.masking,
      span_length=config.span_length)
  cfg = cfg.replace(deterministic=True)
  heldout = ids['heldout']
  bert = evaluate_bert(cfg, params, heldout, config.eval_seed, config.mlm_probability,
                       config.eval_draws)
  random_params = state_lib.run_once(lambda key: build(cfg).init(key, heldout[None, :48]),
                                     jax.random.key(1))['params']
  random_init = evaluate_bert(cfg, nn.unbox(random_params), heldout, config.eval_seed,
                              config.mlm_probability)
  return cfg, params, {
      'steps': config.bert.train.steps, 'train_seconds': round(seconds, 2),
      'final_train_loss': train_loss, 'masking': config.masking,
      'heldout_top1': bert['top1'], 'heldout_top5': bert['top5'],
      'heldout_loss': bert['loss'],
      # the same windows masked `draws` times: means, spread of one draw, SE
      **{f'heldout_{k}': bert[k] for k in DRAW_KEYS},
      'random_init_top1': random_init['top1'], 'random_init_top5': random_init['top5'],
      'masked_positions': bert['masked_positions']}


def check_finetune(ft) -> None:
  """config.finetune's numbers, checked before minutes of pre-training."""
  for name, least in (('steps', 0), ('batch_size', 1), ('train_examples', 1),
                      ('eval_examples', 1)):
    value = ft[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
      raise ValueError(f'finetune.{name}={value!r}; expected an integer >= {least}')
  if not ft.learning_rate > 0:
    raise ValueError(f'finetune.learning_rate={ft.learning_rate!r}; expected a positive rate')
  if ft.scratch and ft.steps < 1:
    raise ValueError('finetune.scratch=True fine-tunes the random-init models; expected '
                     'finetune.steps >= 1')


def finetune_all(config, vocab, ids, trained: dict, seed: int) -> dict:
  """{name: char_transfer.finetune's result} for each trained (eval config, params): the same
  word-order windows, pooling, head and recipe for every model."""
  ft = config.finetune
  if ' ' not in vocab:
    raise ValueError('finetune.steps > 0 shuffles words between spaces; the corpus has none')
  length = min(cfg.max_len for cfg, _ in trained.values())
  train_set = char_transfer.word_order_examples(ids['train'], ft.train_examples, length,
                                                vocab.index(' '), seed=ft.seed + seed)
  eval_set = char_transfer.word_order_examples(ids['heldout'], ft.eval_examples, length,
                                               vocab.index(' '), seed=ft.seed + seed + 1)
  return {name: char_transfer.finetune(cfg, params, train_set, eval_set, steps=ft.steps,
                                       batch_size=ft.batch_size,
                                       learning_rate=ft.learning_rate, seed=ft.seed + seed)
          for name, (cfg, params) in trained.items()}


def _init(cfg, inputs, key):
  return build(cfg).init(key, inputs)


def _scratch(config, models, vocab, ids, seed) -> dict:
  """The fine-tuning baseline: each model's architecture from its random init (no
  pre-training), fine-tuned as finetune_all fine-tunes the pre-trained ones."""
  trained = {}
  for name in models:
    family = config[name]
    cfg = ModelConfig.from_config({**family.model.to_dict(), 'vocab_size': len(vocab)})
    cfg = cfg.replace(deterministic=True)
    trained[name] = cfg, nn.unbox(state_lib.run_once(
        functools.partial(_init, cfg, ids['train'][None, :cfg.max_len]),
        jax.random.key(family.train.seed + seed))['params'])
  results = finetune_all(config, vocab, ids, trained, seed)
  return {'vocab_size': len(vocab), 'seed': seed, 'scratch': True,
          **{name: {'finetune': r} for name, r in results.items()}}


def run(config, progress=None) -> dict:
  """The whole protocol; returns the numbers the script prints. `config.seed` shifts every
  seed (data windows, masking, initialisation, dropout, the fine-tuning task and head) for a
  run-to-run spread. `config.models` picks GPT, BERT or both; `config.finetune.steps` > 0
  fine-tunes each (`finetune` in its results); `config.finetune.scratch` fine-tunes their
  random inits instead, with no pre-training (the baseline). `progress(name, steps,
  characters_per_step)`, if given, returns train()'s progress callback for the model named
  'GPT' or 'BERT'."""
  check_draws(config.eval_draws)      # before minutes of training, not after
  check_finetune(config.finetune)
  models = models_of(config)
  if config.masking not in MASKINGS:
    raise ValueError(f'masking={config.masking!r}; expected one of {MASKINGS}')
  vocab, ids = load_splits(config)
  seed = config.seed
  if config.finetune.scratch:
    return _scratch(config, models, vocab, ids, seed)

  def report(name, family):
    return progress and progress(name, family.train.steps,
                                 family.train.batch_size * family.model.max_len)
  out, trained = {'vocab_size': len(vocab), 'seed': seed}, {}
  if 'gpt' in models:
    *trained['gpt'], out['gpt'] = _gpt(config, ids, len(vocab), seed, report('GPT', config.gpt))
  if 'bert' in models:
    *trained['bert'], out['bert'] = _bert(config, ids, len(vocab), seed,
                                          report('BERT', config.bert))
  if config.finetune.steps > 0:
    for name, result in finetune_all(config, vocab, ids, trained, seed).items():
      out[name]['finetune'] = result
  return out
