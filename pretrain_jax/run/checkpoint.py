"""Orbax checkpoints (`checkpoints/<step>/`) of the train state, the data position and the
state's checksums (checksums.py), verified on restore; layout: docs/training.md.
`restore_params(workdir)` is the entry point for evaluation / generation scripts."""
import contextlib
import sys
import time

import jax
import orbax.checkpoint as ocp
from etils import epath

from pretrain_jax import paths
from pretrain_jax.models import ModelConfig, build
from pretrain_jax.run import agreement
from pretrain_jax.run import workdir as workdir_lib
from pretrain_jax.run.checksums import CheckpointError, shard_checksums, verify
from pretrain_jax.training import state as state_lib

WEIGHTS_ONLY_STEP = 0   # an import's checkpoint (pretrain-jax convert_hf): weights, nothing trained


def checkpoint_dir(workdir: str) -> epath.Path:
  return paths.resolve(workdir) / 'checkpoints'


class CheckpointSaveError(RuntimeError):
  """A checkpoint could not be written; the previous complete one is still the newest."""


def _log(text: str) -> None:
  if jax.process_index() == 0:
    print(text, file=sys.stderr, flush=True)


class Checkpointer:
  """A CheckpointManager over items `state` (pytree), `data` and `checksums` (JSON). Made with
  the workdir lock held (lock.hold): process 0 deletes the folders of interrupted saves (orbax's
  cleanup_tmp_directories: local `*.orbax-checkpoint-tmp*`, on gs:// step folders without
  commit_success.txt), which are a live trainer's saves when another holds the workdir.

  A background save's failure is raised as CheckpointSaveError on every process at the same
  step: by `poll` (each step, agreed agreement.Lagged.LAG steps late), `check` and `wait`."""

  def __init__(self, workdir: str, *, keep: int = 3, async_save: bool = True,
               timeout_sec: int = 1200):
    # timeout_sec: on several hosts, a save failing on one leaves the others in orbax's commit
    # barriers; they give up after this long, and then every host stops with the error.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep or None, enable_async_checkpointing=async_save,
        async_options=ocp.AsyncOptions(timeout_secs=int(timeout_sec)),
        cleanup_tmp_directories=True)
    self.workdir, self.directory = workdir, checkpoint_dir(workdir)
    unfinished = ocp.utils.tmp_checkpoints(self.directory) if jax.process_index() == 0 else []
    if unfinished:   # (orbax names none of the folders it deletes)
      _log(f'removing unfinished checkpoint folders (an interrupted save, or the deletion of an '
           f'old checkpoint) under {self.directory}: '
           f'{", ".join(sorted(t.get().name for t in unfinished))}')
    self.manager = ocp.CheckpointManager(self.directory, options=options)
    self.pending = None   # the step of the save that may still be writing
    self.step = None      # the last step trained (poll): where a failure stops the run
    self._error, self._done, self._lagged = None, False, agreement.Lagged()

  def save(self, step: int, state, data_state) -> None:
    """Starts writing; returns once arrays are copied off the devices (the donated state
    buffers are safe to reuse). All processes must call this."""
    self.wait()   # orbax waits for the previous save here anyway; this names its failure
    data = saved_data_state(agreement.gather_json(data_state))
    sums = {}
    for part in agreement.gather_json(shard_checksums(state)):
      for name, rows in part.items():
        sums.setdefault(name, []).extend(rows)
    self.pending, self._error, self._done = int(step), None, False
    self._lagged.reset()
    try:
      self.manager.save(int(step), force=True, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data),
          checksums=ocp.args.JsonSave(sums)))
    except Exception as e:
      raise self._save_error(e) from e

  def _run(self, *calls) -> None:
    """Runs orbax's `calls` until one raises, keeping its error (orbax raises each once)."""
    try:
      for call in calls if self._error is None else ():
        call()
    except Exception as e:
      self._error = e

  def _stop_unless(self, ok) -> None:
    if not ok:
      self._error = self._error or RuntimeError('the save failed on another process')
      raise self._save_error(self._error) from self._error

  def check(self) -> None:
    """Raises if a background save failed on any process (cheap; a blocking agreement)."""
    self._run(self.manager.check_for_errors)
    self._stop_unless(agreement.all_processes(self._error is None))

  def wait(self) -> None:
    """Blocks until the pending save is complete; raises on every process if it failed."""
    self._run(self.manager.wait_until_finished, self.manager.check_for_errors)
    self._stop_unless(agreement.all_processes(self._error is None))
    self.pending = None

  def poll(self, step: int) -> None:
    """Call after every train step: raises soon after a background save failed, without
    blocking (no host thread either, which orbax's cleanup does not tolerate)."""
    self.step = step
    if self.pending is None:
      return
    if not self._done:
      self._done = not self.manager.is_saving_in_progress()
      # once the finalize thread has ended, joining it is immediate and raises its error
      self._run(self.manager.check_for_errors,
                *([self.manager.wait_until_finished] if self._done else []))
    flags = self._lagged.agree([self._error is None, self._done])
    if flags is not None:
      ok, done = flags.all(axis=0)
      self._stop_unless(ok)
      if done:
        self.pending = None

  def set_aside_diverged(self, step: int) -> str:
    """Moves checkpoint `step`, whose next loss is not finite, to `<step>.nonfinite-<time>`
    once its save is complete, so a resume, evaluate and load_pretrained take the one before;
    '' when `step` was not saved, else a note naming both. Every process calls it at the same
    step (the metrics it follows are global): process 0 moves, then all agree."""
    with contextlib.suppress(CheckpointSaveError):   # (a failed save left nothing to move)
      self.wait()
    if step not in complete_steps(self.workdir):
      return ''
    aside = self._move_aside(step, 'nonfinite')
    agreement.barrier('pretrain_jax: a diverged checkpoint moved aside')
    done = [s for s in complete_steps(self.workdir) if s != step]
    return (f'; checkpoint {step}, whose loss this is, was moved aside to {aside}; the newest '
            f'good checkpoint is {f"step {done[-1]}" if done else "none"}')

  def _move_aside(self, step: int, why: str) -> epath.Path:
    aside = self.directory / f'{step}.{why}-{time.strftime("%Y%m%d-%H%M%S")}'
    if jax.process_index() == 0:
      (self.directory / str(step)).rename(aside)
    return aside

  def _save_error(self, error) -> CheckpointSaveError:
    failed, self.pending, self._error = self.pending, None, error
    try:   # (the storage that failed the save may fail the listing too)
      done = [s for s in complete_steps(self.workdir) if s != failed]
      newest = f'step {done[-1]}' if done else 'none'
    except Exception as e:
      newest = f'unknown (listing it failed too: {type(e).__name__}: {str(e)[:100]})'
    where = f' at step {self.step}' if self.step is not None else ''
    return CheckpointSaveError(
        f'saving checkpoint {failed} under {self.directory} failed ({type(error).__name__}: '
        f'{str(error)[:300]}); stopped training{where}. The newest complete checkpoint is '
        f'{newest}: fix the cause (disk space, permissions) and rerun the same command to '
        'resume from it')

  def restore(self, abstract_state):
    """(state placed with abstract_state's shardings, whatever mesh saved it, this host's data
    state) of the newest checkpoint that restores and verifies on every process. Newer damaged
    ones are moved aside to `<step>.corrupt-<time>` with a message. Raises CheckpointError when
    none restores, moving nothing. Step 0 (WEIGHTS_ONLY_STEP) is never restored here: when it is
    the one left, the result is (None, None) and the caller starts from its weights."""
    failures = []
    for s in sorted(set(complete_steps(self.workdir)) - {WEIGHTS_ONLY_STEP}, reverse=True):
      restored = None
      try:
        restored = _restore_verified(self.directory / str(s),
                                     state=ocp.args.StandardRestore(abstract_state),
                                     data=ocp.args.JsonRestore())
      except CheckpointError as e:
        failures.append((s, str(e)))
      if agreement.all_processes(restored is not None):
        break
      if restored is not None:
        failures.append((s, f'checkpoint {s} failed to verify on another process'))
    else:
      if WEIGHTS_ONLY_STEP not in complete_steps(self.workdir):
        raise CheckpointError('no checkpoint under {} restores: {}. Nothing was moved or '
                              'deleted; inspect the files, or train in a new workdir'.format(
                                  self.directory, ' | '.join(f for _, f in failures)))
      s = WEIGHTS_ONLY_STEP
    for bad, why in failures:
      aside = self._move_aside(bad, 'corrupt')
      _log(f'checkpoint {bad} is damaged and was moved aside to {aside}: {why}; '
           f'resuming from step {s}')
    if failures:
      agreement.barrier('pretrain_jax: damaged checkpoints moved aside')
      self.manager.reload()
    if s == WEIGHTS_ONLY_STEP:
      return None, None
    return restored['state'], host_data_state(restored['data'], s)

  def close(self, raised: bool = False) -> None:
    """Waits for the last save. `raised`: an error is ending the run; with several processes
    it may be this one's alone, so there is no agreement (a collective that its peers, inside a
    train step, never join)."""
    try:
      if self._error is None and not (raised and jax.process_count() > 1):
        self.wait()
      else:   # a failure is raised already (the save's or the run's): not again
        with contextlib.suppress(Exception):
          self.manager.wait_until_finished()
    finally:
      self.manager.close()


