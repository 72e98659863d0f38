"""The train state's init program: compiled with the CPU tuning's init_compiler_options on CPU
(it runs once; its compile time is mostly threefry fusions), it must give the SAME bits as the
default compilation, for every family and initializer (N(0, 0.02), fan_in, PyTorch's
uniform). One layer each: the initializers are the same at any depth.

"The default compilation" is the one users get, so the checks run in one subprocess (this file,
run as a script) with XLA_FLAGS as the user's, not the default test set's fast-compile flags
(at LLVM -O0 XLA contracts no multiply-adds, so its bits differ from every optimizing level).
"""
import json
import os
import subprocess
import sys

import commands
import flax.linen as nn
import jax
import numpy as np
import pytest
from modeling import SEQ, tiny_config

from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.training import evaluate
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import optimizer as opt_lib
from pretrain_jax.training import state as state_lib
from pretrain_jax.training.config import MeshConfig, TrainConfig

# Compiled as users' runs compile (the optimizing XLA:CPU build), like the rest of the slow set.
pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.abspath(__file__))
CASES = {'bert': {}, 'gpt': {}, 't5': {},
         'gpt_torch_default': dict(kernel_init='torch_default', position_embedding='sinusoidal',
                                   tie_embeddings=False, head_bias=True, causal=False)}


@pytest.fixture(scope='module')
def report():
  flags = os.environ.get('XLA_FLAGS', '').replace(commands.FAST_COMPILE_XLA_FLAGS, '').strip()
  env = dict(os.environ, XLA_FLAGS=flags,
             PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE]))
  proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_comparisons_ran_at_the_users_compilation(report):
  assert commands.FAST_COMPILE_XLA_FLAGS not in report['xla_flags'], report['xla_flags']


@pytest.mark.parametrize('case', sorted(CASES))
def test_init_options_keep_the_default_compilation_bits(report, case):
  got = report[case]
  assert got['options']                           # run_once compiled with the CPU's options
  assert got['leaves'] > 10 and got['same_dtype'] == got['leaves'], got
  assert got['same_bits'] == got['leaves'], got
  assert got['random']                            # really random, not all zeros


def test_random_init_params_keep_the_default_compilation_bits(report):
  """training.evaluate.random_init_params (the 'random init' baselines) goes through run_once
  with no shardings: the same bits as a plain jax.jit of model.init (each family's initializers
  are checked above)."""
  got = report['random_init_params']
  assert got['same_structure'] and got['leaves'] > 10
  assert got['same_bits'] == got['leaves'], got


def _worker():
  """Runs in the subprocess; prints one JSON line."""
  assert jax.devices()[0].platform == 'cpu'   # so run_once compiles with the options

  def compare(ours, ref):
    leaves, ref = jax.tree.leaves(ours), jax.tree.leaves(ref)
    return {'leaves': len(leaves),
            'same_dtype': sum(a.dtype == b.dtype for a, b in zip(leaves, ref, strict=True)),
            'same_bits': sum(bool(np.array_equal(np.asarray(a), np.asarray(b)))
                             for a, b in zip(leaves, ref, strict=True)),
            'random': any(float(np.asarray(x).std()) > 0 for x in leaves)}

  out = {'xla_flags': os.environ.get('XLA_FLAGS', '')}
  for case, overrides in CASES.items():
    config = tiny_config(case.split('_')[0])
    config.model.update(overrides, num_layers=1)
    cfg = ModelConfig.from_config(config.model)
    mesh = mesh_lib.make_mesh(MeshConfig.from_config(config.mesh), jax.devices()[:1])
    abstract, init_state = state_lib.abstract_state(
        build(cfg), opt_lib.make_optimizer(TrainConfig.from_config(config.train)), mesh,
        family_of(cfg).init_batch(SEQ))
    shardings = state_lib.shardings_of(abstract)
    ours = state_lib.run_once(init_state, jax.random.key(3), out_shardings=shardings)
    default = jax.jit(init_state, out_shardings=shardings)(jax.random.key(3))
    out[case] = dict(compare(ours, default),
                     options=bool(state_lib.backends.for_platform('cpu').init_compiler_options))

  config = tiny_config('gpt')
  config.model.num_layers = 1
  cfg = ModelConfig.from_config(config.model)
  args, kwargs = family_of(cfg).model_inputs(family_of(cfg).init_batch(8, cfg.nsp))
  ref = nn.unbox(jax.jit(build(cfg).init)(jax.random.key(5), *args, **kwargs)['params'])
  ours = evaluate.random_init_params(cfg, seed=5)
  out['random_init_params'] = dict(
      compare(ours, ref), same_structure=jax.tree.structure(ours) == jax.tree.structure(ref))
  print(json.dumps(out))


if __name__ == '__main__':
  _worker()
