"""Every path a user gives (workdir, data files, tokenizer, Hugging Face dirs) goes through here.

Each operation is one etils.epath call, local or `gs://` alike, as in orbax. `EPATH_USE_TF=false`
(unless the user chose) reads gs:// with gcsfs, which honours STORAGE_EMULATOR_HOST as
google-cloud-storage (the lock) does; tf.io.gfile ignores emulators. GCS has no append and no
rename: a write replaces a whole object (locally, through a renamed temporary file).
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

_CHECKED = set()   # the buckets that answered check_bucket in this process
_MISTYPED_URL = re.compile(r'(gs|gcs|s3|https?|file):(?!//)', re.IGNORECASE)


class PathError(OSError):
  """A remote path that cannot be used: unreachable, no credentials, no such bucket."""


def cache_dir() -> str:
  """This host's cache: $PRETRAIN_JAX_CACHE, default ~/.cache/pretrain_jax."""
  return os.path.expanduser(os.environ.get('PRETRAIN_JAX_CACHE', '~/.cache/pretrain_jax'))


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


def absolute(path) -> str:
  """Local: the absolute, user-expanded path. Remote: unchanged (without a trailing '/')."""
  path = str(path)
  if is_remote(path):
    return path.rstrip('/') if not path.endswith('://') else path
  return os.path.abspath(os.path.expanduser(path))


def join(base, *names) -> str:
  base = str(base)
  if is_remote(base):
    if base.endswith('://'):
      bucket_of(base)  # 'gs://' alone names no bucket (stripped, it became 'gs:/NAME')
    return '/'.join([base.rstrip('/')] + [str(n).strip('/') for n in names])
  return os.path.join(base, *[str(n) for n in names])


def basename(path) -> str:
  return str(path).rstrip('/').rsplit('/', 1)[-1]


def dirname(path) -> str:
  """The parent: 'gs://b/run' for 'gs://b/run/x' (never 'gs:')."""
  path = str(path).rstrip('/')
  if is_remote(path):
    head, _, _ = path.rpartition('/')
    return head if not head.endswith(':/') else path
  return os.path.dirname(path)


def bucket_of(path) -> tuple:
  """('gs', 'bucket') of 'gs://bucket/x'; (None, None) for a local path."""
  path = str(path)
  if not is_remote(path):
    return None, None
  scheme, rest = path.split('://', 1)
  if not rest.split('/', 1)[0]:
    raise PathError(f'{path!r} names no bucket; expected {scheme}://BUCKET/...')
  return scheme, rest.split('/', 1)[0]


def check_bucket(path) -> None:
  """Raises PathError naming `path` unless its bucket answers a one-object listing within 10 s
  (gcsfs would retry for ~35 s). Once per bucket and process; gs:// only."""
  scheme, bucket = bucket_of(path)
  if scheme != 'gs' or bucket in _CHECKED:
    return
  from google.cloud import storage  # noqa: PLC0415 (google-cloud-storage: gs:// only)
  try:
    list(storage.Client().list_blobs(bucket, max_results=1, timeout=10.0, retry=None))
  except Exception as e:  # auth, HTTP, socket errors
    why = str(e).strip().splitlines()[0][:300] if str(e).strip() else repr(e)
    raise PathError(f'{path}: cannot list gs://{bucket} ({type(e).__name__}: {why}); expected a '
                    'reachable bucket and credentials that may read it (gcloud auth '
                    'application-default login, or a service account on the VM)') from None
  _CHECKED.add(bucket)


def epath_of(p) -> epath.Path:
  """`p` as an epath.Path (local: absolute, user-expanded; gs://: its bucket checked once)."""
  if is_remote(p):
    check_bucket(p)
    return epath.Path(str(p))
  return epath.Path(absolute(p))


def exists(p) -> bool:
  return bool(str(p)) and epath_of(p).exists()


def isfile(p) -> bool:
  return bool(str(p)) and epath_of(p).is_file()


