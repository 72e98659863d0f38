"""The workdir's guards: one trainer at a time, and a config that still fits the checkpoints.

Files (process 0 writes them; nothing here runs inside the jitted step):
  LOCK                         {host, pid, start, heartbeat} of the trainer that holds the run
  config.json                  the config of the latest (re)start, written atomically, and only
                               when it changes
  config_history/<n>_step<k>.json  every config.json written; k = the checkpoint step it started at

Run the guards in this order, before anything else touches the workdir (the config's sections
already built, so their values are checked): `check_not_foreign`, `hold` (the lock; until the loop's own handler, a SIGTERM releases it and
exits 143), `check_config` (before any data are opened), then `write_config` once the data
and tokenizer are known (it checks again, then records).
"""
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time

import ml_collections
import numpy as np

from pretrain_jax import paths
from pretrain_jax.data.config import TaskConfig, data_section
from pretrain_jax.models import ModelConfig
from pretrain_jax.training.config import MeshConfig, TrainConfig

LOCK_FILE = 'LOCK'
CONFIG_FILE = 'config.json'
TOKENIZER_FILE = 'tokenizer.model'
HISTORY_DIR = 'config_history'
HEARTBEAT_SEC = 30.0      # the holder refreshes its heartbeat this often
STALE_SEC = 600.0         # a lock whose heartbeat is older than this is taken over

# Keys a resume may change freely: when, how often and how much to train, not what the state is.
FREE_KEYS = ('train.steps', 'train.log_every', 'train.eval_every', 'train.eval_batches',
             'train.checkpoint_every', 'train.keep_checkpoints', 'train.async_checkpoints',
             'train.checkpoint_timeout_sec',
             'train.peak_tflops', 'train.profile_steps', 'train.profile_start_step',
             'train.allow_config_change', 'train.loss_chunk_len',
             'train.max_predictions_per_seq', 'data.tokenizer', 'data.tfds_data_dir',
             'data.prepared_dir', 'data.num_parallel_calls', 'data.prefetch', 'data.eval_split',
             'data.num_streams',   # the data position holds the resolved count, and checks it
             'task.pairs')         # derived from the task, whose name and labels are checked
# Keys a resume may change when named in train.allow_config_change: the optimization changes,
# the state and data stream keep their meaning.
ALLOWABLE_KEYS = ('train.learning_rate', 'train.warmup_steps', 'train.schedule',
                  'train.final_lr_fraction', 'train.weight_decay', 'train.grad_clip',
                  'train.adam_b1', 'train.adam_b2', 'train.z_loss', 'train.microbatches',
                  'train.seed', 'train.prng_impl', 'train.fp8')
# Model keys that say how the weights run, not what they are: a run starting from an import's
# weights (checkpoint 0) may set them (the import writes float32, reference attention, no
# remat); a trained checkpoint's resume may not.
RUN_MODEL_KEYS = ('model.dtype', 'model.attention_impl', 'model.remat', 'model.dropout_rate',
                  'model.attention_dropout_rate', 'model.mlp_dropout', 'model.embedding_dropout')
# Every other key (model.*, the data fields that define the token stream, train.optimizer,
# train.batch_size: each data stream fills a fixed number of rows of every batch; mesh.* is
# free: checkpoints restore onto any mesh) must match the workdir's config.json.


class LockHeld(RuntimeError):
  """Another live trainer holds the workdir."""


