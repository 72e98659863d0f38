"""Orbax checkpoints (`checkpoints/<step>/`) of the train state, the data position and the
state's checksums (checksums.py), verified on restore; layout: docs/training.md.
`restore_params(workdir)` is the entry point for evaluation / generation scripts."""
import contextlib
import functools
import sys
import time

import jax
import orbax.checkpoint as ocp
from etils import epath

from pretrain_jax import paths
from pretrain_jax.models import ModelConfig, build
from pretrain_jax.run import agreement, listing
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
  the workdir lock held (lock.hold): process 0 deletes the folders of interrupted saves (what
  orbax's cleanup_tmp_directories deletes: local `*.orbax-checkpoint-tmp*`, on gs:// step
  folders without commit_success.txt), which are a live trainer's saves when another holds the
  workdir; a folder the storage would not say that of is kept (listing.py), as is a checkpoint
  the restore could not read: this run never saves at its step (`save`) and deletes no
  checkpoint (orbax's rotation reads every folder's state first), the next run rotates.

  A background save's failure is raised as CheckpointSaveError on every process at the same
  step: by `poll` (each step, agreed agreement.Lagged.LAG steps late), `check` and `wait`."""

  def __init__(self, workdir: str, *, keep: int = 3, async_save: bool = True,
               timeout_sec: int = 1200):
    # timeout_sec: on several hosts, a save failing on one leaves the others in orbax's commit
    # barriers; they give up after this long, and then every host stops with the error.
    self.names = listing.NameFormat()
    self.options = functools.partial(
        ocp.CheckpointManagerOptions, enable_async_checkpointing=async_save,
        async_options=ocp.AsyncOptions(timeout_secs=int(timeout_sec)),
        step_name_format=self.names)
    self.workdir, self.directory = workdir, checkpoint_dir(workdir)
    if jax.process_index() == 0:
      unfinished = listing.list_steps(self.directory).unfinished
      if unfinished:
        _log(f'removing unfinished checkpoint folders (an interrupted save, or the deletion of '
             f'an old checkpoint) under {self.directory}: '
             f'{", ".join(sorted(p.name for p in unfinished))}')
      for path in unfinished:
        path.rmtree()
    self.manager = ocp.CheckpointManager(self.directory,
                                         options=self.options(max_to_keep=keep or None))
    self.pending = None   # the step of the save that may still be writing
    self.step = None      # the last step trained (poll): where a failure stops the run
    self._error, self._done, self._lagged = None, False, agreement.Lagged()

  def save(self, step: int, state, data_state) -> bool:
    """Starts writing; returns once arrays are copied off the devices (the donated state
    buffers are safe to reuse), True. All processes must call this. False, writing nothing, at
    a step whose checkpoint could not be read when the run started: it stays as it was."""
    self.wait()   # orbax waits for the previous save here anyway; this names its failure
    if int(step) in self.names.kept:
      _log(f'not saving step {step}: checkpoint {step}, which could not be read when this run '
           'started, is kept as it was')
      return False
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
    return True

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
    ones are moved aside to `<step>.corrupt-<time>`; newer ones the storage would not read
    (listing.is_unreadable, on any process) are skipped and kept as they were, and this run
    never saves at their steps (`save`): one line each. Raises CheckpointError when none
    restores, moving nothing. Step 0 (WEIGHTS_ONLY_STEP) is never restored here: when it is the
    one left, the result is (None, None) and the caller starts from its weights."""
    found = listing.list_steps(self.directory)
    unreadable = {int(k): v for part in agreement.gather_json(
        {str(k): v for k, v in found.unreadable.items()}) for k, v in part.items()}
    failures = []
    for s in sorted(set(found.complete) - set(unreadable) - {WEIGHTS_ONLY_STEP}, reverse=True):
      restored, status, why = None, 'ok', ''
      try:
        restored = _restore_verified(self.directory / str(s),
                                     state=ocp.args.StandardRestore(abstract_state),
                                     data=ocp.args.JsonRestore())
      except CheckpointError as e:
        status = 'unreadable' if listing.is_unreadable(e) else 'damaged'
        why = str(e) if status == 'damaged' else listing.why(e)
      statuses = agreement.gather_json(status)
      if set(statuses) == {'ok'}:
        break
      if 'unreadable' in statuses:   # (a read that failed anywhere proves no damage)
        unreadable[s] = why if status == 'unreadable' else 'unreadable on another process'
      else:
        failures.append((s, why or f'checkpoint {s} failed to verify on another process'))
    else:
      if WEIGHTS_ONLY_STEP not in found.complete:
        what = [f for _, f in failures] + [
            f'checkpoint {self.directory / str(k)} could not be read ({v})'
            for k, v in sorted(unreadable.items())]
        raise CheckpointError('no checkpoint under {} restores: {}. Nothing was moved or '
                              'deleted; {}'.format(self.directory, ' | '.join(what), (
                                  'rerun the same command once the storage reads them'
                                  if unreadable else
                                  'inspect the files, or train in a new workdir')))
      s = WEIGHTS_ONLY_STEP
    for bad, why in failures:
      aside = self._move_aside(bad, 'corrupt')
      _log(f'checkpoint {bad} is damaged and was moved aside to {aside}: {why}; '
           f'resuming from step {s}')
    for kept, why in sorted(unreadable.items()):
      if kept > s:
        _log(f'checkpoint {kept} under {self.directory} could not be read ({why}); skipped and '
             f'kept as it was (this run does not save over it): resuming from step {s}')
    if failures:
      agreement.barrier('pretrain_jax: damaged checkpoints moved aside')
      self.manager.reload()
    if unreadable:   # (no rotation: see the class doc)
      self.names.kept |= set(unreadable)
      self.manager.close()
      self.manager = ocp.CheckpointManager(self.directory, options=self.options())
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
    raise CheckpointError(f'checkpoint {path} failed to restore ({listing.why(e)})') from e
  verify(restored['state'], restored.get('checksums'), path)
  return restored


