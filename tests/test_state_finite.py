"""training.step.all_finite: the train step's `state_finite`, which keeps a NaN/inf state
out of every checkpoint."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pretrain_jax.training.step import all_finite


def _tree(value=None, where=('params', 'w')):
  tree = {'params': {'w': jnp.ones((64, 33)), 'b': jnp.zeros((33,), jnp.bfloat16)},
          'opt': {'nu': jnp.full((5,), 3e38), 'count': jnp.asarray(7, jnp.int32)}}
  if value is not None:
    leaf = tree[where[0]][where[1]]
    tree[where[0]][where[1]] = leaf.at[(0,) * leaf.ndim].set(value)
  return tree


def test_finite_state_is_finite_even_near_the_float32_limit():
  assert bool(jax.jit(all_finite)(_tree()))         # 3e38 values: no overflow in the check
  assert bool(jax.jit(all_finite)({'step': jnp.asarray(3)}))   # no float leaves at all


@pytest.mark.parametrize('value', [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize('where', [('params', 'w'), ('params', 'b'), ('opt', 'nu')])
def test_one_non_finite_element_anywhere_is_caught(value, where):
  assert not bool(jax.jit(all_finite)(_tree(value, where)))