class WorkdirLock:
  """The interface of a workdir lock: `acquire()` (raises LockHeld), `refresh()`, `release()`.

  `LocalLock` implements it with O_CREAT|O_EXCL on a POSIX filesystem; `gcs_lock.GcsLock` on
  gs:// with generation preconditions (create with `ifGenerationMatch=0`, which fails if the
  object exists; heartbeat, takeover and release with `ifGenerationMatch=<the generation read>`,
  so a taken-over lock is never clobbered). Both take over a stale lock by `stale_reason`.
  """

  lost = False   # set by refresh() when the lock on storage is another trainer's now
  pending = None  # the record being written: a SIGTERM before `record` is set still finds it

  def acquire(self) -> str:
    raise NotImplementedError

  def refresh(self) -> None:
    raise NotImplementedError

  def release(self) -> None:
    raise NotImplementedError

  def _beat(self) -> None:
    raise NotImplementedError

  def _taken_over(self, holder, reason: str) -> str:
    """After a takeover: start the heartbeat and return the message that says whose lock."""
    self._start_heartbeat()
    return (f'took over the stale lock {self.path} of pid {(holder or {}).get("pid")} on '
            f'{(holder or {}).get("host")}: {reason}')

  def _start_heartbeat(self) -> None:
    self._thread = threading.Thread(target=self._beat, daemon=True, name='workdir-lock')
    self._thread.start()


def lost_race(directory: str, holder) -> 'LockHeld':
  """Another trainer took the stale lock between our read and our write."""
  return LockHeld(f'{directory} was taken over by pid {(holder or {}).get("pid")} on '
                  f'{(holder or {}).get("host")} just now')


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class LocalLock(WorkdirLock):
  """`<workdir>/LOCK` created atomically; a daemon thread refreshes its heartbeat.

  A lock is stale (and is taken over, with a message) when its holder ran on this host and its
  pid is gone, or when its heartbeat is older than `stale_sec` (holder on another host, or a
  hung one). Two trainers that find the same stale lock at the same instant race on a rename;
  the loser finds the winner's fresh lock and refuses.
  """

  def __init__(self, workdir: str, *, heartbeat_sec: float = HEARTBEAT_SEC,
               stale_sec: float = STALE_SEC):
    self.path = os.path.join(os.path.abspath(workdir), LOCK_FILE)
    self.heartbeat_sec, self.stale_sec = heartbeat_sec, stale_sec
    self.record = None
    self._stop = threading.Event()
    self._thread = None
    self._mutex = threading.Lock()

  def _holder(self):
    """(record or None, age of the file in seconds) of the lock on disk."""
    try:
      with open(self.path) as f:
        text = f.read()
      age = time.time() - os.path.getmtime(self.path)
    except FileNotFoundError:
      return None, 0.0
    try:
      return json.loads(text), age
    except ValueError:
      return {}, age  # a holder killed between create and write: judged by the file's age

  def _stale(self, holder: dict, age: float) -> str:
    return stale_reason(holder, age, self.stale_sec)

  def _create(self) -> bool:
    """Creates the LOCK with its record in one step (a hard link of a written temporary file:
    never an empty LOCK). A SIGTERM that lands before `self.record` is set (the start-up
    handler calls release()) still removes it: release() knows the `pending` record."""
    now = time.time()
    record = {'host': socket.gethostname(), 'pid': os.getpid(), 'start': now, 'heartbeat': now}
    self.pending = record
    tmp = self._tmp_path()
    with open(tmp, 'w') as f:
      f.write(json.dumps(record))
    try:
      os.link(tmp, self.path)
    except FileExistsError:
      return False
    except OSError:  # no hard links here (e.g. a gcsfuse mount): create, then write
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        return False
      with os.fdopen(fd, 'w') as f:
        f.write(json.dumps(record))
    finally:
      os.remove(tmp)
    self.record = record
    return True

  def _tmp_path(self) -> str:
    return f'{self.path}.new-{os.getpid()}'

  def acquire(self) -> str:
    """Takes the lock; returns a message ('' or how a stale lock was taken over)."""
    paths.makedirs(os.path.dirname(self.path))
    if not self._create():
      holder, age = self._holder()
      reason = self._stale(holder, age) if holder is not None else 'it vanished'
      if not reason:
        raise LockHeld(held_message(os.path.dirname(self.path), holder, self.path))
      aside = f'{self.path}.stale-{socket.gethostname()}-{os.getpid()}'
      try:
        os.rename(self.path, aside)
        os.remove(aside)
      except FileNotFoundError:
        pass  # someone else took it over first; _create below decides
      if not self._create():
        raise lost_race(os.path.dirname(self.path), self._holder()[0])
      return self._taken_over(holder, reason)
    self._start_heartbeat()
    return ''

  def _beat(self):
    while not self._stop.wait(self.heartbeat_sec):
      self.refresh()

  def refresh(self) -> None:
    """Rewrites the heartbeat (atomically), if the lock on disk is still ours."""
    with self._mutex:
      holder, _ = self._holder()
      if self.record is None:
        return
      if not holder or holder.get('pid') != self.record['pid'] or \
          holder.get('start') != self.record['start']:
        self.lost, self.record = True, None
        return
      self.record['heartbeat'] = time.time()
      paths.write_text(self.path, json.dumps(self.record))

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    with self._mutex:
      holder, _ = self._holder()
      if holder and not self.lost and is_record(holder, self.record or self.pending):
        os.remove(self.path)
      self.record = None
      if os.path.exists(self._tmp_path()):   # a SIGTERM inside _create
        os.remove(self._tmp_path())