def isdir(p) -> bool:
  return bool(str(p)) and epath_of(p).is_dir()


def listdir(p) -> list:
  """Sorted names in a folder ([] when it does not exist)."""
  folder = epath_of(p)
  return sorted(c.name for c in folder.iterdir()) if folder.is_dir() else []


def makedirs(p) -> None:
  """Creates a folder and its parents (a no-op on object stores, which have no folders)."""
  try:
    epath_of(p).mkdir(parents=True, exist_ok=True)
  except (FileExistsError, NotADirectoryError):
    raise NotADirectoryError(f'{p} (or a folder above it) is a file; expected a '
                             'directory, or a path where one can be made') from None


def read_bytes(p) -> bytes:
  return epath_of(p).read_bytes()


def read_text(p) -> str:
  return read_bytes(p).decode('utf-8')


def read_json(p):
  """The JSON value in `p`; a file that is not JSON is a ValueError naming it."""
  try:
    return json.loads(read_text(p))
  except (ValueError, UnicodeDecodeError) as e:
    raise ValueError(f'{p} is not valid JSON ({e}); expected the file as written') from None


def write_bytes(path, data: bytes) -> None:
  """Replaces `path` whole, atomically (readers see the old or the new content)."""
  if is_remote(path):
    epath_of(path).write_bytes(data)   # one object upload
    return
  path = absolute(path)
  if os.path.isdir(path):
    raise IsADirectoryError(f'{path} is a directory; expected a file path to write')
  os.makedirs(os.path.dirname(path), exist_ok=True)
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


def write_text(path, text: str) -> None:
  write_bytes(path, text.encode('utf-8'))


def copy(src, dst) -> None:
  """Copies a file, local or remote on either side (the destination is replaced whole)."""
  write_bytes(dst, read_bytes(src))


def copy_tree(src, dst) -> None:
  """Copies a file, or a folder with everything under it, to `dst`."""
  if not isdir(src):
    copy(src, dst)
    return
  makedirs(dst)
  for name in listdir(src):
    copy_tree(join(src, name), join(dst, name))


def rmtree(p) -> None:
  epath_of(p).rmtree(missing_ok=True)


def rename(src, dst) -> None:
  """Moves a file or folder (on GCS: a copy then a delete, so not atomic)."""
  epath_of(src).rename(str(epath_of(dst)))


def size_and_mtime(path) -> tuple:
  """(bytes, modification time in ns) of a file, for fingerprints."""
  if not is_remote(path):
    st = os.stat(absolute(path))
    return st.st_size, st.st_mtime_ns
  st = epath_of(path).stat()
  return st.length, int(st.mtime * 1e9)


def glob(pattern) -> list:
  """Sorted paths matching `pattern` ('**' crosses folders), with glob.glob's rules remote too
  (fsspec's glob: epath's refuses '**')."""
  if is_remote(pattern):
    check_bucket(pattern)
    return sorted(epath.backend.fsspec_backend.glob(pattern))
  return sorted(glob_lib.glob(os.path.expanduser(pattern), recursive=True))


_STAGED = {}   # remote path -> its local copy


@atexit.register
def remove_staged() -> None:
  """Deletes local_copy's copies (cli calls it before os._exit, which runs no atexit handler)."""
  while _STAGED:
    shutil.rmtree(os.path.dirname(_STAGED.popitem()[1]), ignore_errors=True)


def local_copy(path) -> str:
  """A local path holding `path` (a file or a folder; itself when local), copied once per
  process, for libraries that read local files only (safetensors, tokenizers, sentencepiece)."""
  if not is_remote(path):
    return str(path)
  path = absolute(path)
  if path not in _STAGED:
    local = os.path.join(tempfile.mkdtemp(prefix='pretrain_jax-staged-'), basename(path))
    copy_tree(path, local)
    _STAGED[path] = local
  return _STAGED[path]
