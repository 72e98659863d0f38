"""Orbax checkpoints of the train state plus the data iterator's position, verified.

Workdir layout (config.json and the tokenizer: workdir.py):
  checkpoints/<step>/state  TrainState (orbax StandardSave; sharded arrays)
  checkpoints/<step>/data   the data position: every data stream's (data/streams.py), merged
                            from all hosts, so any host count dividing the streams resumes it;
                            iterators without streams (synthetic data, checkpoints written
                            before them): {'process_count': n, 'processes': [each host's]}
  checkpoints/<step>/checksums  {array path: [[shard index, crc32], ...]} of the saved state
  checkpoints/<step>.corrupt-<time>  a checkpoint that failed to restore, moved aside (kept)

`restore_params(workdir)` is the entry point for evaluation / generation scripts.

Verification (checksums and finiteness): checksums.py.
"""
import logging as py_logging
import sys
import time

import jax
import orbax.checkpoint as ocp

from pretrain_jax import paths
from pretrain_jax.models import ModelConfig, build
from pretrain_jax.training import agreement
from pretrain_jax.training.checksums import CheckpointError, shard_checksums, verify
from pretrain_jax.training import state as state_lib
from pretrain_jax.training import workdir as workdir_lib

COMMIT_SUCCESS_FILE = 'commit_success.txt'  # orbax's marker of a finished step on GCS


WEIGHTS_ONLY_STEP = 0   # an import's checkpoint (pretrain-jax convert_hf): weights, nothing trained


def checkpoint_dir(workdir: str) -> str:
  return paths.join(paths.absolute(workdir), 'checkpoints')


class CheckpointSaveError(RuntimeError):
  """A checkpoint could not be written; the previous complete one is still the newest."""


def _log(text: str) -> None:
  if jax.process_index() == 0:
    print(text, file=sys.stderr, flush=True)


