"""Mask builders against literal small matrices."""
import numpy as np
import jax.numpy as jnp

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
