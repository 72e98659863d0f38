"""tuning.all_finite (plain: all(isfinite); CPU: one sum of x - x per leaf): the train step's
`state_finite`, which keeps a NaN/inf state out of every checkpoint."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pretrain_jax.ops import backends

CHECKS = pytest.mark.parametrize(
    'all_finite', [backends.PLAIN.all_finite, backends.CPU.all_finite], ids=['plain', 'cpu'])


def _tree(value=None, where=('params', 'w')):
  tree = {'params': {'w': jnp.ones((64, 33)), 'b': jnp.zeros((33,), jnp.bfloat16)},
          'opt': {'nu': jnp.full((5,), 3e38), 'count': jnp.asarray(7, jnp.int32)}}
  if value is not None:
    leaf = tree[where[0]][where[1]]
    tree[where[0]][where[1]] = leaf.at[(0,) * leaf.ndim].set(value)
  return tree


@CHECKS
def test_finite_state_is_finite_even_near_the_float32_limit(all_finite):
  assert bool(jax.jit(all_finite)(_tree()))         # 3e38 values: no overflow in the check
  assert bool(jax.jit(all_finite)({'step': jnp.asarray(3)}))   # no float leaves at all


@CHECKS
@pytest.mark.parametrize('value', [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize('where', [('params', 'w'), ('params', 'b'), ('opt', 'nu')])
def test_one_non_finite_element_anywhere_is_caught(value, where, all_finite):
  assert not bool(jax.jit(all_finite)(_tree(value, where)))


@CHECKS
def test_complex_leaves_are_checked_in_both_parts(all_finite):
  z = jnp.ones((4,), jnp.complex64)
  assert bool(jax.jit(all_finite)({'z': z}))
  assert not bool(jax.jit(all_finite)({'z': z.at[2].set(complex(1.0, np.inf))}))
  assert not bool(jax.jit(all_finite)({'z': z.at[0].set(complex(np.nan, 0.0))}))


def test_fast_math_cannot_make_the_check_blind(tmp_path):
  """XLA's fast math folds x - x to 0 (measured: the sum form then said a NaN state was
  finite); the check probes for that once and falls back to isfinite."""
  code = ('import jax, jax.numpy as jnp\n'
          'from pretrain_jax.ops import backends, cpu\n'
          'x = jnp.array([1.0, jnp.nan, 2.0])\n'
          'print(bool(jax.jit(backends.CPU.all_finite)({"a": x})), cpu.subtraction_sees_nan())\n')
  env = dict(os.environ, XLA_FLAGS='--xla_cpu_enable_fast_math=true', JAX_PLATFORMS='cpu')
  done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env,
                        timeout=300, cwd=str(tmp_path), check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.split() == ['False', 'False'], done.stdout