class Checkpointer:
  """A CheckpointManager over items `state` (pytree), `data` and `checksums` (JSON)."""

  def __init__(self, workdir: str, *, keep: int = 3, async_save: bool = True,
               read_only: bool = False, timeout_sec: int = 1200):
    # timeout_sec: on several hosts, a save failing on one leaves the others in orbax's commit
    # barriers; they give up after this long, and then every host stops with the error.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep if keep and keep > 0 else None, create=not read_only,
        enable_async_checkpointing=async_save, read_only=read_only,
        async_options=ocp.AsyncOptions(timeout_secs=int(timeout_sec)))
    self.directory = checkpoint_dir(workdir)
    self.manager = ocp.CheckpointManager(self.directory, options=options,
                                         item_names=('state', 'data', 'checksums'))
    self.pending = None  # the step of the save that may still be writing
    self.failed = None   # the step of a save reported as failed
    self.step = None     # the last step trained (poll): where a failure stops the run
    self._poll_error, self._poll_done, self._lagged = None, False, agreement.Lagged()

  def latest_step(self):
    return self.manager.latest_step()

  def all_steps(self):
    return list(self.manager.all_steps())

  def save(self, step: int, state, data_state) -> None:
    """Starts writing; returns once arrays are copied off the devices (training may go on,
    the donated state buffers are safe to reuse). All processes must call this.
    Raises CheckpointSaveError when this or the previous save failed."""
    self.wait()  # orbax waits for the previous save here anyway; this names its failure
    data = saved_data_state(agreement.gather_json(data_state))
    sums = {}
    for part in agreement.gather_json(shard_checksums(state)):
      for name, rows in part.items():
        sums.setdefault(name, []).extend(rows)
    self.pending = int(step)
    self._poll_error, self._poll_done = None, False
    self._lagged.reset()
    try:
      self.manager.save(int(step), force=True, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data),
          checksums=ocp.args.JsonSave(sums)))
    except Exception as e:  # pylint: disable=broad-exception-caught
      raise self._save_error(e) from e

  def check(self) -> None:
    """Raises CheckpointSaveError if a background save failed (cheap; call at log points).
    Agreed by all processes (an all-gather on several), so all raise or none does."""
    self._agreed(self.manager.check_for_errors)

  def _agreed(self, *calls, flag: bool = True) -> bool:
    """Runs `calls`; raises CheckpointSaveError on every process if one raised on any, else
    returns `flag` ANDed over the processes (one all-gather for both on several). An error
    `poll` caught and has not yet agreed on counts (orbax raises each error once)."""
    error = self._poll_error
    try:
      for call in calls if error is None else ():
        call()
    except Exception as e:  # pylint: disable=broad-exception-caught
      error = e
    ok_all, flag_all = agreement.all_processes(error is None, flag)
    if not ok_all:
      error = error or RuntimeError('the save failed on another process')
      raise self._save_error(error) from error
    return flag_all

  def poll(self, step: int) -> None:
    """Call after every train step: while a background save is writing, raises
    CheckpointSaveError soon after it failed (no host thread, which orbax's cleanup does not
    tolerate). Non-blocking: on several hosts the processes' (ok, done) flags are agreed
    agreement.Lagged.LAG steps late, so every process stops at the same step."""
    self.step = step
    if self.pending is None:
      return
    if self._poll_error is None and not self._poll_done:
      self._poll_done = not self.manager.is_saving_in_progress()
      try:  # once the finalize thread has ended, joining it is immediate and raises its error
        self.manager.check_for_errors()
        if self._poll_done:
          self.manager.wait_until_finished()
      except Exception as e:  # pylint: disable=broad-exception-caught
        self._poll_error = e
    flags = self._lagged.agree([self._poll_error is None, self._poll_done])
    if flags is None:
      return
    ok, done = flags.all(axis=0)
    if not ok:
      error = self._poll_error or RuntimeError('the save failed on another process')
      raise self._save_error(error) from error
    if done:
      self.pending = None

  def _save_error(self, error) -> CheckpointSaveError:
    failed, self.pending, stopped_at = self.pending, None, self.step
    self.failed = failed
    if jax.process_index() == 0:
      remove_temporary(paths.dirname(self.directory), quiet=True)
    done = complete_steps(paths.dirname(self.directory))
    done = [s for s in done if s != failed]
    newest = f'step {done[-1]}' if done else 'none'
    where = f' at step {stopped_at}' if stopped_at is not None else ''
    return CheckpointSaveError(
        f'saving checkpoint {failed} under {self.directory} failed ({type(error).__name__}: '
        f'{str(error)[:300]}); stopped training{where}. The newest complete checkpoint is '
        f'{newest}: fix the cause (disk space, permissions) and rerun the same command to '
        'resume from it')

  def restore(self, abstract_state, step=None):
    """(state placed with abstract_state's shardings, this host's data state) at `step`
    (default: the newest checkpoint that restores and verifies; newer damaged ones are moved
    aside to `<step>.corrupt-<time>` with a message). The shardings may differ from the ones
    the checkpoint was saved with. Raises CheckpointError when none restores.

    Step 0 is an import's weights (WEIGHTS_ONLY_STEP: no optimizer or data state of this run;
    training saves from step 1 on), never restored here: when no later checkpoint restores and
    step 0 is there, the damaged ones are moved aside and (None, None) returned, and the caller
    starts from step 0's weights (restore_params)."""
    steps = [step] if step is not None else sorted(
        (s for s in self.all_steps() if s != WEIGHTS_ONLY_STEP), reverse=True)
    failures = []
    for s in steps:
      try:
        state, data = self._restore_verified(abstract_state, s)
        ok = True
      except CheckpointError as e:
        failures.append((s, str(e)))
        ok = False
      if agreement.all_processes(ok):
        break
      if ok:
        failures.append((s, f'checkpoint {s} failed to verify on another process'))
    else:
      if step is not None or WEIGHTS_ONLY_STEP not in self.all_steps():
        raise CheckpointError('no checkpoint under {} restores: {}. Nothing was moved or '
                              'deleted; inspect the files, or train in a new workdir'.format(
                                  self.directory, ' | '.join(f for _, f in failures)))
      s, state = WEIGHTS_ONLY_STEP, None
    for bad, why in failures:
      aside = f'{paths.join(self.directory, str(bad))}.corrupt-{time.strftime("%Y%m%d-%H%M%S")}'
      if jax.process_index() == 0:
        paths.rename(paths.join(self.directory, str(bad)), aside)
      _log(f'checkpoint {bad} is damaged and was moved aside to {aside}: {why}; '
           f'resuming from step {s}')
    if failures:
      agreement.barrier('pretrain_jax: damaged checkpoints moved aside')
      self.manager.reload()
    return (state, host_data_state(data, s)) if state is not None else (None, None)

  def restore_params(self, abstract_params, step: int):
    """The parameters alone of checkpoint `step`, placed with abstract_params' shardings and
    verified (an imported checkpoint 0 starts a run with that run's own optimizer state).
    Read through a read-only manager: this one's handlers stay the ones saves use."""
    return read_params(self.directory, step, abstract_params)

  def _restore_verified(self, abstract_state, step: int):
    path = paths.join(self.directory, str(step))
    items = dict(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore())
    if paths.isdir(paths.join(path, 'checksums')):
      items['checksums'] = ocp.args.JsonRestore()
    try:
      restored = self.manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:  # pylint: disable=broad-exception-caught
      raise CheckpointError(_restore_failed(path, e)) from e
    verify(restored['state'], restored.get('checksums'), path)
    return restored['state'], restored['data']

  def wait(self) -> None:
    """Blocks until the pending save is complete; raises CheckpointSaveError (on every
    process) if it failed."""
    self._agreed(self.manager.wait_until_finished, self.manager.check_for_errors)
    self.pending = None

  def close(self) -> None:
    try:
      if self.failed is None:
        self.wait()
      else:  # the failure is already raised; do not replace it with the same one again
        try:
          self.manager.wait_until_finished()
        except Exception:  # pylint: disable=broad-exception-caught
          pass
    finally:
      self.manager.close()