def is_record(holder: dict, record) -> bool:
  """Whether the lock `holder` on storage is `record` (the same pid and start time)."""
  return record is not None and (holder.get('pid'), holder.get('start')) == (record['pid'],
                                                                           record['start'])


def stale_reason(holder: dict, age: float, stale_sec: float) -> str:
  """Why the lock `holder` (its file `age` seconds old) is stale, or '' when it is alive."""
  heartbeat_age = time.time() - holder['heartbeat'] if 'heartbeat' in holder else age
  if holder.get('host') == socket.gethostname() and not _pid_alive(int(holder.get('pid', -1))):
    return f'pid {holder.get("pid")} on this host is gone'
  if heartbeat_age > stale_sec:
    return f'heartbeat {heartbeat_age:.0f} s old (> {stale_sec:.0f} s)'
  return ''


def held_message(where: str, holder: dict, lock_path: str) -> str:
  return (f'{where} is in use by pid {holder.get("pid")} on {holder.get("host")} (started '
          f'{_when(holder.get("start"))}, heartbeat {_when(holder.get("heartbeat"))}); wait for '
          f'it to finish, stop it, or delete {lock_path} if that trainer is certainly dead')


def _when(t) -> str:
  return time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t)) if t else '?'


def open_lock(workdir: str) -> WorkdirLock:
  scheme, _ = paths.bucket_of(workdir)
  if scheme is None:
    return LocalLock(workdir)
  if scheme == 'gs':
    from pretrain_jax.training import gcs_lock  # pylint: disable=g-import-not-at-top
    return gcs_lock.GcsLock(workdir)
  raise ValueError(f'workdir {workdir!r}: the workdir lock is implemented for local paths and '
                   f'gs:// only, not {scheme}://')


def is_hf_config(saved) -> bool:
  """True for a Hugging Face config.json's contents: a `model_type` (or `architectures`) and no
  `train` section, which every training workdir's config.json has. The one rule for "is this a
  Hugging Face directory" (hf.is_hf_dir, check_not_foreign, pretrain-jax evaluate)."""
  return isinstance(saved, dict) and 'train' not in saved and (
      'model_type' in saved or 'architectures' in saved)


def check_not_foreign(workdir: str) -> None:
  """Refuses a Hugging Face model directory as a workdir, before the lock or a tokenizer is
  written into it (its config.json then read as a changed config, in a 3 KB message)."""
  path = paths.join(workdir, CONFIG_FILE)
  if not paths.isfile(path):
    return
  try:
    saved = paths.read_json(path)
  except ValueError:
    return                       # the config check names a broken config.json
  if is_hf_config(saved):
    kind = (f'model_type {saved["model_type"]!r}' if 'model_type' in saved
            else f'architectures {saved.get("architectures")!r}')
    raise ValueError(f'{workdir} is a Hugging Face model directory (config.json has '
                     f'{kind}); expected a training workdir: '
                     f'import it first (pretrain-jax convert_hf import --hf_dir {workdir} '
                     '--workdir NEW_DIR) and train there')


