"""Sampling rules and generation: the cache changes nothing; top-k=1 is greedy; seeds repeat."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from modeling import init, tiny, tokens

from pretrain_jax.inference.sampling import gpt_generate, sample_logits, t5_generate
from pretrain_jax.models import build


def test_sample_logits_filters():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
  keys = jax.random.split(jax.random.key(0), 400)
  def draw(**kw):
    return np.array([int(sample_logits(logits, k, temperature=1.0, **kw)[0])
                     for k in keys[:200]])
  assert int(sample_logits(logits, keys[0])[0]) == 0                   # greedy
  assert set(draw(top_k=2)) <= {0, 1} and len(set(draw(top_k=2))) == 2
  assert set(draw(top_p=0.7)) <= {0, 1}                                # 0.5 < 0.7 <= 0.8
  assert set(draw(top_p=0.4)) == {0}                                   # first token always kept
  assert set(draw(top_p=0.0)) == {0}                  # (the API takes 0: the argmax, not id 0)
  assert set(draw(top_p=0.0, top_k=0)) == {0}
  assert int(sample_logits(logits[:, ::-1], keys[0], temperature=1.0, top_p=0.0)[0]) == 3
  assert len(set(draw())) >= 3


@pytest.mark.parametrize('probs, top_p, kept', [
    ([0.4, 0.2, 0.2, 0.2], 0.5, {0, 1}),
    ([0.1, 0.5, 0.1, 0.1, 0.1, 0.1], 0.55, {0, 1}),
    ([0.3] + [0.01] * 70, 0.305, {0, 1}),
])
def test_top_p_keeps_the_smallest_set_when_tokens_tie(probs, top_p, kept):
  """Every token tied with the cutoff logit was kept: [0.3, 70 x 0.01] at top_p 0.305 sampled
  all 71 ids (HF's TopPLogitsWarper keeps 2). Ties rank by id."""
  logits = jnp.log(jnp.array([probs]))
  keys = jax.random.split(jax.random.key(1), 300)
  drawn = {int(sample_logits(logits, k, temperature=1.0, top_p=top_p)[0]) for k in keys}
  assert drawn == kept


def test_prefix_lm_generates_from_its_prompt_as_a_prefix():
  """A prefix LM reads its (left-padded) prompt bidirectionally: the first new token is the
  argmax of the prompt's last logits with the prompt as prefix, with the cache as without."""
  cfg = tiny('gpt', prefix_lm=True)
  params = init(cfg)
  prompts = tokens((2, 5), 1).at[1, :2].set(0)
  seg = jnp.array([[1] * 5, [0, 0, 1, 1, 1]])
  kw = dict(max_new_tokens=6, eos_id=-1)
  cached = gpt_generate(params, cfg, prompts, seg, jax.random.key(0), **kw)
  np.testing.assert_array_equal(
      cached, gpt_generate(params, cfg, prompts, seg, jax.random.key(0), use_cache=False, **kw))
  model = build(cfg)
  positions = jnp.array([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]])
  first = model.apply({'params': params}, prompts, segment_ids=seg, positions=positions,
                      prefix=seg)[:, -1].argmax(-1)
  np.testing.assert_array_equal(cached[:, 0], first)   # the prompt's last logits, read both ways


def test_gpt_greedy_cache_equals_no_cache_and_top1_equals_greedy():
  cfg = tiny('gpt')
  params = init(cfg)
  prompts = tokens((2, 5), 1).at[1, :2].set(0)
  seg = jnp.array([[1] * 5, [0, 0, 1, 1, 1]])
  kw = dict(max_new_tokens=8, eos_id=-1)
  cached = gpt_generate(params, cfg, prompts, seg, jax.random.key(0), **kw)
  uncached = gpt_generate(params, cfg, prompts, seg, jax.random.key(0), use_cache=False, **kw)
  np.testing.assert_array_equal(cached, uncached)
  top1 = gpt_generate(params, cfg, prompts, seg, jax.random.key(5), temperature=1.0, top_k=1,
                      **kw)
  np.testing.assert_array_equal(top1, cached)
  # Sampling is reproducible from the seed and differs across seeds.
  a = gpt_generate(params, cfg, prompts, seg, jax.random.key(1), temperature=2.0, **kw)
  b = gpt_generate(params, cfg, prompts, seg, jax.random.key(1), temperature=2.0, **kw)
  c = gpt_generate(params, cfg, prompts, seg, jax.random.key(2), temperature=2.0, **kw)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


@pytest.mark.parametrize('use_cache', [True, False])
def test_gpt_one_new_token_is_the_first_of_more(use_cache):
  cfg = tiny('gpt')
  params = init(cfg)
  prompts, seg = tokens((2, 4), 3), jnp.ones((2, 4), jnp.int32)
  def gen(n):
    return np.asarray(gpt_generate(params, cfg, prompts, seg, jax.random.key(0),
                                   max_new_tokens=n, use_cache=use_cache))
  one = gen(1)
  assert one.shape == (2, 1)
  np.testing.assert_array_equal(one, gen(4)[:, :1])


def test_gpt_generation_stops_at_eos():
  cfg = tiny('gpt')
  params = init(cfg)
  prompts, seg = tokens((1, 4), 3), jnp.ones((1, 4), jnp.int32)
  greedy = np.asarray(gpt_generate(params, cfg, prompts, seg, jax.random.key(0),
                                   max_new_tokens=6))
  eos = int(greedy[0, 2])
  stopped = np.asarray(gpt_generate(params, cfg, prompts, seg, jax.random.key(0),
                                    max_new_tokens=6, eos_id=eos, pad_id=0))
  first = int(np.argmax(greedy[0] == eos))
  np.testing.assert_array_equal(stopped[0, :first + 1], greedy[0, :first + 1])
  assert np.all(stopped[0, first + 1:] == 0)


def test_t5_greedy_cache_equals_no_cache():
  cfg = tiny('t5')
  params = init(cfg)
  inputs = tokens((2, 7), 4)
  seg = jnp.array([[1] * 7, [1] * 5 + [0] * 2])
  kw = dict(max_new_tokens=6, eos_id=-1)
  cached = t5_generate(params, cfg, inputs, seg, jax.random.key(0), **kw)
  uncached = t5_generate(params, cfg, inputs, seg, jax.random.key(0), use_cache=False, **kw)
  np.testing.assert_array_equal(cached, uncached)
