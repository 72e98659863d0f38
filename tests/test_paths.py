"""pretrain_jax.paths: the one layer every user path goes through (local here; gs:// in
test_gcs.py). That nothing else touches user paths directly is ruff's check (pyproject.toml:
banned-api, PTH123)."""
import os
import re
import subprocess
import sys
import time

import gcs_emulator
import helpers
import pytest
from helpers import ROOT

from pretrain_jax import paths


def test_the_lint_rule_sees_direct_file_access_in_the_library_only():
  code = ('import os\nimport shutil\n\nopen(os.path.join("w", "x"))\nos.listdir("w")\n'
          'shutil.rmtree("w")\n')
  def findings(filename):
    done = subprocess.run([sys.executable, '-m', 'ruff', 'check', '--no-cache', '--output-format',
                           'concise', '--stdin-filename', filename, '-'], input=code, cwd=ROOT,
                          capture_output=True, text=True, check=False)
    return sorted(set(re.findall(r'(TID251|PTH123) `([\w.]+)', done.stdout)))
  assert findings('pretrain_jax/data/new.py') == [
      ('PTH123', 'open'), ('TID251', 'os.listdir'), ('TID251', 'os.path'), ('TID251', 'shutil')]
  assert findings('pretrain_jax/paths.py') == findings('tests/new.py') == []


def test_local_round_trip(tmp_path):
  target = paths.resolve(str(tmp_path)) / 'a' / 'b.txt'
  paths.write_atomic(target, 'hello')
  assert target.read_text() == 'hello' and target.is_file()
  assert paths.glob(str(tmp_path / '**' / '*.txt')) == [str(target)]
  paths.copy(target, str(tmp_path / 'c.txt'))
  assert paths.resolve(str(tmp_path / 'c.txt')).read_bytes() == b'hello'
  assert os.listdir(tmp_path / 'a') == ['b.txt']  # no temporary file left
  with pytest.raises(ValueError, match="path ''"):   # (not the current directory)
    paths.resolve('')


def test_resolve(monkeypatch):
  monkeypatch.setattr(paths, '_CHECKED', {'b'})   # bucket b answered the probe
  run = paths.resolve('gs://b/run/')
  assert str(run) == 'gs://b/run' and str(run / 'checkpoints' / '3') == 'gs://b/run/checkpoints/3'
  assert str(run.parent) == 'gs://b' and (run / 'x').name == 'x'
  assert paths.resolve('~/x') == paths.resolve(os.path.join(os.path.expanduser('~'), 'x'))
  assert str(paths.resolve('a/../b')) == os.path.join(os.getcwd(), 'b')
  for bucketless in ('gs://', 'gs:///runs/x'):   # was an IndexError inside the workdir lock
    with pytest.raises(paths.PathError, match=f"'{bucketless}' names no bucket; expected "
                                              'gs://BUCKET/'):
      paths.resolve(bucketless)


def test_unreachable_bucket_is_one_clear_error_within_seconds(monkeypatch):
  closed = helpers.free_port()  # nothing listens there
  for key, value in gcs_emulator.env(closed).items():
    monkeypatch.setenv(key, value)
  start = time.time()
  with pytest.raises(paths.PathError, match=r'gs://nobucket/run/config.json: cannot list '
                                            r'gs://nobucket'):
    paths.resolve('gs://nobucket/run/config.json')
  assert time.time() - start < 15


def test_missing_credentials_is_one_clear_error(monkeypatch, tmp_path):
  for key in ('STORAGE_EMULATOR_HOST', 'GOOGLE_AUTH_TOKEN_FOR_TESTING'):
    monkeypatch.delenv(key, raising=False)
  monkeypatch.setenv('GOOGLE_APPLICATION_CREDENTIALS', str(tmp_path / 'no-such-key.json'))
  start = time.time()
  with pytest.raises(paths.PathError, match=r'gs://somebucket/w: .*DefaultCredentialsError'):
    paths.resolve('gs://somebucket/w')
  assert time.time() - start < 15


@pytest.mark.parametrize('path', ['gs:/bucket/x', 'gs:bucket/x', 'GS:/b', 's3:/b/k', 'https:/h/x'])
def test_a_url_missing_a_slash_is_refused_not_taken_as_a_local_path(path):
  with pytest.raises(paths.PathError, match='looks like a mistyped URL; expected .*://BUCKET/'):
    paths.is_remote(path)
  with pytest.raises(paths.PathError):
    paths.resolve(path)


def test_urls_and_local_paths_with_colons_are_what_they_look_like():
  assert paths.is_remote('gs://bucket/x') and paths.is_remote('s3://b/k')
  assert not paths.is_remote('runs/gsx:/y') and not paths.is_remote('C:/x')
  assert not paths.is_remote('/tmp/gs:/x')     # only at the start of the path