def flatten(d: dict, prefix: str = '') -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(flatten(v, f'{prefix}{k}.'))
    else:
      out[f'{prefix}{k}'] = v
  return out


def config_differences(saved: dict, requested: dict, allowed: str = '') -> list:
  """The refused differences between two configs, as 'key: old -> new' lines.

  `allowed` is train.allow_config_change: comma-separated keys of ALLOWABLE_KEYS. Naming any
  other key is itself refused (ValueError).
  """
  allowed = [k.strip() for k in (allowed or '').split(',') if k.strip()]
  bad = [k for k in allowed if k not in ALLOWABLE_KEYS]
  if bad:
    raise ValueError(f'train.allow_config_change names {", ".join(bad)}; only these keys may '
                     f'change on resume: {", ".join(ALLOWABLE_KEYS)} (model and data-stream '
                     'keys never: train a new workdir instead)')
  old, new = flatten(saved), flatten(requested)
  missing = '<absent>'
  lines = []
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key, missing), new.get(key, missing)
    if a != b and key not in FREE_KEYS and key not in allowed and not key.startswith('mesh.'):
      lines.append(f'{key}: {a!r} -> {b!r}')
  return lines


def resolved(config: dict) -> dict:
  """`config` with each section as the dataclass it means (defaults filled in), so a
  config.json written before a field existed compares equal to one that spells it out."""
  sections = {'model': ModelConfig.from_config, 'train': TrainConfig.from_config,
              'mesh': MeshConfig.from_config, 'task': TaskConfig.from_config,
              'data': data_section}
  out = dict(config)
  for name, read in sections.items():
    try:
      out[name] = read(config[name]).to_dict()
    except (KeyError, TypeError, ValueError):   # absent, or not one this version reads: raw
      pass
  return out


def read_config(workdir: str):
  path = paths.join(workdir, CONFIG_FILE)
  if not paths.isfile(path):
    return None
  return paths.read_json(path)


def check_config(config, workdir: str, untrained: bool = False):
  """Refuses `config` where it differs from the workdir's config.json in a key that may not
  change (config_differences); returns the saved config (None: none yet). The train loop calls
  it before the data are opened, so a changed `data.files` is refused before it is prepared.
  `untrained`: the newest checkpoint is step 0, weights no step of this workdir trained (an
  import, pretrain-jax convert_hf), so only the model must match: the run starts from them with
  its own train, data and optimizer settings."""
  saved = read_config(workdir)
  if saved is not None:
    lines = config_differences(resolved(saved), resolved(config.to_dict()),
                               TrainConfig.from_config(config.train).allow_config_change)
    if untrained:
      lines = [line for line in lines if line.startswith('model.') and
               line.split(':')[0] not in RUN_MODEL_KEYS]
      if lines:
        raise ValueError(f'the model differs from the one imported into {workdir} (checkpoint 0 '
                         f'holds its weights): {"; ".join(lines)}. Keep the import\'s model '
                         f'({", ".join(RUN_MODEL_KEYS)} may change), or import again '
                         '(pretrain-jax convert_hf import) into a new workdir')
    if lines:
      raise ValueError(f'the config differs from {paths.join(workdir, CONFIG_FILE)} (the '
                       f'checkpoints were trained with it): {"; ".join(lines)}. Resume with '
                       'the same settings, name safe keys in --config.train.allow_config_change, '
                       'or use a new workdir')
  return saved


