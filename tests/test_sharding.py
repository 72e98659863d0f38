"""Meshes on 8 simulated CPU devices give the single-device results (fp32, 3 steps).

XLA_FLAGS must be set before jax is imported, so the checks run in one subprocess (this file,
run as a script) and the tests below assert on the JSON it prints. What is checked is the
partitioned program (both sides compile alike), and its compiles are most of the subprocess's
time, so its XLA:CPU code is built the cheapest way (commands.FAST_COMPILE_XLA_FLAGS), the
train state's init too (run_once would build it at LLVM level 1: tests/test_state_init.py
checks that level's bits).
"""
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import types

import commands
import filelock
import jax
import numpy as np
import pytest
from modeling import batches, setup, tiny_config

from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.ops import backends
from pretrain_jax.run import checkpoint
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import optimizer as opt_lib
from pretrain_jax.training import state as state_lib
from pretrain_jax.training.config import MeshConfig, TrainConfig

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, PEAK_LR = 3, 1e-2   # the runs below: 3 Adam steps of modeling.tiny_config (lr 1e-2)
MESHES = {'data': dict(data=8, fsdp=1, tensor=1), 'fsdp': dict(data=1, fsdp=8, tensor=1),
          'tensor': dict(data=2, fsdp=1, tensor=4), 'mixed': dict(data=2, fsdp=2, tensor=2)}


@pytest.fixture(scope='module')
def report(tmp_path_factory, worker_id):
  """The subprocess's JSON. It takes minutes, so it runs once per test session: pytest-xdist
  workers share the parent of their temp directories, and a worker that finds the lock taken
  waits and reads the file the other one wrote."""
  root = tmp_path_factory.getbasetemp()
  path = (root if worker_id == 'master' else root.parent) / 'sharding_report.json'
  with filelock.FileLock(f'{path}.lock'):
    if not path.exists():
      env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8 '
                                       + commands.FAST_COMPILE_XLA_FLAGS,
                 PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE]))
      proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True,
                            text=True, timeout=600)
      assert proc.returncode == 0, proc.stderr[-4000:]
      path.write_text(proc.stdout.strip().splitlines()[-1])
    return json.loads(path.read_text())


@pytest.mark.parametrize('case', ['gpt/data', 'gpt/fsdp', 'gpt/tensor/chunk5', 'gpt/mixed/micro2',
                                  'gpt/mixed/autodiff', 'bert/mixed/pred4', 'bert/mixed',
                                  't5/mixed'])
def test_mesh_matches_one_device(report, case):
  got, single = report['runs'][case], report['runs'][case.split('/')[0] + '/single']
  assert got['devices'] == 8
  for a, b in zip(got['losses'], single['losses'], strict=True):
    assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (got['losses'], single['losses'])
  # Parameters: Adam's update m / (sqrt(v) + eps) normalizes a gradient element to O(1) times
  # the learning rate whatever its size, so an element whose gradient is at rounding level
  # (~1e-7, where a sharded sum and a single-device sum round differently) can move by up to
  # 2 * lr per step on one side and not the other. Sound per-element bound: 2 * steps * peak lr
  # (0.06; seen: 1.07e-5 for gpt/tensor on an AVX2 EPYC). A real sharding error moves many
  # elements (a shard of a tensor: hundreds here), so the share of elements off by more than
  # 1e-5 must stay at rounding level: a handful, whose count depends on the CPU and the code
  # XLA emits for it.
  assert got['max_param_diff'] <= 2 * STEPS * PEAK_LR
  assert got['params_off'] <= 1e-3 * got['params_total'], got


def test_state_is_created_sharded(report):
  specs = report['specs']
  assert specs['wte'] == ['tensor', 'fsdp']             # (vocab, embed)
  assert specs['mlp_wi'] == ['fsdp', 'tensor']          # (embed, mlp)
  assert specs['adam_mu_wte'] == ['tensor', 'fsdp']     # optimizer state follows its parameter
  assert report['shard_shape_wte'] == [64, 16]          # 128/2 x 32/2 per device


def test_checkpoint_restores_onto_another_mesh(report):
  moved = report['moved']
  assert moved['params_equal'] and moved['opt_state_equal']
  assert moved['restored_spec'] == ['tensor', 'fsdp']
  assert abs(moved['next_loss_moved'] - moved['next_loss_original']) <= 1e-5


@pytest.mark.parametrize('key,expected', [
    ('batch', ('train.batch_size=6', '6 sequences per microbatch', 'data*fsdp=8')),
    ('heads', ('model.num_heads=4', 'mesh.tensor=8')),
    ('mesh', ('the 8 available',)),
])
def test_bad_configs_fail_before_compiling(report, key, expected):
  assert all(part in report['errors'][key] for part in expected), report['errors'][key]