def saved_data_state(host_states: list) -> dict:
  """Hosts' data states (process order) -> the checkpoint's `data` item: data streams' states
  ({'streams': {index: position}, ...}) merge into one that does not depend on the host count;
  other iterators' are kept per process."""
  if all(isinstance(h, dict) and 'streams' in h for h in host_states):
    return dict(host_states[0], streams={i: position for h in host_states
                                         for i, position in h['streams'].items()})
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


def _why(error) -> str:
  """'Type: first line' of the innermost cause: orbax's own message is a TensorStore repr; its
  cause names the array and the damage (`Error reading "params.h_0.attn.key.kernel/0.0.0" ...:
  Truncated Zstd-compressed stream`)."""
  chain = [error]
  while len(chain) < 10 and (chain[-1].__cause__ or chain[-1].__context__) not in (None, *chain):
    chain.append(chain[-1].__cause__ or chain[-1].__context__)
  root = next((e for e in reversed(chain) if str(e).strip()), error)
  return f'{type(root).__name__}: {(str(root).strip().splitlines() or [repr(root)])[0][:400]}'


def _restore_verified(path: epath.Path, **items) -> dict:
  """`items` (with the checksums when saved) of the checkpoint at `path`, its `state` verified;
  any failure is a CheckpointError naming the checkpoint. Read without a CheckpointManager: a
  read-only one warns on every load, and a saving one's handlers must stay the ones saves use."""
  if (path / 'checksums').is_dir():
    items['checksums'] = ocp.args.JsonRestore()
  try:
    with contextlib.closing(ocp.Checkpointer(ocp.CompositeCheckpointHandler())) as reader:
      restored = reader.restore(path, args=ocp.args.Composite(**items))
  except Exception as e:
    raise CheckpointError(f'checkpoint {path} failed to restore ({_why(e)})') from e
  verify(restored['state'], restored.get('checksums'), path)
  return restored