def write_config(config, workdir: str, tokenizer_path: str, start_step,
                 is_writer: bool = True) -> ml_collections.ConfigDict:
  """Checks `config` against the workdir's config.json, then records it (process 0 only).

  Returns the config as saved (`data.tokenizer` names the workdir's copy when there is one).
  Nothing is written when the config is refused or unchanged. `start_step` is the newest
  checkpoint's step (None: a fresh workdir).
  """
  config = ml_collections.ConfigDict(config.to_dict())
  root = paths.absolute(workdir)
  copy = paths.join(root, TOKENIZER_FILE)
  tokenizer_found = bool(tokenizer_path) and paths.isfile(tokenizer_path)
  copy_needed = tokenizer_found and paths.absolute(tokenizer_path) != copy
  if tokenizer_found:
    if copy_needed and paths.isfile(copy) and not _same_bytes(tokenizer_path, copy):
      raise ValueError(f'tokenizer {tokenizer_path} differs from the one this workdir was '
                       f'trained with ({copy}); resume with that one or use a new workdir')
    config.data.tokenizer = copy
  saved = check_config(config, root, untrained=start_step == 0)   # (an import's step 0)
  if saved is None and start_step is not None:
    raise ValueError(f'{root} holds checkpoints (newest step {start_step}) but no '
                     f'{CONFIG_FILE}; restore it or use a new workdir')
  if not is_writer:
    return config
  if copy_needed and not paths.isfile(copy):
    paths.copy(tokenizer_path, copy)   # atomic: a local temporary file renamed, or one object
  text = config.to_json(indent=2, sort_keys=True)
  if saved is None or json.loads(text) != saved:
    history = paths.join(root, HISTORY_DIR)
    n = len([f for f in paths.listdir(history) if f.endswith('.json')])
    if saved is not None and not n:   # an import's config.json: kept as the first version
      paths.write_text(paths.join(history, f'0_step{start_step or 0}.json'),
                       json.dumps(saved, indent=2, sort_keys=True))
      n = 1
    paths.write_text(paths.join(history, f'{n}_step{start_step or 0}.json'), text)
    paths.write_text(paths.join(root, CONFIG_FILE), text)
  return config


def _same_bytes(a: str, b: str) -> bool:
  return paths.read_bytes(a) == paths.read_bytes(b)


def shared_source(data_config, workdir: str):
  """The data source every process reads: local files / the embedded corpus are prepared once,
  by process 0, in sources.prepared_dir (on several processes `<workdir>/prepared_data` unless
  data.prepared_dir is set) while the others wait at a barrier and then open that one copy,
  so no host-local cache matters for correctness. Each host reads its streams' shares of it."""
  import jax  # pylint: disable=g-import-not-at-top
  from pretrain_jax.data import sources  # pylint: disable=g-import-not-at-top  (tensorflow)
  from pretrain_jax.training import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  count = jax.process_count()
  return sources.open_source(
      data_config, data_dir=sources.prepared_dir(data_config, workdir, count),
      process_index=jax.process_index(),
      sync=(lambda name: ckpt_lib.gather_json(name)[0]) if count > 1 else None)