def saved_data_state(host_states: list) -> dict:
  """Hosts' data states (process order) -> the checkpoint's `data` item. Data streams' states
  ({'streams': {index: position}, ...}) merge into one that does not depend on the host count;
  other iterators' are kept per process."""
  if all(isinstance(h, dict) and 'streams' in h for h in host_states):
    merged = dict(host_states[0], streams={})
    for h in host_states:
      merged['streams'].update(h['streams'])
    return merged
  return {'process_count': len(host_states), 'processes': host_states}


def host_data_state(data: dict, step) -> dict:
  """This process's part of a checkpoint's `data` item: merged stream states whole (the
  iterator takes the streams it owns), per-process ones only on the host count that wrote them."""
  if 'processes' not in data:
    return data
  if data['process_count'] != jax.process_count():
    raise ValueError(f'checkpoint step {step} was saved by {data["process_count"]} processes; '
                     f'this run has {jax.process_count()}: its data positions are per host (a '
                     'checkpoint written before data streams, or synthetic data) and resume '
                     f'only on {data["process_count"]} processes')
  return data['processes'][jax.process_index()]


def _first_line(error) -> str:
  text = str(error).strip().splitlines()
  return (text[0] if text else repr(error))[:400]


def _restore_failed(path: str, error) -> str:
  return f'checkpoint {path} failed to restore ({_why(error)})'


def _why(error) -> str:
  """'Type: first line' of the innermost cause: orbax's own message is a TensorStore repr cut
  at 400 characters; its cause names the array and the damage (`Error reading
  "params.h_0.attn.key.kernel/0.0.0" ...: Truncated Zstd-compressed stream`)."""
  seen = []
  while error is not None and error not in seen and len(seen) < 10:
    seen.append(error)
    error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
  root = next((e for e in reversed(seen) if str(e).strip()), seen[0])
  return f'{type(root).__name__}: {_first_line(root)}'


