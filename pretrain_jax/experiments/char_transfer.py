"""The chapter experiment's downstream check: each pre-trained character model fine-tuned with the
SAME pooling and linear head on one labelled task, so the pre-training is the only difference.

Task (word order, on characters): a window of `max_len` characters of the corpus, either as
written or with its space-separated words shuffled (the same characters, the same length; the
label says which), half of each. Training windows come from the training characters, evaluation
windows from the held-out ones. Head: the mean of the final hidden states over the window's
positions (no [CLS] for BERT, no last token for GPT: neither family's own choice), then one
linear layer to 2 logits. Every weight trains (full fine-tuning, Adam, no dropout).
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from pretrain_jax.models import ModelConfig, build


def shuffle_words(window: np.ndarray, space_id: int, rng, tries: int = 5):
  """`window` (L,) ids with its words (runs between `space_id`s) in a random other order, the
  same length; None when no order differs (fewer than two distinct words)."""
  cuts = np.flatnonzero(window == space_id)
  pieces = np.split(window, cuts)
  words = [pieces[0]] + [p[1:] for p in pieces[1:]]
  for _ in range(tries):
    order = rng.permutation(len(words))
    out = np.concatenate([np.concatenate([[space_id], words[i]]) if k else words[i]
                          for k, i in enumerate(order)]).astype(window.dtype)
    if not np.array_equal(out, window):
      return out
  return None


def word_order_examples(ids: np.ndarray, count: int, length: int, space_id: int,
                        seed: int) -> tuple:
  """(inputs (count, length) int32, labels (count,) int32: 1 = words shuffled) of random
  windows of `ids`, each window's label a fair coin."""
  rng = np.random.default_rng(seed)
  inputs, labels = [], []
  while len(inputs) < count:
    start = int(rng.integers(0, len(ids) - length))
    window = ids[start:start + length]
    label = int(rng.random() < 0.5)
    if label:
      window = shuffle_words(window, space_id, rng)
      if window is None:
        continue
    inputs.append(window)
    labels.append(label)
  return np.stack(inputs).astype(np.int32), np.array(labels, np.int32)


def pooled_logits(model, params, inputs):
  """(B, 2) logits: the linear head on the mean of the model's final hidden states."""
  hidden = model.apply({'params': params['backbone']}, inputs, method='hidden')   # (B, T, E)
  pooled = jnp.mean(hidden.astype(jnp.float32), axis=1)                          # (B, E)
  return pooled @ params['head']['kernel'] + params['head']['bias']


def finetune(cfg: ModelConfig, backbone, train: tuple, evaluation: tuple, *, steps: int,
             batch_size: int, learning_rate: float, seed: int) -> dict:
  """Fine-tunes `backbone` (cfg's params) with the pooled linear head on `train` (inputs,
  labels) for `steps` Adam steps (warmup 10%, cosine to 0); returns the accuracy and loss on
  `evaluation` and the final training loss."""
  model = build(cfg.replace(deterministic=True, decode=False))
  key = jax.random.key(seed)
  params = {'backbone': nn.unbox(backbone),
            'head': {'kernel': 0.02 * jax.random.normal(key, (cfg.emb_dim, 2)),
                     'bias': jnp.zeros((2,))}}
  schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, max(steps // 10, 1), steps)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule))
  state = (params, tx.init(params))

  def loss_fn(p, x, y):
    logits = pooled_logits(model, p, x)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))

  @jax.jit
  def step(state, x, y):
    p, opt = state
    loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
    updates, opt = tx.update(grads, opt, p)
    return (optax.apply_updates(p, updates), opt), loss

  rng = np.random.default_rng(seed)
  inputs, labels = train
  loss = None
  for _ in range(steps):
    rows = rng.integers(0, len(inputs), batch_size)
    state, loss = step(state, inputs[rows], labels[rows])
  predict = jax.jit(lambda p, x: pooled_logits(model, p, x))
  x, y = evaluation
  logits = np.concatenate([np.asarray(predict(state[0], x[i:i + 256]))
                           for i in range(0, len(x), 256)])
  eval_loss = float(np.mean(optax.softmax_cross_entropy_with_integer_labels(
      jnp.asarray(logits), jnp.asarray(y))))
  return {'accuracy': float(np.mean(np.argmax(logits, -1) == y)), 'loss': eval_loss,
          'final_train_loss': float(loss) if loss is not None else None,
          'eval_examples': len(y), 'train_examples': len(inputs), 'steps': steps}
