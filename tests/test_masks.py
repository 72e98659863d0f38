"""Mask builders and the AttentionMask value against literal small matrices."""
import jax.numpy as jnp
import numpy as np
import pytest

from pretrain_jax.models import masks


def test_causal_mask_literal():
  np.testing.assert_array_equal(masks.causal_mask(3)[0, 0], [[1, 0, 0], [1, 1, 0], [1, 1, 1]])


def test_causal_mask_with_offset_over_a_cache():
  # Two new queries at cache slots 2 and 3 of a 5-slot cache.
  np.testing.assert_array_equal(masks.causal_mask(2, 5, offset=2)[0, 0],
                                [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])


def test_segment_mask_packing_and_padding_literal():
  m = masks.segment_mask(jnp.array([[1, 1, 2, 0]]))
  assert m.shape == (1, 1, 4, 4)
  np.testing.assert_array_equal(m[0, 0], [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]])


def test_cross_mask_literal():
  m = masks.cross_mask(jnp.array([[1, 2, 0]]), jnp.array([[1, 1, 2, 2, 0]]))
  assert m.shape == (1, 1, 3, 5)
  np.testing.assert_array_equal(m[0, 0], [[1, 1, 0, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 0]])


def test_combine_masks_is_and_and_ignores_none():
  combined = masks.combine_masks(masks.causal_mask(4), None,
                                 masks.segment_mask(jnp.array([[1, 1, 2, 2]])))
  np.testing.assert_array_equal(combined[0, 0],
                                [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]])
  assert masks.combine_masks(None, None) is None


def test_prefix_mask_literal():
  np.testing.assert_array_equal(masks.prefix_mask(jnp.array([[1, 1, 0]]))[0, 0],
                                [[1, 1, 0], [1, 1, 0], [0, 0, 0]])


def test_attention_mask_prefix_lm_worked_example():
  """The docstring's example: a prefix sees itself both ways, the rest causally."""
  mask = masks.AttentionMask(q_segment_ids=jnp.array([[1, 1, 1, 2, 2, 0]]), causal=True,
                             prefix=jnp.array([[1, 1, 0, 1, 0, 0]]))
  np.testing.assert_array_equal(mask.dense(6, 6)[0, 0], [[1, 1, 0, 0, 0, 0],
                                                         [1, 1, 0, 0, 0, 0],
                                                         [1, 1, 1, 0, 0, 0],
                                                         [0, 0, 0, 1, 0, 0],
                                                         [0, 0, 0, 1, 1, 0],
                                                         [0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(mask.rows_that_see(6, 6)[0, :, 0], [1, 1, 1, 1, 1, 0])


def test_attention_mask_is_the_builders_it_is_made_of():
  seg, enc = jnp.array([[1, 1, 2, 0]]), jnp.array([[1, 2, 2]])
  bert = masks.AttentionMask(q_segment_ids=seg)
  gpt = masks.AttentionMask(q_segment_ids=seg, causal=True)
  cross = masks.AttentionMask(q_segment_ids=seg, kv_segment_ids=enc)
  np.testing.assert_array_equal(bert.dense(4, 4), masks.segment_mask(seg))
  np.testing.assert_array_equal(gpt.dense(4, 4), masks.combine_masks(masks.segment_mask(seg),
                                                                     masks.causal_mask(4)))
  np.testing.assert_array_equal(gpt.dense(4, 4, causal=False), masks.segment_mask(seg))
  np.testing.assert_array_equal(cross.dense(4, 3), masks.cross_mask(seg, enc))
  np.testing.assert_array_equal(cross.rows_that_see(4, 3)[0, :, 0], [1, 1, 1, 0])
  assert masks.AttentionMask().dense(3, 3) is None
  assert masks.AttentionMask().rows_that_see(3, 3) is None
  np.testing.assert_array_equal(masks.AttentionMask(causal=True).dense(2, 2)[0, 0],
                                [[1, 0], [1, 1]])


def test_attention_mask_refuses_a_prefix_without_causal_self_attention():
  with pytest.raises(ValueError, match=r'AttentionMask\.prefix .*causal=False'):
    masks.AttentionMask(q_segment_ids=jnp.ones((1, 2)), prefix=jnp.ones((1, 2))).dense(2, 2)
  with pytest.raises(ValueError, match=r'kv_segment_ids given'):
    masks.AttentionMask(q_segment_ids=jnp.ones((1, 2)), kv_segment_ids=jnp.ones((1, 2)),
                        causal=True, prefix=jnp.ones((1, 2))).check()
