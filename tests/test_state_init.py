"""The train state's init program: compiled with the CPU tuning's init_compiler_options on CPU
(it runs once; its compile time is mostly threefry fusions), it must give the SAME bits as the
default compilation, for every family and initializer (N(0, 0.02), fan_in, PyTorch's
uniform). One layer each: the initializers are the same at any depth."""
import flax.linen as nn
import jax
import numpy as np
import pytest

from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import evaluate
from pretrain_jax.training import optimizer as opt_lib
from pretrain_jax.training import state as state_lib
from pretrain_jax.training.config import MeshConfig, TrainConfig
from tests.test_train import SEQ, tiny_config

CASES = {'bert': {}, 'gpt': {}, 't5': {},
         'gpt_torch_default': dict(kernel_init='torch_default', position_embedding='sinusoidal',
                                   tie_embeddings=False, head_bias=True, causal=False)}


@pytest.mark.parametrize('case', sorted(CASES))
def test_init_options_keep_the_default_compilation_bits(case):
  config = tiny_config(case.split('_')[0])
  config.model.update(CASES[case], num_layers=1)
  cfg = ModelConfig.from_config(config.model)
  mesh = mesh_lib.make_mesh(MeshConfig.from_config(config.mesh), jax.devices()[:1])
  abstract, init_state = state_lib.abstract_state(
      build(cfg), opt_lib.make_optimizer(TrainConfig.from_config(config.train)), mesh,
      family_of(cfg).init_batch(SEQ))
  shardings = state_lib.shardings_of(abstract)
  assert jax.devices()[0].platform == 'cpu'   # so run_once compiles with the options
  ours = state_lib.run_once(init_state, jax.random.key(3), out_shardings=shardings)
  default = jax.jit(init_state, out_shardings=shardings)(jax.random.key(3))
  leaves, ref = jax.tree.leaves(ours), jax.tree.leaves(default)
  assert len(leaves) == len(ref) > 10
  for a, b in zip(leaves, ref):
    assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
  assert any(np.asarray(x).std() > 0 for x in leaves)   # really random, not all zeros


def test_random_init_params_keep_the_default_compilation_bits():
  """training.evaluate.random_init_params (the 'random init' baselines) goes through run_once
  with no shardings: the same bits as a plain jax.jit of model.init (each family's initializers
  are checked above)."""
  config = tiny_config('gpt')
  config.model.num_layers = 1
  cfg = ModelConfig.from_config(config.model)

  args, kwargs = family_of(cfg).model_inputs(family_of(cfg).init_batch(8, cfg.nsp))
  ref = nn.unbox(jax.jit(build(cfg).init)(jax.random.key(5), *args, **kwargs)['params'])
  ours = evaluate.random_init_params(cfg, seed=5)
  assert jax.tree.structure(ours) == jax.tree.structure(ref)
  assert all(np.array_equal(np.asarray(a), np.asarray(b))
             for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref)))
