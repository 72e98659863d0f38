"""Autoregressive generation for GPT (continuation) and T5 (span filling), with the KV cache.

Everything is one jitted `lax.while_loop`; sampling is greedy (temperature 0), temperature,
top-k and top-p (nucleus), reproducible from a PRNG key, stopping at EOS or max length.
"""
import functools

import jax
import jax.numpy as jnp

from pretrain_jax.models import ModelConfig, build, masks


def sample_logits(logits, rng, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0):
  """(B, V) logits -> (B,) ids. temperature 0 = greedy; top_k 0 and top_p 1 = no filtering."""
  logits = logits.astype(jnp.float32)
  if temperature == 0.0:
    return jnp.argmax(logits, axis=-1)
  logits = logits / temperature
  neg = jnp.finfo(jnp.float32).min
  if top_k > 0:
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]                        # (B, 1)
    logits = jnp.where(logits < kth, neg, logits)
  if top_p < 1.0:
    # Keep the smallest set of ids whose mass reaches top_p (the most likely always stays): a
    # token stays when the mass ranked above it is below top_p. Ties rank by id, so tokens tied
    # with the last one kept are not all kept (with bf16 logits ties are common).
    order = jnp.argsort(-logits, axis=-1, stable=True)                   # (B, V) ids by rank
    probs = jax.nn.softmax(jnp.take_along_axis(logits, order, axis=-1), axis=-1)
    cum = jnp.cumsum(probs, axis=-1)
    above = jnp.concatenate([jnp.full_like(cum[:, :1], -1.0), cum[:, :-1]], axis=-1)  # first: kept
    keep = jnp.take_along_axis(above < top_p, jnp.argsort(order, axis=-1), axis=-1)
    logits = jnp.where(keep, logits, neg)
  return jax.random.categorical(rng, logits, axis=-1)


def _loop(step_fn, first_token, state, rng, max_new_tokens, eos_id, pad_id, sampling):
  """Shared sampling loop: step_fn(state, token (B,)) -> (logits (B, V), state)."""
  batch = first_token.shape[0]
  out = jnp.full((batch, max_new_tokens), pad_id, jnp.int32)
  if not max_new_tokens:   # (the body would still be traced, indexing a width-0 array)
    return out

  def cond(carry):
    i, _, _, done, _, _ = carry
    return (i < max_new_tokens) & ~jnp.all(done)

  def body(carry):
    i, token, state, done, out, rng = carry
    logits, state = step_fn(state, token)
    rng, sub = jax.random.split(rng)
    new = sample_logits(logits, sub, **sampling).astype(jnp.int32)
    new = jnp.where(done, pad_id, new)
    out = out.at[:, i].set(new)
    return i + 1, new, state, done | (new == eos_id), out, rng

  carry = (0, first_token, state, jnp.zeros(batch, bool), out, rng)
  return jax.lax.while_loop(cond, body, carry)[4]


def _prompt_prefix(cfg: ModelConfig, prompt_segment_ids) -> dict:
  """A prefix LM's model keyword: the prompt's real tokens are its prefix."""
  return {'prefix': (prompt_segment_ids > 0).astype(jnp.int32)} if cfg.prefix_lm else {}


@functools.partial(jax.jit, static_argnames=('cfg', 'max_new_tokens', 'eos_id', 'pad_id',
                                             'temperature', 'top_k', 'top_p', 'use_cache'))
