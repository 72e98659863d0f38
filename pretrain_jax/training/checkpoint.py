"""Orbax checkpoints of the train state plus the data iterator's position, and the workdir
files that let any script load a checkpoint with nothing else.

Workdir layout:
  config.json        the full config (ml_collections JSON) the run was started with
  tokenizer.model    a copy of the sentencepiece model (config.json's data.tokenizer points here)
  checkpoints/<step>/state  TrainState (orbax StandardSave; sharded arrays)
  checkpoints/<step>/data   {'process_count': n, 'processes': [iterator state of each host]}

`restore_params(workdir)` is the entry point for evaluation / generation scripts.
"""
import json
import os
import shutil

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from pretrain_jax.models import ModelConfig, build
from pretrain_jax.training import state as state_lib

CONFIG_FILE = 'config.json'
TOKENIZER_FILE = 'tokenizer.model'


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), 'checkpoints')


class Checkpointer:
  """A CheckpointManager over items `state` (pytree) and `data` (JSON)."""

  def __init__(self, workdir: str, *, keep: int = 3, async_save: bool = True,
               read_only: bool = False):
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep if keep and keep > 0 else None, create=not read_only,
        enable_async_checkpointing=async_save, read_only=read_only)
    self.manager = ocp.CheckpointManager(checkpoint_dir(workdir), options=options,
                                         item_names=('state', 'data'))

  def latest_step(self):
    return self.manager.latest_step()

  def all_steps(self):
    return list(self.manager.all_steps())

  def save(self, step: int, state, data_state) -> None:
    """Starts writing; returns once arrays are copied off the devices (training may go on,
    the donated state buffers are safe to reuse). All processes must call this."""
    data = {'process_count': jax.process_count(), 'processes': gather_json(data_state)}
    self.manager.save(int(step), force=True, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data)))

  def restore(self, abstract_state, step=None):
    """(state placed with abstract_state's shardings, this host's data state) at `step`
    (default latest). The shardings may differ from the ones the checkpoint was saved with."""
    step = self.latest_step() if step is None else step
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
    data = restored['data']
    if data['process_count'] != jax.process_count():
      raise ValueError(f'checkpoint step {step} was saved by {data["process_count"]} processes; '
                       f'this run has {jax.process_count()}: the data iterators\' positions '
                       'cannot be mapped onto a different number of hosts')
    return restored['state'], data['processes'][jax.process_index()]

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def gather_json(obj) -> list:
  """Every process's JSON-serializable `obj`, in process order (a collective)."""
  if jax.process_count() == 1:
    return [obj]
  data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
  sizes = multihost_utils.process_allgather(np.asarray([data.size], np.int32))
  padded = np.zeros(int(np.max(sizes)), np.uint8)
  padded[:data.size] = data
  everyone = multihost_utils.process_allgather(padded)
  return [json.loads(bytes(row[:int(n)]).decode()) for row, n in
          zip(everyone, np.asarray(sizes).reshape(-1))]


def save_workdir_files(config, workdir: str, tokenizer_path: str = '') -> ml_collections.ConfigDict:
  """Copies the tokenizer into the workdir and writes config.json (process 0 only).

  Returns the config as saved: `data.tokenizer` names the copy when there is one.
  """
  config = ml_collections.ConfigDict(config.to_dict())
  os.makedirs(workdir, exist_ok=True)
  if tokenizer_path and os.path.isfile(tokenizer_path):
    copy = os.path.join(os.path.abspath(workdir), TOKENIZER_FILE)
    if jax.process_index() == 0 and os.path.abspath(tokenizer_path) != copy:
      shutil.copyfile(tokenizer_path, copy)
    config.data.tokenizer = copy
  if jax.process_index() == 0:
    with open(os.path.join(workdir, CONFIG_FILE), 'w') as f:
      f.write(config.to_json(indent=2, sort_keys=True))
  return config


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a workdir was trained with. A tokenizer path that no longer exists (the workdir
  was moved) is pointed at the workdir's copy."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path} not found; expected a workdir written by scripts/train.py')
  with open(path) as f:
    config = ml_collections.ConfigDict(json.load(f))
  copy = os.path.join(os.path.abspath(workdir), TOKENIZER_FILE)
  if not os.path.isfile(config.data.tokenizer or '') and os.path.isfile(copy):
    config.data.tokenizer = copy
  return config


def restore_params(workdir: str, step=None):
  """Loads a workdir's parameters for evaluation: `(config, params, step)`.

  Reads only the parameters (not the optimizer state) of checkpoint `step` (default: the
  latest) onto the default device, whatever mesh it was saved from. Works on one CPU.
  Build the model with
  `build(ModelConfig.from_config(config.model).replace(deterministic=True))`.
  """
  config = load_config(workdir)
  manager = ocp.CheckpointManager(checkpoint_dir(workdir), item_names=('state', 'data'),
                                  options=ocp.CheckpointManagerOptions(read_only=True))
  step = manager.latest_step() if step is None else int(step)
  if step is None or step not in manager.all_steps():
    raise FileNotFoundError(f'no checkpoint {"" if step is None else step} under '
                            f'{checkpoint_dir(workdir)}; steps there: {list(manager.all_steps())}')
  model = build(ModelConfig.from_config(config.model))
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                        state_lib.abstract_params(model))
  restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
      item={'params': target}, restore_args=ocp.checkpoint_utils.construct_restore_args(
          {'params': target}), partial_restore=True)))
  manager.close()
  return config, restored['state']['params'], step
