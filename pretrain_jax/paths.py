"""Every path a user gives (workdir, data files, tokenizer, Hugging Face dirs) becomes an
etils.epath.Path here (`resolve`); code builds on it with `/` and its methods, local or `gs://`
alike, as orbax does. `EPATH_USE_TF=false` (unless the user chose) reads gs:// with gcsfs, which
honours STORAGE_EMULATOR_HOST as google-cloud-storage (the lock) does; tf.io.gfile ignores
emulators. What is more than one epath call lives here: GCS has no append and no rename, so a
write replaces a whole object (locally, through a renamed temporary file: `write_atomic`).
"""
import atexit
import glob as glob_lib
import json
import os
import re
import shutil
import tempfile

os.environ.setdefault('EPATH_USE_TF', 'false')

from etils import epath

_CHECKED = set()   # the buckets that answered the probe in this process
_MISTYPED_URL = re.compile(r'(gs|gcs|s3|https?|file):(?!//)', re.IGNORECASE)


class PathError(OSError):
  """A remote path that cannot be used: unreachable, no credentials, no such bucket."""


def is_remote(path) -> bool:
  """True for a URL (`gs://...`). A known scheme without its two slashes (`gs:/bucket/x`) is a
  PathError: taken as a local path, a run trained into ./gs:/bucket/x."""
  path = str(path)
  if '://' in path:
    return True
  found = _MISTYPED_URL.match(path)
  if found:
    raise PathError(f'{path!r} looks like a mistyped URL; expected '
                    f'{found.group(1).lower()}://BUCKET/... (two slashes)')
  return False


def resolve(path) -> epath.Path:
  """`path` (a user's str, or a path) as an epath.Path: local, user-expanded and absolute;
  remote, after its bucket answered (gs://: once per bucket and process). A URL naming no bucket
  (`gs://`, `gs:///x`, which epath would read as bucket `x`) is a PathError; '' a ValueError."""
  path = str(path)
  if not path:
    raise ValueError("path ''; expected a file or directory")
  if not is_remote(path):
    return epath.Path(os.path.abspath(os.path.expanduser(path)))
  scheme, rest = path.split('://', 1)
  bucket = rest.split('/', 1)[0]
  if not bucket:
    raise PathError(f'{path!r} names no bucket; expected {scheme}://BUCKET/...')
  if scheme == 'gs' and bucket not in _CHECKED:
    _probe(path, bucket)
  return epath.Path(path)


def _probe(path: str, bucket: str) -> None:
  """Raises PathError naming `path` unless `bucket` answers a one-object listing within 10 s
  (gcsfs would retry for ~35 s)."""
  from google.cloud import storage  # noqa: PLC0415 (google-cloud-storage: gs:// only)
  try:
    list(storage.Client().list_blobs(bucket, max_results=1, timeout=10.0, retry=None))
  except Exception as e:  # auth, HTTP, socket errors
    why = str(e).strip().splitlines()[0][:300] if str(e).strip() else repr(e)
    raise PathError(f'{path}: cannot list gs://{bucket} ({type(e).__name__}: {why}); expected a '
                    'reachable bucket and credentials that may read it (gcloud auth '
                    'application-default login, or a service account on the VM)') from None
  _CHECKED.add(bucket)


def cache_dir() -> epath.Path:
  """This host's cache: $PRETRAIN_JAX_CACHE, default ~/.cache/pretrain_jax."""
  return resolve(os.environ.get('PRETRAIN_JAX_CACHE', '~/.cache/pretrain_jax'))


def makedirs(path) -> epath.Path:
  """Creates a folder and its parents (a no-op on object stores, which have no folders)."""
  path = resolve(path)
  try:
    path.mkdir(parents=True, exist_ok=True)
  except (FileExistsError, NotADirectoryError):
    raise NotADirectoryError(f'{path} (or a folder above it) is a file; expected a '
                             'directory, or a path where one can be made') from None
  return path


def read_json(path):
  """The JSON value in `path`; a file that is not JSON is a ValueError naming it."""
  try:
    return json.loads(resolve(path).read_bytes())
  except (ValueError, UnicodeDecodeError) as e:
    raise ValueError(f'{path} is not valid JSON ({e}); expected the file as written') from None


def write_atomic(path, data) -> None:
  """Replaces `path` with `data` (bytes, or str as UTF-8) whole: readers see the old or the new
  content (a local temporary file renamed, or one object upload)."""
  path, data = resolve(path), data.encode() if isinstance(data, str) else data
  if is_remote(path):
    path.write_bytes(data)
    return
  if path.is_dir():
    raise IsADirectoryError(f'{path} is a directory; expected a file path to write')
  makedirs(path.parent)
  tmp = f'{path}.tmp-{os.getpid()}'
  try:
    with open(tmp, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):   # a failed write leaves no temporary behind
      os.remove(tmp)


def copy(src, dst) -> None:
  """Copies a file, local or remote on either side (epath copies within one store only); the
  destination is replaced whole."""
  write_atomic(dst, resolve(src).read_bytes())


def copy_tree(src, dst) -> None:
  """Copies a file, or a folder with everything under it, to `dst`."""
  src, dst = resolve(src), resolve(dst)
  if not src.is_dir():
    copy(src, dst)
    return
  makedirs(dst)
  for child in src.iterdir():
    copy_tree(child, dst / child.name)


def size_and_mtime(path) -> tuple:
  """(bytes, modification time in ns) of a file, for fingerprints (epath's local stat rounds
  the time to seconds)."""
  if not is_remote(path):
    st = os.stat(resolve(path))
    return st.st_size, st.st_mtime_ns
  st = resolve(path).stat()
  return st.length, int(st.mtime * 1e9)


def glob(pattern) -> list:
  """Sorted paths (str) matching `pattern` ('**' crosses folders), with glob.glob's rules
  remote too (fsspec's glob: epath's refuses '**')."""
  if is_remote(pattern):
    resolve(pattern)
    return sorted(epath.backend.fsspec_backend.glob(pattern))
  return sorted(glob_lib.glob(os.path.expanduser(pattern), recursive=True))


_STAGED = {}   # remote path -> its local copy


@atexit.register
def remove_staged() -> None:
  """Deletes local_copy's copies (cli calls it before os._exit, which runs no atexit handler)."""
  while _STAGED:
    shutil.rmtree(_STAGED.popitem()[1].parent, ignore_errors=True)


def local_copy(path) -> epath.Path:
  """A local path holding `path` (a file or a folder; itself when local), copied once per
  process, for libraries that read local files only (safetensors, tokenizers, sentencepiece)."""
  path = resolve(path)
  if not is_remote(path):
    return path
  if str(path) not in _STAGED:
    local = epath.Path(tempfile.mkdtemp(prefix='pretrain_jax-staged-')) / path.name
    copy_tree(path, local)
    _STAGED[str(path)] = local
  return _STAGED[str(path)]
