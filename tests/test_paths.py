"""pretrain_jax.paths: the one layer every user path goes through (local here; gs:// in
test_gcs.py), and a check on the source that nothing else touches user paths directly."""
import os
import re
import time

import gcs_emulator
import pytest

from pretrain_jax import paths

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, 'pretrain_jax')
DIRECT = re.compile(r'\bos\.path\.|(?<![\w.])open\(|\bos\.(makedirs|listdir|remove|rename|'
                    r'replace|stat|scandir|walk)\(|\bshutil\.|\bglob\.glob\(|\bgzip\.open\(')

# (file, text on the line): local-only uses of the standard library, each with its reason.
ALLOWED = {
    # The layer itself.
    ('paths.py', ''): 'the path module',
    # Not user paths: the launcher runs on the user's machine with local files only.
    ('cloud/launcher.py', ''): 'the TPU launcher: local repo, tarball and gcloud binary',
    ('cloud/gcloud.py', ''): 'the TPU launcher: local gcloud state',
    ('commands/tpu.py', ''): 'the TPU launcher: the local clone and its configs',
    ('cli/__init__.py', 'os.path.exists(path.split'): 'config files are Python modules: local only',
    ('cli/__init__.py', 'os.path.exists(name)'): 'config files are Python modules: local only',
    ('commands/shakespeare.py', 'config.corpus'): 'the experiment\'s local corpus file',
    ('run/metrics.py', "open('/proc/cpuinfo')"): 'CPU flags of this machine',
    ('run/metrics.py', "open(self.path, 'a')"):
        'the local branch of metrics.jsonl (is_remote checked); gs:// rewrites the object',
    # LocalLock is the POSIX implementation (O_EXCL, pid, mtime); GcsLock is the gs:// one.
    ('run/lock.py', 'self.path'): 'LocalLock: the local lock file',
    ('run/lock.py', 'os.path.dirname(self.path)'): 'LocalLock: the local lock file',
    ('run/lock.py', 'self._tmp'): 'LocalLock: the record before it is linked or replaced',
    # The data cache is this host's tfds/tokenizer cache; only speed depends on it.
    ('cli/__init__.py', "jax.config.update('jax_compilation_cache_dir'"): 'the host-local JAX '
                                                                  'compilation cache',
    ('data/sources.py', "os.path.join(cache_dir(), 'tfds')"): 'tfds cache (host-local, one '
                                                              'process only, rebuilt from the '
                                                              'files)',
    ('data/sources.py', "os.path.join(directory, 'corpus')"): 'the embedded corpus in the cache',
    ('data/tokenizer.py', 'else os.path.expanduser(path)'):
        'the local branch (is_remote checked just before)',
    ('cli/terminal.py', 'os.path.exists(folder)'): 'the local branch of the refused-start '
                                                        'clean-up (is_remote checked first)',
    ('cli/terminal.py', 'folder = os.path.dirname(folder)'): 'the same local branch',
    ('experiments/char_lm.py', 'open(config.corpus'): 'the experiment\'s bundled local corpus',
    # Hugging Face: readers run on paths.local_copy(...) output, writers on a local temp dir.
    ('hf/tokenizers.py', ''): 'every reader first turns hf_dir into paths.local_copy(hf_dir)',
    ('hf/io.py', 'with open(path, \'rb\') as f'): 'safetensors header of a local_copy file',
    ('hf/io.py', 'os.path.join(hf_dir, name)'): 'hf_dir is paths.local_copy(hf_dir)',
    ('hf/io.py', 'sorted(os.listdir(hf_dir))'): 'hf_dir is paths.local_copy(hf_dir)',
    ('hf/io.py', 'with open(path(name)) as f'): 'hf_dir is paths.local_copy(hf_dir)',
    ('hf/io.py', 'os.path.isfile(path(shard))'): 'hf_dir is paths.local_copy(hf_dir)',
    ('hf/io.py', 'os.path.isfile(path(n))'): 'hf_dir is paths.local_copy(hf_dir)',
    ('hf/io.py', 'os.path.join(tmp, \'model.safetensors\')'): 'a local temporary directory',
}
LOCAL_BRANCHES = {
    # atomic_directory: local targets only (the remote branch returns before these lines).
    'hf/io.py': ('parent = os.path.dirname(target)', 'os.makedirs(parent',
                 'os.path.basename(target)',
                 'os.path.isdir(target)', 'os.rename(tmp, target)', 'shutil.rmtree(tmp',
                 'os.walk(root)', 'os.path.join(folder, name)'),
}


