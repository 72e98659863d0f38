"""Key/value-cache decoding equals the full forward; scanned layers equal unrolled ones.

The calls are jitted (one compile per shape instead of one per operation): the same model code
either way, and the checks compare two jitted paths."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from modeling import forward, init, tiny, tokens

from pretrain_jax.models import build


def _cache(cfg, batch, max_len, encoder_len=None):
  """The decoding config and its empty cache. The init is jitted and returns the cache alone,
  so XLA drops the parameters' initialisation (a compile per parameter, or eagerly an op at a
  time) that the cache does not read."""
  dcfg = cfg.replace(decode=True)
  dummy = jnp.ones((batch, max_len), jnp.int32)
  args = (jnp.ones((batch, encoder_len), jnp.int32), dummy) if cfg.family == 't5' else (dummy,)
  return dcfg, jax.jit(lambda *a: build(dcfg).init(jax.random.key(0), *a)['cache'])(*args)


@pytest.mark.parametrize('scan', [False, True])
def test_gpt_cached_decode_matches_full_forward(scan):
  cfg = tiny('gpt', scan_layers=scan)
  params = init(cfg)
  x = tokens((2, 10), 3)
  full = _forward(cfg, params, x)
  dcfg, cache = _cache(cfg, 2, 16)
  apply = _apply(dcfg)
  # Prefill 4 tokens at once, then one token per call.
  logits, mut = apply({'params': params, 'cache': cache}, x[:, :4])
  steps = [logits]
  for t in range(4, 10):
    logits, mut = apply({'params': params, 'cache': mut['cache']}, x[:, t:t + 1])
    steps.append(logits)
  np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)


def test_gpt_left_padded_prompts_decode_like_unpadded():
  cfg = tiny('gpt')
  params = init(cfg)
  x = tokens((1, 6), 4)
  full = _forward(cfg, params, x)
  dcfg, cache = _cache(cfg, 1, 12)
  padded = jnp.concatenate([jnp.zeros((1, 3), jnp.int32), x[:, :4]], axis=1)
  seg = jnp.array([[0, 0, 0, 1, 1, 1, 1]])
  apply = _apply(dcfg)
  logits, mut = apply({'params': params, 'cache': cache}, padded, segment_ids=seg)
  np.testing.assert_allclose(logits[:, 3:], full[:, :4], atol=1e-5)
  for t in (4, 5):
    logits, mut = apply({'params': params, 'cache': mut['cache']}, x[:, t:t + 1])
    np.testing.assert_allclose(logits[:, 0], full[:, t], atol=1e-5)


def test_t5_cached_decode_matches_full_forward():
  cfg = tiny('t5')
  params = init(cfg)
  enc, dec = tokens((2, 9), 5), tokens((2, 7), 6)
  full = _forward(cfg, params, enc, dec)
  dcfg, cache = _cache(cfg, 2, 8, encoder_len=9)
  encoded = jax.jit(functools.partial(build(dcfg).apply, method='encode'))({'params': params},
                                                                            enc)
  steps, variables = [], {'params': params, 'cache': cache}
  decode = _apply(dcfg, method='decode')
  for t in range(7):
    logits, mut = decode(variables, encoded, dec[:, t:t + 1])
    variables = {'params': params, 'cache': mut['cache']}
    steps.append(logits)
  np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)


def _forward(cfg, params, *args):
  return jax.jit(functools.partial(forward, cfg))(params, *args)


def _apply(dcfg, **kw):
  """The decoding model's apply, jitted, returning (logits, the updated variables)."""
  return jax.jit(functools.partial(build(dcfg).apply, mutable=['cache'], **kw))


def _stack_layers(params, prefix):
  """{prefix_0: t0, prefix_1: t1, ...} -> {prefix: stacked} (the nn.scan layout)."""
  layers = sorted((k for k in params if k.startswith(prefix + '_')),
                  key=lambda k: int(k.rsplit('_', 1)[1]))
  out = {k: v for k, v in params.items() if k not in layers}
  out[prefix] = jax.tree.map(lambda *xs: jnp.stack(xs), *[params[k] for k in layers])
  return out


@pytest.mark.parametrize('family,prefix,options', [
    ('gpt', 'h', {}), ('bert', 'layer', {}),
    ('bert', 'layer', dict(position_embedding='alibi', alibi_bias_max=1.0))])
def test_scanned_layers_equal_unrolled_layers(family, prefix, options):
  cfg = tiny(family, **options)
  params = init(cfg)
  x = tokens((2, 10), 7)
  stacked = _stack_layers(params, prefix)
  unrolled = _forward(cfg, params, x)
  for remat in ('none', 'full'):
    scanned = cfg.replace(scan_layers=True, remat=remat)
    np.testing.assert_allclose(_forward(scanned, stacked, x), unrolled, atol=1e-5)