def _worker():
  """Runs in the 8-device subprocess; prints one JSON line."""
  assert jax.device_count() == 8, jax.devices()
  # run_once's inits at XLA_FLAGS' -O0 too (its compiler options would say level 1)
  init_tuning = dataclasses.replace(backends.CPU, init_compiler_options=None)
  state_lib.backends = types.SimpleNamespace(for_platform=lambda platform: init_tuning)

  def run(family, mesh, microbatches=1, **train):
    config = tiny_config(family, microbatches=microbatches, **train,
                         optimizer='adafactor' if family == 't5' else 'adamw')
    config.model.update(nsp=family == 'bert', num_layers=1)
    config.mesh.update(mesh or {})
    state, step, _ = setup(config, jax.devices() if mesh else jax.devices()[:1])
    losses = []
    for batch in batches(config, STEPS):
      state, metrics = step(state, batch)
      losses.append(float(metrics['loss']))
    return state, losses, step

  out = {'runs': {}}
  cases = [('gpt', 'single', None, 1), ('gpt', 'data', MESHES['data'], 1),
           ('gpt', 'fsdp', MESHES['fsdp'], 1), ('gpt', 'tensor/chunk5', MESHES['tensor'], 1),
           ('gpt', 'mixed/micro2', MESHES['mixed'], 2),
           ('gpt', 'mixed/autodiff', MESHES['mixed'], 1),
           ('bert', 'single', None, 1), ('bert', 'mixed', MESHES['mixed'], 1),
           ('bert', 'mixed/pred4', MESHES['mixed'], 1),
           ('t5', 'single', None, 1), ('t5', 'mixed', MESHES['mixed'], 1)]
  singles, steps = {}, {}
  for family, name, mesh, micro in cases:
    # The LM head and loss are the fused ones (training/fused_loss.py; its kernel gradient
    # summed per batch shard), but for autodiff's (against the fused single device). chunk5:
    # 5 positions at a time (a ragged tail), vocab split 4 ways on tensor; pred4: the MLM head
    # on 4 gathered positions per row (or all, in a batch with a fuller row)
    train = {'loss_chunk_len': 5} if name.endswith('chunk5') else {}
    if name.endswith('autodiff'):
      train['fused_loss'] = False
    if name.endswith('pred4'):
      train['max_predictions_per_seq'] = 4
    state, losses, step = run(family, mesh, micro, **train)
    steps[f'{family}/{name}'] = step
    params = jax.device_get(state.params)
    if name == 'single':
      singles[family] = params
    pairs = list(zip(jax.tree.leaves(params), jax.tree.leaves(singles[family]), strict=True))
    diff = max(float(np.max(np.abs(a - b))) for a, b in pairs)
    off = sum(int(np.sum(np.abs(a - b) > 1e-5)) for a, b in pairs)
    devices = len(jax.tree.leaves(state.params)[0].sharding.device_set)
    out['runs'][f'{family}/{name}'] = {'losses': losses, 'max_param_diff': diff,
                                       'params_off': off, 'devices': devices,
                                       'params_total': sum(int(a.size) for a, _ in pairs)}
    if family == 'gpt' and name == 'mixed/micro2':
      mu = state.opt_state[1][0].mu
      out['specs'] = {'wte': list(state.params['wte']['embedding'].sharding.spec),
                      'mlp_wi': list(state.params['h_0']['mlp']['wi']['kernel'].sharding.spec),
                      'adam_mu_wte': list(mu['wte']['embedding'].sharding.spec)}
      out['shard_shape_wte'] = list(
          state.params['wte']['embedding'].addressable_shards[0].data.shape)
    if family == 'gpt' and name == 'data':
      saved = state

  # A checkpoint saved on the data=8 mesh restores onto data=2, fsdp=2, tensor=2; each state
  # takes its next step with its own mesh's step of the runs above (mixed/micro2's: two
  # microbatches sum to the same loss to rounding).
  workdir = tempfile.mkdtemp()
  ckpt = checkpoint.Checkpointer(workdir, async_save=False)
  ckpt.save(3, saved, {'index': 3})
  ckpt.wait()
  config = tiny_config('gpt')
  config.model.num_layers = 1
  config.mesh.update(MESHES['mixed'])
  mesh = mesh_lib.make_mesh(MeshConfig.from_config(config.mesh))
  cfg = ModelConfig.from_config(config.model)
  tx = opt_lib.make_optimizer(TrainConfig.from_config(config.train))
  abstract, _ = state_lib.abstract_state(build(cfg), tx, mesh, family_of('gpt').init_batch(16))
  restored, data_state = ckpt.restore(abstract)
  def same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(
        jax.tree.leaves(jax.device_get(a)), jax.tree.leaves(jax.device_get(b)), strict=True))
  batch = batches(config, 4)[3]
  moved = {'params_equal': same(restored.params, saved.params),
           'opt_state_equal': same(restored.opt_state, saved.opt_state),
           'restored_spec': list(restored.params['wte']['embedding'].sharding.spec),
           'data_state': data_state}
  moved['next_loss_moved'] = float(steps['gpt/mixed/micro2'](restored, batch)[1]['loss'])
  moved['next_loss_original'] = float(steps['gpt/data'](saved, batch)[1]['loss'])
  out['moved'] = moved

  errors = {}
  for key, change in [('batch', dict(train=dict(batch_size=6), mesh=MESHES['data'])),
                      ('heads', dict(mesh=dict(data=1, fsdp=1, tensor=8))),
                      ('mesh', dict(mesh=dict(data=2, fsdp=2, tensor=1)))]:
    config = tiny_config('gpt')
    for section, values in change.items():
      config[section].update(values)
    try:
      mesh_lib.check_config(TrainConfig.from_config(config.train),
                            ModelConfig.from_config(config.model),
                            mesh_lib.make_mesh(MeshConfig.from_config(config.mesh)))
      errors[key] = 'no error'
    except ValueError as e:
      errors[key] = str(e)
  out['errors'] = errors
  print(json.dumps(out))


if __name__ == '__main__':
  _worker()
