"""A checkpoint directory's step folders, told apart without trusting a failed read: complete
(finished saves), unfinished (interrupted saves, which a trainer deletes at its start) and
unreadable (the storage refused or failed to answer: lost permissions, an outage). A folder is
never counted, replaced or deleted on a failed read: evaluation and resumption skip an
unreadable checkpoint and say so, and a resumed run neither saves over it nor lets orbax rotate
it away (checkpoint.py; docs/training.md, storage faults).

orbax's own listing (ocp.utils.checkpoint_steps, a CheckpointManager's) raises for the whole
directory when one folder's check fails; `NameFormat` gives a CheckpointManager this one.
"""
import concurrent.futures
import re
from typing import NamedTuple

import orbax.checkpoint as ocp
from etils import epath


class Listing(NamedTuple):
  complete: list     # steps of the finished checkpoints, ascending
  unfinished: list   # folders (epath.Path) of interrupted saves
  unreadable: dict   # {step: why} of step folders whose state the storage did not tell


def _look(path: epath.Path):
  """'complete', 'unfinished', None (not a checkpoint) or the error the check raised: any
  failure of the storage's answer (gcsfs's OSError or HttpError, a dropped connection, ...)."""
  try:
    if path.name.isdigit() and ocp.step.is_path_finalized(path):
      return 'complete'
    return 'unfinished' if ocp.step.is_path_temporary(path) else None
  except Exception as e:
    return e


def list_steps(directory: epath.Path) -> Listing:
  """The step folders of `directory` (checkpoint.checkpoint_dir), each checked as orbax checks
  it (on gs://, commit_success.txt; locally, no temporary name), concurrently."""
  if not directory.exists():
    return Listing([], [], {})
  entries = list(directory.iterdir())
  with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
    looks = list(pool.map(_look, entries))
  complete, unfinished, unreadable = [], [], {}
  for path, look in zip(entries, looks, strict=True):
    if look == 'complete':
      complete.append(int(path.name))
    elif look == 'unfinished':
      unfinished.append(path)
    elif isinstance(look, Exception) and path.name.isdigit():
      unreadable[int(path.name)] = why(look)
  return Listing(sorted(complete), unfinished, dict(sorted(unreadable.items())))


def why(error) -> str:
  """'Type: message' of the innermost cause, on one line: orbax's own message is a TensorStore
  repr; its cause names the array and the damage (`Error reading "params.h_0.attn.key.kernel/
  0.0.0" ...: Truncated Zstd-compressed stream`), gcsfs's the refusal (`Forbidden: ...`)."""
  chain = _chain(error)
  root = next((e for e in reversed(chain) if str(e).strip()), error)
  return f'{type(root).__name__}: {" ".join(str(root).split())[:400] or repr(root)}'


def _chain(error) -> list:
  chain = [error]
  while len(chain) < 10 and (chain[-1].__cause__ or chain[-1].__context__) not in (None, *chain):
    chain.append(chain[-1].__cause__ or chain[-1].__context__)
  return chain


# TensorStore's status codes and HTTP statuses of a storage that refused or failed to answer;
# NOT_FOUND, DATA_LOSS, INVALID_ARGUMENT, ... are answers about the files: damage.
_REFUSED = re.compile(r'\b(PERMISSION_DENIED|UNAUTHENTICATED|UNAVAILABLE|DEADLINE_EXCEEDED|'
                      r'RESOURCE_EXHAUSTED)\b|HTTP response code: (401|403|408|429|5\d\d)')
_TRANSPORT = {'HttpError', 'ClientError', 'RequestException', 'TransportError'}   # gcsfs's


def is_unreadable(error) -> bool:
  """True when a read failed in the storage (refused, unavailable, cut off) rather than on what
  it read: the checkpoint may well be whole, so it is skipped and kept, never moved aside."""
  for e in _chain(error):
    names = {c.__name__ for c in type(e).__mro__}
    if (isinstance(e, OSError) and not isinstance(e, FileNotFoundError) or names & _TRANSPORT
        or _REFUSED.search(str(e))):
      return True
  return False


class NameFormat(ocp.step.NameFormat):
  """orbax's standard step names over this module's listing, less the unreadable steps and
  those in `kept` (a restore skipped them as unreadable): a CheckpointManager made with it
  neither fails on such a folder nor counts it, so its rotation (the newest max_to_keep in the
  order it lists them) never deletes it."""

  def __init__(self):
    self.standard, self.kept = ocp.step.standard_name_format(), set()

  def build_name(self, step: int) -> str:
    return self.standard.build_name(step)

  def find_all(self, base_path):
    listed = list_steps(epath.Path(base_path))
    return iter([ocp.step.Metadata(step=s, path=epath.Path(base_path) / self.build_name(s))
                 for s in listed.complete if s not in self.kept])

  def find_step(self, base_path, step: int):
    return self.standard.find_step(base_path, step)