def shared_tokenizer(data_config, workdir: str, source=None):
  """The tokenizer every process uses: `data.tokenizer` when set; else `<workdir>/tokenizer.model`,
  which process 0 creates (trained once on `source`, or copied from its cache:
  data.load_tokenizer) while the others wait at a barrier, so all hosts load the same file and
  no host-local cache matters for correctness. Once config.json exists the copy is the run's."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  from pretrain_jax import data  # pylint: disable=g-import-not-at-top  (pulls in tensorflow)
  if data_config.tokenizer:
    return data.load_tokenizer(data_config)
  root = paths.absolute(workdir)
  copy = paths.join(root, TOKENIZER_FILE)
  # A copy without config.json is a refused first run's: it may come from other data.* settings,
  # so it is replaced by the one these settings make (the config check guards the rest).
  if jax.process_index() == 0 and not (paths.isfile(copy) and read_config(root) is not None):
    made = data.load_tokenizer(data_config, source).path
    if not (paths.isfile(copy) and _same_bytes(made, copy)):
      paths.copy(made, copy)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices('pretrain_jax: the workdir tokenizer is written')
  return data.Tokenizer(copy)


@contextlib.contextmanager
def hold(workdir: str, steps: int):
  """Holds the workdir for a run: process 0 takes the lock (every process raises LockHeld when
  it cannot), then removes the folders of interrupted saves. Refuses `steps` below the newest
  checkpoint before anything is written. Yields `check_held(step)`, to call before each save."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from pretrain_jax.training import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  lock, error, message = None, '', ''
  held = []                            # the lock, for the start-up SIGTERM handler to release
  previous = _stop_at_startup(held)
  try:   # (the finally restores the SIGTERM handler whatever fails, e.g. an unreachable bucket)
    if jax.process_index() == 0:
      taking = open_lock(workdir)
      held.append(taking)              # (release() deletes only a LOCK it wrote)
      try:
        message = taking.acquire()
        lock = taking                  # released by the finally only once acquired
      except LockHeld as e:
        error = str(e)
    if jax.process_count() > 1:
      refused = multihost_utils.process_allgather(np.asarray(bool(error)))
      error = error or ('process 0 could not lock the workdir' if np.any(refused) else '')
    if error:
      raise LockHeld(error)
    if message:
      print(message, file=sys.stderr, flush=True)
    done = ckpt_lib.complete_steps(workdir)
    if done and done[-1] > steps:
      raise ValueError(f'train.steps={steps} but {ckpt_lib.checkpoint_dir(workdir)} holds step '
                       f'{done[-1]}: nothing to train. Pass --config.train.steps > {done[-1]} '
                       'to train on, or evaluate the checkpoint with pretrain-jax evaluate')
    if jax.process_index() == 0:
      ckpt_lib.remove_temporary(workdir)

    def check_held(step) -> None:
      """Before a save: raises LockHeld on every process when another trainer has taken the
      workdir over (its lock is checked now, not at the last heartbeat)."""
      if lock is not None:
        try:
          lock.refresh()
        except Exception as e:  # pylint: disable=broad-exception-caught  (a network blip)
          print(f'workdir lock {lock.path}: could not check it before saving step {step} '
                f'({type(e).__name__}: {e}); saving', file=sys.stderr, flush=True)
      lost = lock is not None and lock.lost
      if jax.process_count() > 1:
        lost = bool(np.any(multihost_utils.process_allgather(np.asarray(lost))))
      if lost:
        raise LockHeld(f'another trainer took over {workdir} (its LOCK is no longer this '
                       f'run\'s); this one stops without saving step {step} over its checkpoints')
    yield check_held
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)
    if lock is not None:
      lock.release()


def _stop_at_startup(held: list):
  """Until the train loop installs its own SIGTERM handler (save the step, then stop), SIGTERM
  releases the lock in `held` and exits 143: the default action would kill the process and
  leave the LOCK (another host would wait 10 minutes for it to go stale). The handler leaves
  with os._exit, not an exception: Python may run it inside a garbage-collection callback,
  where an exception is printed and dropped (the SIGTERM lost). Multi-process runs too (cli.join_processes turns
  JAX's own C-level handler off). Returns the handler it replaced (None: left alone: not the
  main thread, or a Python handler someone else set)."""
  if threading.current_thread() is not threading.main_thread() or (
      signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
    return None

  def stop(signum, frame):
    del frame
    os.write(2, b'SIGTERM before training started: stopped, nothing to save\n')
    for lock in held:
      if lock._mutex.locked():  # pylint: disable=protected-access  (interrupted inside it)
        continue                # left to go stale (at once for a later run on this host)
      try:
        lock.release()
      except Exception:  # pylint: disable=broad-exception-caught  (it goes stale instead)
        pass
    os._exit(128 + signum)  # pylint: disable=protected-access
  return signal.signal(signal.SIGTERM, stop)
