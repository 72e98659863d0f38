"""Two local processes (jax.distributed over gloo, as tests/test_multihost.py) sharing a gs://
workdir and gs:// data files in the emulator: one tokenizer is trained (by process 0, into the
workdir), both use it, process 0 alone prepares the files once into one directory both read
(neither prepares a copy in its own cache), only process 0 writes workdir files, and the run
resumes.

The prepared copy is in a local directory both processes share (`data.prepared_dir`), not in
the gs:// workdir: TensorFlow's own gs:// filesystem, which tf.data reads a tfds copy with,
cannot be pointed at the emulator (its endpoints are compiled in). The code path is the same
one a `<workdir>/prepared_data` on a bucket takes."""
import json
import os
import subprocess
import sys

import gcs_emulator
import pytest
from helpers import ROOT, SMALL, TRAIN, free_port, one_device_env
from modeling import upload_corpus

from pretrain_jax import paths


def test_multihost_without_a_detectable_cluster_is_one_clear_error(tmp_path):
  run = subprocess.run([sys.executable, *TRAIN, *SMALL, '--workdir', str(tmp_path / 'w'),
                        '--multihost'], cwd=ROOT, env=one_device_env(), capture_output=True,
                       text=True, timeout=300)
  assert run.returncode == 2   # a user error (pretrain_jax.cli)
  last = run.stderr.strip().splitlines()[-1]
  assert last.startswith('error: --multihost could not detect the cluster') and \
      '--coordinator_address=HOST:PORT --num_processes=N --process_id=I' in last


def _two_processes(env, workdir, files, caches, steps, prepared):
  port = free_port()
  procs = [subprocess.Popen(
      [sys.executable, *TRAIN, *SMALL, '--workdir', workdir, f'--config.train.steps={steps}',
       f'--config.data.files={files}', f'--config.data.prepared_dir={prepared}', '--multihost',
       f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2', f'--process_id={i}'],
      cwd=ROOT,
      env=dict(env, PRETRAIN_JAX_CACHE=caches[i]), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True) for i in range(2)]
  outs = [p.communicate(timeout=900) for p in procs]
  for p, (_, err) in zip(procs, outs, strict=True):
    assert p.returncode == 0, err[-3000:]
  assert not [line for line in outs[1][0].splitlines() if line.startswith('{')]  # process 0 alone
  return json.loads(outs[0][0].strip().splitlines()[-1])


@pytest.mark.slow
def test_two_processes_share_one_gs_workdir_and_one_tokenizer(tmp_path):
  with gcs_emulator.serve() as gcs_env:
    saved = dict(os.environ)
    os.environ.update(gcs_env)
    try:
      files = upload_corpus('gs://bucket/corpus')
      env = dict(one_device_env(), **gcs_env)
      caches = [str(tmp_path / 'cache0'), str(tmp_path / 'cache1')]
      prepared = str(tmp_path / 'prepared')
      workdir = 'gs://bucket/run'
      first = _two_processes(env, workdir, files, caches, steps=3, prepared=prepared)
      assert first['step'] == 3 and first['checkpoint_steps'] == [3]
      # One prepared copy, in the shared directory; none in either process's cache.
      copies = os.listdir(os.path.join(prepared, 'local_text_files'))
      assert len(copies) == 1
      assert not [c for c in caches if os.path.exists(os.path.join(c, 'tfds'))]
      # One tokenizer, trained by process 0; process 1 trained none and loaded the workdir's.
      assert os.listdir(os.path.join(caches[0], 'tokenizers'))
      assert not os.path.exists(os.path.join(caches[1], 'tokenizers'))
      run = paths.resolve(workdir)
      config = paths.read_json(run / 'config.json')
      assert config['data']['tokenizer'] == f'{workdir}/tokenizer.model'
      rows = [json.loads(line) for line in (run / 'metrics.jsonl').read_text().splitlines()]
      assert [r['step'] for r in rows if r['split'] == 'train'] == [1, 2, 3]  # written once
      assert len(list((run / 'config_history').iterdir())) == 1

      resumed = _two_processes(env, workdir, files, caches, steps=5, prepared=prepared)
      assert resumed['start_step'] == 3 and resumed['step'] == 5
      rows = [json.loads(line) for line in (run / 'metrics.jsonl').read_text().splitlines()]
      assert [r['step'] for r in rows if r['split'] == 'train'] == [1, 2, 3, 4, 5]
      assert not (run / 'LOCK').exists()
      assert os.listdir(os.path.join(prepared, 'local_text_files')) == copies  # reused
    finally:
      os.environ.clear()
      os.environ.update(saved)