def complete_steps(workdir: str) -> list:
  """Steps of the finished checkpoints, ascending (on gs://: those with commit_success.txt);
  not those the storage would not say that of (listing.list_steps: unreadable)."""
  return listing.list_steps(checkpoint_dir(workdir)).complete


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
  """(the arrays of checkpoint `step` shaped as the `abstract` tree, on the default device;
  step). Without a step, the newest that reads: each newer one the storage would not read
  (listing.is_unreadable) is skipped with a line, and CheckpointError names them all when none
  reads. FileNotFoundError for a step that is not there, CheckpointError (naming the other
  steps) for one that does not read or verify."""
  directory = checkpoint_dir(workdir)
  found = listing.list_steps(directory)
  done, unreadable = found.complete, dict(found.unreadable)
  tries = sorted(set(done) | set(unreadable), reverse=True) if step is None else [int(step)]
  if not tries or tries[0] not in (*done, *unreadable):
    raise FileNotFoundError(f'no checkpoint {"" if step is None else step} under '
                            f'{directory}; steps there: {done}')
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                        abstract)
  for s in tries:
    try:
      if s in unreadable:
        raise CheckpointError(f'checkpoint {directory / str(s)} could not be read '
                              f'({unreadable[s]})')
      return read_params(directory, s, target), s
    except CheckpointError as e:
      if step is not None or not (s in unreadable or listing.is_unreadable(e)):
        others = [o for o in done if o != s]
        raise CheckpointError(f'{e}; load another step (steps there: {others}) or '
                              'retrain') from e
      unreadable[s] = unreadable.get(s) or listing.why(e)
      _log(f'checkpoint {s} under {directory} could not be read ({unreadable[s]}); skipped, '
           'kept as it was')
  raise CheckpointError('no checkpoint under {} could be read: {}. Nothing was moved or '
                        'deleted; rerun once the storage reads them'.format(
                            directory, ' | '.join(f'{directory / str(s)} ({unreadable[s]})'
                                                  for s in tries)))
