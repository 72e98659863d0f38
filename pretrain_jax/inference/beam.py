"""Beam search for T5's decoder, on the same KV cache as greedy decoding (sampling.py).

K hypotheses per input are decoded as B*K rows. At each step every hypothesis proposes its V
extensions, scored by the summed log-probability of all its tokens; the K best of the K*V
survive and the cache rows are reordered to follow their parents. A hypothesis that has written
EOS is finished: its only extension is padding at no cost, so it keeps its score and competes
with the live ones for the K places (no length penalty). Two consequences the tests check:
a beam of 1 is greedy decoding, and a beam as wide as the number of distinct hypotheses finds
the most likely sequence of max_new_tokens tokens, as enumerating them all would.
"""
import functools

import jax
import jax.numpy as jnp

from pretrain_jax.models import ModelConfig, build

NEG = -1e9   # the score of an impossible hypothesis (finite: NEG + NEG stays ordered, no NaN)


def _batch_axes(init_cache, rows: int):
  """Per cache leaf, the axis that holds the B*K rows (a scanned stack puts its layers first):
  found by sizing the cache for `rows` and `rows + 1` and comparing their shapes."""
  one, other = (jax.eval_shape(functools.partial(init_cache, n)) for n in (rows, rows + 1))

  def axis(a, b):   # -1: a leaf with no row axis (the cache index)
    differs = [i for i, (x, y) in enumerate(zip(a.shape, b.shape, strict=True)) if x != y]
    return differs[0] if differs else -1
  return jax.tree.map(axis, one, other)


@functools.partial(jax.jit, static_argnames=('cfg', 'beam_size', 'max_new_tokens', 'eos_id',
                                             'pad_id'))
def t5_beam_search(params, cfg: ModelConfig, inputs, input_segment_ids, *, beam_size: int,
                   max_new_tokens: int, eos_id: int = 1, pad_id: int = 0):
  """Decode (B, S) encoder inputs (segment ids 1 real / 0 padding) with `beam_size` beams.

  Returns ((B, max_new_tokens) ids of the best hypothesis, pad_id after its EOS, and (B,) its
  summed log-probability)."""
  cfg = cfg.replace(deterministic=True, decode=True)
  model = build(cfg)
  batch, k, length = inputs.shape[0], beam_size, max_new_tokens
  rows = batch * k
  inputs_k = jnp.repeat(inputs, k, axis=0)                                   # (B*K, S)
  segments_k = jnp.repeat(input_segment_ids, k, axis=0)
  kw = dict(encoder_segment_ids=segments_k)
  encoded = model.apply({'params': params}, inputs_k, method='encode', **kw)  # (B*K, S, E)

  def init_cache(n):
    return model.init(jax.random.key(0), inputs_k[:1].repeat(n, 0),
                      jnp.ones((n, length), jnp.int32),
                      encoder_segment_ids=segments_k[:1].repeat(n, 0))['cache']
  axes = _batch_axes(init_cache, rows)
  cache = init_cache(rows)
  vocab = cfg.vocab_size

  def step(i, carry):
    tokens, scores, done, last, cache = carry   # (B, K, L), (B, K), (B, K), (B*K,), cache
    logits, mut = model.apply({'params': params, 'cache': cache}, encoded, last[:, None],
                              method='decode', mutable=['cache'], **kw)
    logp = jax.nn.log_softmax(logits[:, -1].astype(jnp.float32), -1).reshape(batch, k, vocab)
    finished = jnp.full((vocab,), NEG).at[pad_id].set(0.0)                  # pad, for free
    logp = jnp.where(done[..., None], finished, logp)
    total = (scores[..., None] + logp).reshape(batch, k * vocab)
    scores, best = jax.lax.top_k(total, k)                                 # (B, K)
    parent, token = best // vocab, (best % vocab).astype(jnp.int32)
    tokens = jnp.take_along_axis(tokens, parent[..., None], axis=1).at[:, :, i].set(token)
    done = jnp.take_along_axis(done, parent, axis=1) | (token == eos_id)
    source = (jnp.arange(batch)[:, None] * k + parent).reshape(rows)        # (B*K,)
    cache = jax.tree.map(lambda x, a: x if a < 0 else jnp.take(x, source, axis=a),
                         mut['cache'], axes)
    return tokens, scores, done, token.reshape(rows), cache

  # One live hypothesis to start with: the others score NEG, so the first step's K best are
  # distinct extensions of the start token rather than K copies of one.
  scores = jnp.full((batch, k), NEG).at[:, 0].set(0.0)
  carry = (jnp.full((batch, k, length), pad_id, jnp.int32), scores, jnp.zeros((batch, k), bool),
           jnp.full((rows,), pad_id, jnp.int32), cache)
  tokens, scores, _, _, _ = jax.lax.fori_loop(0, length, step, carry)
  best = jnp.argmax(scores, axis=1)                                          # (B,)
  out = jnp.take_along_axis(tokens, best[:, None, None], axis=1)[:, 0]
  after_eos = jnp.cumsum(out == eos_id, axis=1) - (out == eos_id) > 0
  return jnp.where(after_eos, pad_id, out), jnp.take_along_axis(scores, best[:, None], 1)[:, 0]