def gpt_generate(params, cfg: ModelConfig, prompts, prompt_segment_ids, rng, *,
                 max_new_tokens: int, eos_id: int = -1, pad_id: int = 0,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 use_cache: bool = True):
  """Continue left-padded prompts. A prefix LM (cfg.prefix_lm) reads its prompt as the
  bidirectional prefix it was trained with; the continuation attends causally.

  Args:
    prompts: (B, P) ids, left-padded; prompt_segment_ids (B, P): 1 on real tokens, 0 on padding.
  Returns:
    (B, max_new_tokens) new ids; after EOS a row holds pad_id.
  """
  cfg = cfg.replace(deterministic=True)
  sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
  batch, plen = prompts.shape
  total = plen + max_new_tokens
  if cfg.position_embedding == 'learned' and total > cfg.max_len:
    raise ValueError(f'prompt length {plen} + max_new_tokens {max_new_tokens} = {total} '
                     f'exceeds the model\'s max_len {cfg.max_len}')
  rng, first_rng = jax.random.split(rng)
  if use_cache:
    model = build(cfg.replace(decode=True))
    cache = model.init(jax.random.key(0), jnp.ones((batch, total), jnp.int32))['cache']
    logits, mut = model.apply({'params': params, 'cache': cache}, prompts,
                              segment_ids=prompt_segment_ids, mutable=['cache'],
                              **_prompt_prefix(cfg, prompt_segment_ids))

    def step(cache, token):
      logits, mut = model.apply({'params': params, 'cache': cache}, token[:, None],
                                mutable=['cache'])
      return logits[:, -1], mut['cache']
    state = mut['cache']
  else:  # full forward over a fixed buffer each step: the reference the cache must match
    model = build(cfg)
    tokens = jnp.zeros((batch, total), jnp.int32).at[:, :plen].set(prompts)
    seg = jnp.zeros((batch, total), jnp.int32).at[:, :plen].set(prompt_segment_ids)
    prefix = _prompt_prefix(cfg, seg)             # the prompt's slots only: set before the loop
    logits = model.apply({'params': params}, tokens, segment_ids=seg,
                         positions=masks.positions_from_mask(seg), **prefix)
    logits = logits[:, :plen]

    def step(state, token):
      tokens, seg, i = state
      tokens = tokens.at[:, i].set(token)
      seg = seg.at[:, i].set(1)
      logits = model.apply({'params': params}, tokens, segment_ids=seg,
                           positions=masks.positions_from_mask(seg), **prefix)
      return logits[:, i], (tokens, seg, i + 1)
    state = (tokens, seg, plen)
  first = sample_logits(logits[:, -1], first_rng, **sampling).astype(jnp.int32)
  rest = _loop(step, first, state, rng, max_new_tokens - 1, eos_id, pad_id, sampling)
  out = jnp.concatenate([first[:, None], rest], axis=1)
  after_eos = jnp.cumsum(out == eos_id, axis=1) - (out == eos_id) > 0
  return jnp.where(after_eos, pad_id, out)


@functools.partial(jax.jit, static_argnames=('cfg', 'max_new_tokens', 'eos_id', 'pad_id',
                                             'temperature', 'top_k', 'top_p', 'use_cache'))
def t5_generate(params, cfg: ModelConfig, inputs, input_segment_ids, rng, *,
                max_new_tokens: int, eos_id: int = 1, pad_id: int = 0,
                temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                use_cache: bool = True):
  """Decode targets for (B, S) encoder inputs (segment ids 1 real / 0 pad); start token = pad."""
  cfg = cfg.replace(deterministic=True)
  sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
  batch = inputs.shape[0]
  start = jnp.full((batch,), pad_id, jnp.int32)
  kw = dict(encoder_segment_ids=input_segment_ids)
  if use_cache:
    model = build(cfg.replace(decode=True))
    encoded = model.apply({'params': params}, inputs, encoder_segment_ids=input_segment_ids,
                          method='encode')
    cache = model.init(jax.random.key(0), inputs, jnp.ones((batch, max_new_tokens), jnp.int32),
                       **kw)['cache']

    def step(cache, token):
      logits, mut = model.apply({'params': params, 'cache': cache}, encoded, token[:, None],
                                method='decode', mutable=['cache'], **kw)
      return logits[:, -1], mut['cache']
    state = cache
  else:
    model = build(cfg)

    def step(state, token):
      tokens, i = state
      tokens = tokens.at[:, i].set(token)
      seg = (jnp.arange(max_new_tokens) <= i)[None].astype(jnp.int32).repeat(batch, 0)
      logits = model.apply({'params': params}, inputs, tokens, decoder_segment_ids=seg, **kw)
      return logits[:, i], (tokens, i + 1)
    state = (jnp.zeros((batch, max_new_tokens), jnp.int32), 0)
  return _loop(step, start, state, rng, max_new_tokens, eos_id, pad_id, sampling)