def complete_steps(workdir: str) -> list:
  """Steps of the finished checkpoints (integer-named folders), ascending. On object stores
  orbax writes a step in place and marks it finished with commit_success.txt."""
  root = checkpoint_dir(workdir)
  names = [n for n in paths.listdir(root) if n.isdigit()]
  if paths.is_remote(root):
    return sorted(int(n) for n in names
                  if paths.exists(paths.join(root, n, COMMIT_SUCCESS_FILE)))
  return sorted(int(n) for n in names if paths.isdir(paths.join(root, n)))


def remove_temporary(workdir: str, quiet: bool = False) -> list:
  """Deletes the unfinished folders of interrupted saves (process 0, lock held): local
  `*.orbax-checkpoint-tmp*`, on object stores step folders without commit_success.txt."""
  root = checkpoint_dir(workdir)
  gone = []
  finished = set(complete_steps(workdir))
  for name in paths.listdir(root):
    unfinished = name.isdigit() and int(name) not in finished if paths.is_remote(root) else False
    if '.orbax-checkpoint-tmp' in name or unfinished:
      paths.rmtree(paths.join(root, name))
      gone.append(name)
  if gone and not quiet:
    _log(f'removed unfinished checkpoint folders (an interrupted save, or the deletion of an '
         f'old checkpoint) under {root}: '
         f'{", ".join(gone)}')
  return gone


class _ReadOnlyNotes(py_logging.Filter):
  """Drops orbax's warning that a read-only manager's directory is read-only (on every
  load_pretrained in a notebook, where cli.quiet does not run; _reader's options avoid the
  others)."""

  def filter(self, record) -> bool:
    return not record.getMessage().startswith('Given directory is read only')


py_logging.getLogger('absl').addFilter(_ReadOnlyNotes())


def _reader(directory: str):
  return ocp.CheckpointManager(directory, item_names=('state', 'data', 'checksums'),
                               options=ocp.CheckpointManagerOptions(
                                   read_only=True, save_interval_steps=0, create=False))


def read_params(directory: str, step: int, target, manager=None):
  """The parameters of checkpoint `step` under `directory` (not the optimizer state), placed as
  `target` (abstract arrays with shardings) and verified against the saved checksums. Any
  failure is a CheckpointError naming the checkpoint."""
  reader = manager
  path = paths.join(directory, str(step))
  try:
    reader = reader or _reader(directory)
    restored = reader.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item={'params': target}, restore_args=ocp.checkpoint_utils.construct_restore_args(
            {'params': target}), partial_restore=True)))
    sums = None
    if paths.isdir(paths.join(path, 'checksums')):
      sums = reader.restore(step, args=ocp.args.Composite(
          checksums=ocp.args.JsonRestore()))['checksums']
  except Exception as e:  # pylint: disable=broad-exception-caught
    raise CheckpointError(_restore_failed(path, e)) from e
  finally:
    if manager is None and reader is not None:
      reader.close()
  params = restored['state']['params']
  verify({'params': params}, sums, path)
  return params


def restore_params(workdir: str, step=None):
  """Loads a workdir's parameters for evaluation: `(config, params, step)`.

  Reads only the parameters (not the optimizer state) of checkpoint `step` (default: the
  latest) onto the default device, whatever mesh it was saved from. Works on one CPU.
  Build the model with
  `build(ModelConfig.from_config(config.model).replace(deterministic=True))`.
  Raises CheckpointError (naming the checkpoint and array) when the parameters do not match
  their checksums or are not all finite.
  """
  config = workdir_lib.load_config(workdir)
  manager = _reader(checkpoint_dir(workdir))
  step = manager.latest_step() if step is None else int(step)
  if step is None or step not in manager.all_steps():
    raise FileNotFoundError(f'no checkpoint {"" if step is None else step} under '
                            f'{checkpoint_dir(workdir)}; steps there: {list(manager.all_steps())}')
  model = build(ModelConfig.from_config(config.model))
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                        state_lib.abstract_params(model))
  try:
    params = read_params(checkpoint_dir(workdir), step, target, manager)
  except CheckpointError as e:
    others = [s for s in manager.all_steps() if s != step]
    raise CheckpointError(f'{e}; load another step (steps there: {others}) or retrain') from e
  finally:
    manager.close()
  return config, params, step