def complete_steps(workdir: str) -> list:
  """Steps of the finished checkpoints, ascending (on gs://: those with commit_success.txt)."""
  return sorted(ocp.utils.checkpoint_steps(checkpoint_dir(workdir)))


def read_params(directory: epath.Path, step: int, target):
  """The parameters of checkpoint `step` under `directory` (not the optimizer state), placed as
  `target` (abstract arrays with shardings) and verified."""
  item = {'params': target}
  restored = _restore_verified(directory / str(step), state=ocp.args.PyTreeRestore(
      item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True))
  return restored['state']['params']


def restore_params(workdir: str, step=None):
  """Loads a workdir's parameters for evaluation: `(config, params, step)`.

  Reads only the parameters of checkpoint `step` (default: the latest) onto the default device,
  whatever mesh saved them; works on one CPU. Build the model with
  `build(ModelConfig.from_config(config.model).replace(deterministic=True))`. Raises
  CheckpointError (naming the checkpoint and array) when the parameters do not match their
  checksums or are not all finite.
  """
  config = workdir_lib.load_config(workdir)
  abstract = state_lib.abstract_params(build(ModelConfig.from_config(config.model)))
  params, step = read_on_one_device(workdir, abstract, step)
  return config, params, step


def read_on_one_device(workdir: str, abstract, step=None) -> tuple:
  """(the arrays of checkpoint `step` (default: the latest) shaped as the `abstract` tree, on
  the default device; step): FileNotFoundError for a step that is not there, CheckpointError
  (naming the other steps) for one that does not verify."""
  done = complete_steps(workdir)
  step = (done or [None])[-1] if step is None else int(step)
  if step not in done:
    raise FileNotFoundError(f'no checkpoint {"" if step is None else step} under '
                            f'{checkpoint_dir(workdir)}; steps there: {done}')
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                        abstract)
  try:
    return read_params(checkpoint_dir(workdir), step, target), step
  except CheckpointError as e:
    others = [s for s in done if s != step]
    raise CheckpointError(f'{e}; load another step (steps there: {others}) or retrain') from e