def direct_uses():
  """(file, line) of every standard-library file operation in the library outside the allowlist."""
  found = []
  for folder, _, files in os.walk(PACKAGE):
    for name in files:
      if not name.endswith('.py'):
        continue
      rel = os.path.relpath(os.path.join(folder, name), PACKAGE).replace(os.sep, '/')
      with open(os.path.join(folder, name), encoding='utf-8') as f:
        lines = f.read().splitlines()
      for line in lines:
        code = line.split('#')[0]
        if not DIRECT.search(code) or code.strip().startswith(('"""', "'")):
          continue
        if (rel, '') in ALLOWED and ALLOWED[(rel, '')]:
          continue
        if any(r == rel and text and text in code for r, text in ALLOWED):
          continue
        if any(text in code for text in LOCAL_BRANCHES.get(rel, ())):
          continue
        found.append((rel, line.strip()))
  return found


def test_user_paths_go_through_the_path_module():
  bad = direct_uses()
  assert not bad, ('use pretrain_jax.paths (gs:// must work) or add the line to ALLOWED with '
                   f'why it is local-only: {bad}')


def test_the_check_sees_a_direct_use():
  assert DIRECT.search("with open(os.path.join(workdir, 'x')) as f:")
  assert DIRECT.search('shutil.copyfile(a, b)') and DIRECT.search('os.makedirs(d)')
  assert not DIRECT.search('paths.open_lock(x)') and not DIRECT.search('tf.io.gfile.glob(x)')


def test_local_round_trip(tmp_path):
  target = paths.join(str(tmp_path), 'a', 'b.txt')
  paths.write_text(target, 'hello')
  assert paths.read_text(target) == 'hello' and paths.isfile(target)
  assert paths.listdir(paths.join(str(tmp_path), 'a')) == ['b.txt']
  assert paths.glob(str(tmp_path / '**' / '*.txt')) == [target]
  paths.copy(target, str(tmp_path / 'c.txt'))
  assert paths.read_bytes(str(tmp_path / 'c.txt')) == b'hello'
  assert not paths.exists('') and not paths.isfile('') and not paths.isdir('')
  assert [n for n in os.listdir(tmp_path / 'a')] == ['b.txt']  # no temporary file left


def test_remote_string_helpers():
  assert paths.join('gs://b/run/', 'checkpoints', '3') == 'gs://b/run/checkpoints/3'
  assert paths.dirname('gs://b/run/x') == 'gs://b/run' and paths.basename('gs://b/run/') == 'run'
  assert paths.absolute('gs://b/run/') == 'gs://b/run'
  assert paths.bucket_of('gs://b/x') == ('gs', 'b')
  assert paths.absolute('~/x') == os.path.join(os.path.expanduser('~'), 'x')
  for bucketless in ('gs://', 'gs:///runs/x'):   # was an IndexError inside the workdir lock
    with pytest.raises(paths.PathError, match=f"'{bucketless}' names no bucket; expected "
                                              'gs://BUCKET/'):
      paths.bucket_of(bucketless)


def test_unreachable_bucket_is_one_clear_error_within_seconds(monkeypatch):
  closed = gcs_emulator.free_port()  # nothing listens there
  for key, value in gcs_emulator.env(closed).items():
    monkeypatch.setenv(key, value)
  start = time.time()
  with pytest.raises(paths.PathError, match=r'gs://nobucket/run/config.json: cannot list '
                                            r'gs://nobucket'):
    paths.isfile('gs://nobucket/run/config.json')
  assert time.time() - start < 15


def test_missing_credentials_is_one_clear_error(monkeypatch, tmp_path):
  for key in ('STORAGE_EMULATOR_HOST', 'GOOGLE_AUTH_TOKEN_FOR_TESTING'):
    monkeypatch.delenv(key, raising=False)
  monkeypatch.setenv('GOOGLE_APPLICATION_CREDENTIALS', str(tmp_path / 'no-such-key.json'))
  start = time.time()
  with pytest.raises(paths.PathError, match=r'gs://somebucket/w: .*DefaultCredentialsError'):
    paths.exists('gs://somebucket/w')
  assert time.time() - start < 15


@pytest.mark.parametrize('path', ['gs:/bucket/x', 'gs:bucket/x', 'GS:/b', 's3:/b/k', 'https:/h/x'])
def test_a_url_missing_a_slash_is_refused_not_taken_as_a_local_path(path):
  with pytest.raises(paths.PathError, match='looks like a mistyped URL; expected .*://BUCKET/'):
    paths.is_remote(path)
  with pytest.raises(paths.PathError):
    paths.absolute(path)


def test_urls_and_local_paths_with_colons_are_what_they_look_like():
  assert paths.is_remote('gs://bucket/x') and paths.is_remote('s3://b/k')
  assert not paths.is_remote('runs/gsx:/y') and not paths.is_remote('C:/x')
  assert not paths.is_remote('/tmp/gs:/x')     # only at the start of the path
