"""A causal LM's log-likelihood of continuations: zero- and few-shot classification, and the
evaluation of a GPT fine-tuned in the generation format, rank a task's labels by it.

    loglik(label | context) = sum over the label's tokens of log p(token | the tokens before)

The prompt and the label's text are data/prompts.py's. Two decisions, as lm-evaluation-harness
makes them for multiple-choice tasks:

    acc       argmax over the labels of loglik
    acc_norm  argmax over the labels of loglik / len(label) in characters (the harness's
              acc_norm: `completion_len = len(choice)`, the label without the space before it),
              so a label of more pieces is not penalised for its length

A prefix LM (model.prefix_lm) reads the context as its bidirectional prefix, as it pre-trained;
the label is read left to right.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from pretrain_jax.data import prompts
from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.training import task as task_lib


def continues_text(cfg: ModelConfig) -> bool:
  """`cfg` is a causal LM whose continuations have a likelihood: the GPT family (prefix LMs
  included), not a bidirectional stack or a fine-tuned classifier."""
  return family_of(cfg).generation == 'continue' and cfg.causal and not cfg.num_classes


def check_scores(cfg: ModelConfig, what: str, where: str = 'this checkpoint') -> None:
  """A one-line error unless continues_text(cfg), naming what `cfg` is instead."""
  if family_of(cfg).generation != 'continue' or not cfg.causal:
    kind = cfg.family if cfg.causal else f'{cfg.family} (causal=False)'
    raise ValueError(f'{what} needs a causal language model (the gpt family, prefix LMs '
                     f'included); {where} is {kind}')
  if cfg.num_classes:
    raise ValueError(f'{what} needs a language model; {where} is a fine-tuned classifier '
                     f'(model.num_classes={cfg.num_classes}): expected the checkpoint it was '
                     'tuned from')


@functools.partial(jax.jit, static_argnames=('cfg',))
def _sums(params, cfg: ModelConfig, batch):
  """(B,) summed log-probabilities of the weighted targets of a right-padded batch."""
  model = build(cfg)
  logits = model.apply({'params': params}, batch['inputs'], segment_ids=batch['segment_ids'],
                       positions=batch['positions'], prefix=batch.get('prefix'))   # (B, T, V)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  picked = jnp.take_along_axis(logp, batch['targets'][..., None], axis=-1)[..., 0]  # (B, T)
  return jnp.sum(picked * batch['weights'], axis=-1)


def _width(longest: int, limit: int) -> int:
  """The padded row length: a power of two from 16, at most `limit`, so a few programs serve
  rows of every length."""
  return min(max(16, 1 << (longest - 1).bit_length()), limit)


def loglikelihoods(params, cfg: ModelConfig, rows: list, *, pad_id: int = 0,
                   batch_size: int = 32) -> np.ndarray:
  """(N,) float64: for each (ids, context tokens) of `rows` (prompts.encode_choice), the
  summed log-probability of ids[n:] given what precedes each."""
  cfg = cfg.replace(deterministic=True, decode=False)
  out = []
  for start in range(0, len(rows), batch_size):
    part = rows[start:start + batch_size]
    width = _width(max(len(ids) - 1 for ids, _ in part), max(cfg.max_len, 1))
    shape = (batch_size, width)
    batch = {k: np.zeros(shape, np.int32) for k in ('inputs', 'targets', 'segment_ids',
                                                     'positions', 'prefix')}
    batch['inputs'][:] = pad_id
    batch['weights'] = np.zeros(shape, np.float32)
    for i, (ids, n_context) in enumerate(part):
      length = len(ids) - 1
      if length > width:
        raise ValueError(f'a prompt and its continuation are {len(ids)} tokens; the model '
                         f'reads at most {cfg.max_len + 1}')
      batch['inputs'][i, :length], batch['targets'][i, :length] = ids[:-1], ids[1:]
      batch['segment_ids'][i, :length] = 1
      batch['positions'][i, :length] = np.arange(length)
      batch['weights'][i, n_context - 1:length] = 1.0
      batch['prefix'][i, :n_context] = 1
    if not cfg.prefix_lm:
      del batch['prefix']
    sums = _sums(params, cfg, {k: jnp.asarray(v) for k, v in batch.items()})
    out.append(np.asarray(jax.device_get(sums), np.float64)[:len(part)])
  return np.concatenate(out) if out else np.zeros((0,), np.float64)


def rank(logliks, labels) -> tuple:
  """(N, C) log-likelihoods of the C `labels` -> (pred, pred_norm), each (N,) class indices:
  the argmax of loglik, and of loglik / len(label) in characters (acc_norm)."""
  logliks = np.asarray(logliks, np.float64)
  lengths = np.array([max(len(label), 1) for label in labels], np.float64)
  return np.argmax(logliks, -1), np.argmax(logliks / lengths, -1)


def class_scores(truth, pred, classes: int) -> dict:
  """Accuracy, Matthews correlation and F1 (training/task.confusion_metrics) of (N,) ids."""
  confusion = np.zeros((classes, classes), np.float32)
  np.add.at(confusion, (np.asarray(truth), np.asarray(pred)), 1.0)
  out = task_lib.confusion_metrics(jnp.asarray(confusion))
  return {'accuracy': float(np.mean(np.asarray(truth) == np.asarray(pred))),
          **{k: float(v) for k, v in out.items()}}


def choice_rows(tokenizer, contexts: list, labels, length: int):
  """Every (context, label) pair encoded (prompts.encode_choice) at most `length` tokens, the
  labels of one context together; returns (rows, how many contexts were cut)."""
  rows, cut = [], 0
  for text in contexts:
    for label in labels:
      ids, n_context, was_cut = prompts.encode_choice(tokenizer, text,
                                                      prompts.continuation(label), length)
      rows.append((ids, n_context))
    cut += was_cut
  return rows, cut


def score_labels(params, cfg: ModelConfig, tokenizer, contexts: list, labels, truth, *,
                 length: int = 0, batch_size: int = 32) -> dict:
  """Ranks `labels` after each of `contexts` (at most `length` tokens with the label; 0 = the
  model's max_len + 1): {acc, acc_norm, mcc, f1 (of acc's predictions), mcc_norm, f1_norm,
  examples, truncated, pred, pred_norm}. `truth`: (N,) class ids."""
  rows, cut = choice_rows(tokenizer, contexts, labels, length or cfg.max_len + 1)
  logliks = loglikelihoods(params, cfg, rows, pad_id=tokenizer.pad_id,
                           batch_size=batch_size).reshape(len(contexts), len(labels))
  pred, pred_norm = rank(logliks, labels)
  plain, norm = (class_scores(truth, p, len(labels)) for p in (pred, pred_norm))
  return {'acc': plain['accuracy'], 'acc_norm': norm['accuracy'], 'mcc': plain['mcc'],
          'f1': plain['f1'], 'mcc_norm': norm['mcc'], 'f1_norm': norm['f1'],
          'examples': len(contexts), 'truncated': cut, 'pred': pred, 'pred_norm': pred_norm}


def fewshot(params, cfg: ModelConfig, tokenizer, task, *, shots: int, question: str,
            split: str = 'validation', max_examples: int = 0, seed: int = 0,
            batch_size: int = 32) -> dict:
  """Zero- (shots=0) or few-shot classification of `split` of a labelled `task`
  (data/tasks.Task): each example's prompt after `shots` examples drawn from the training
  split (prompts.draw_shots); see score_labels for what it returns (less the predictions)."""
  if not task.labels:
    raise ValueError(f'task {task.name!r} is text to text (inputs/targets); scoring ranks '
                     'labels: expected a task with text and label columns')
  if split not in task.splits:
    raise ValueError(f'split {split!r}; task {task.name!r} has {sorted(task.splits)}')
  examples = task.splits[split][:max_examples or None]
  contexts = [prompts.fewshot_context(ex, prompts.draw_shots(task.splits['train'], shots,
                                                             seed, i), question)
              for i, ex in enumerate(examples)]
  truth = np.array([task.labels.index(ex['label']) for ex in examples])
  out = score_labels(params, cfg, tokenizer, contexts, task.labels, truth,
                     batch_size=batch_size)
  return dict({k: v for k, v in out.items() if not k.startswith('pred')}, shots=shots)
