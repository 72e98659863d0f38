"""What a command leaves for a person: a short summary, one compact JSON line, no litter.

  terminal.finish(line, summary=[...], details=big_dict, where=workdir, name='train_tiny')

A command ends with finish(): its summary lines (a few lines or a small table) on stderr, then
one JSON line on stdout holding the headline numbers and the paths, compact (under
LINE_BYTES) so that it reads at a glance and pipes to `jq`; anything larger (per-probe
results, whole tables) goes to `<where>/<name>_results.json`, which the line names as
`details`.

A command that starts a run in a workdir does it inside `removed_if_refused(workdir)`: a run
refused before it trained (a data glob that matches no file, a tokenizer that does not fit the
model) leaves no new, empty workdir behind.
"""
import contextlib
import json
import math
import sys

from etils import epath

from pretrain_jax import paths

LINE_BYTES = 1024   # the stdout line stays under this; the details file takes the rest
# The files a start writes before its checks against the data can refuse it: the workdir's
# copy of the tokenizer (the run's only once config.json exists, docs/training.md). Any other
# file (config.json, a checkpoint, metrics.jsonl, another process's LOCK) keeps the folder.
START_UP_FILES = ('tokenizer.model',)


def strict(value, where: str = '', found=None):
  """`value` with every NaN / inf float replaced by None: strict JSON (`NaN` is not JSON, and
  `jq` refuses a line holding it). `found` collects the keys (`a.b[0]`) of those replaced."""
  if isinstance(value, dict):
    return {k: strict(v, f'{where}.{k}'.lstrip('.'), found) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [strict(v, f'{where}[{i}]', found) for i, v in enumerate(value)]
  if isinstance(value, float) and not math.isfinite(value):
    if found is not None:
      found.append(where)
    return None
  return value


def dumps(value, **kw) -> str:
  """json.dumps of strict(value)."""
  return json.dumps(strict(value), allow_nan=False, **kw)


def finish(line: dict, summary=(), details=None, where: str = '', name: str = '') -> dict:
  """Prints `summary` on stderr and `line` as one strict JSON line on stdout (a non-finite
  number is null, and stderr names it); returns the line. With `details`, writes them to
  `<where>/<name>_results.json` first and names that file in the line (key `details`)."""
  for text in summary:
    print(text, file=sys.stderr)
  if details is not None:
    path = epath.Path(where) / f'{name}_results.json'   # (named as the user gave `where`)
    paths.write_atomic(path, dumps(details, indent=1) + '\n')
    line = {**line, 'details': str(path)}
  found = []
  line = strict(line, found=found)
  if found:
    print(f'non-finite: {", ".join(found)} (null in the JSON line)', file=sys.stderr)
  sys.stderr.flush()
  print(json.dumps(line, allow_nan=False), flush=True)
  return line


def run_summary(result: dict) -> str:
  """A line for the train loop's summary (loop.train_and_evaluate's result)."""
  def num(key, spec='.4f'):
    return '-' if result.get(key) is None else format(result[key], spec)
  stopped = ' (stopped by SIGTERM; rerun to resume)' if result.get('preempted') else ''
  saved = ', '.join(map(str, result.get('checkpoint_steps') or [])) or 'none'
  if result['start_step'] == result['step'] == result['steps']:
    return (f"{result['family']} in {result['workdir']}: already complete at step "
            f"{result['steps']}, nothing trained (a larger --config.train.steps continues it); "
            f'checkpoints: {saved}')
  computed = f", computing in {result['dtype']}" if result.get('dtype') else ''
  return (f"{result['family']} in {result['workdir']}: steps {result['start_step']}-"
          f"{result['step']} of {result['steps']}{computed}{stopped}; train loss "
          f"{num('train_loss')}, "
          f"validation loss {num('eval_loss')} (accuracy {num('eval_accuracy', '.3f')}); "
          f'checkpoints: {saved}')


def _new_folders(workdir: str) -> list:
  """`workdir` and the folders above it that do not exist yet, deepest first."""
  folder = paths.resolve(workdir)
  if paths.is_remote(folder):   # an object store has no folders above the workdir's objects
    return [] if folder.exists() else [folder]
  new = []
  while not folder.exists() and folder != folder.parent:
    new.append(folder)
    folder = folder.parent
  return new


def _clear(folder) -> bool:
  """Removes `folder` if it and its subfolders hold nothing but START_UP_FILES; True if
  removed. Each subfolder that qualifies is removed even where the folder stays."""
  children = list(folder.iterdir()) if folder.is_dir() else []
  subfolders = [c for c in children if c.is_dir()]
  files = [c for c in children if c not in subfolders]
  cleared = [_clear(c) for c in subfolders]
  if not all(cleared) or any(c.name not in START_UP_FILES for c in files):
    return False
  for file in files:
    file.unlink()
  if not paths.is_remote(folder):
    folder.rmdir()   # refuses a folder that is not empty: nothing written meanwhile is lost
  return True


@contextlib.contextmanager
def removed_if_refused(workdir: str):
  """Runs the body; when it raises (a refusal, Ctrl-C), removes the workdir and the folders
  above it that did not exist before, if they hold nothing but start-up files. A workdir that
  existed, or that holds a checkpoint, a config.json, logs or a lock, stays as it is."""
  new = _new_folders(workdir) if workdir else []
  try:
    yield
  except BaseException:
    if new:
      try:
        _clear(new[-1])
      except Exception:  # e.g. a file written meanwhile
        pass             # never hides the error being raised
    raise
