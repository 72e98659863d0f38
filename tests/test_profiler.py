"""train.profile_steps: a jax.profiler trace of chosen train steps under the workdir's
tensorboard/plugins/profile (gs:// in test_gcs.py)."""
import glob
import json
import os

import jax
import pytest
from modeling import tiny_config

from pretrain_jax.run import loop
from pretrain_jax.training import synthetic


def _gpt(**train):
  config = tiny_config('gpt', checkpoint_every=100, **train)
  config.model.num_layers = 1
  return config


def _train(config, workdir):
  return loop.train_and_evaluate(config, str(workdir),
                                 datasets=synthetic.synthetic_datasets(config))


def _traces(workdir) -> list:
  """One sorted list of file names per trace folder."""
  folders = sorted(glob.glob(os.path.join(workdir, 'tensorboard', 'plugins', 'profile', '*')))
  return [sorted(os.listdir(f)) for f in folders]


def test_the_asked_steps_are_traced_not_timed_and_a_resume_traces_its_own(tmp_path, capsys):
  """One workdir, three runs: steps 3..4 traced (not step 1: it compiles) and not counted as
  throughput; resumed at 6, the window that passed is not traced again; resumed at 8, the trace
  starts after the resume's compiling step and the run's end stops a longer one."""
  _train(_gpt(steps=6, profile_steps=2, profile_start_step=2), tmp_path)
  assert 'profile of steps 3..4 written to ' in capsys.readouterr().err
  [names] = _traces(tmp_path)
  assert 'perfetto_trace.json.gz' in names and any(n.endswith('.xplane.pb') for n in names)
  assert all(os.path.getsize(f) > 0 for f in glob.glob(str(tmp_path / 'tensorboard/**/*.pb'),
                                                          recursive=True))
  with open(tmp_path / 'metrics.jsonl') as f:
    timed = {r['step'] for r in map(json.loads, f) if 'tokens_per_sec' in r}
  assert timed == {2, 5, 6}, timed  # not 1 (compiling) nor 3..4 (traced)
  _train(_gpt(steps=8, profile_steps=2, profile_start_step=2), tmp_path)   # resumed at 6
  assert 'profile of' not in capsys.readouterr().err
  assert len(_traces(tmp_path)) == 1
  # Resumed at 8: start after step 8 at the earliest, and the run's end stops a longer trace.
  _train(_gpt(steps=11, profile_steps=10, profile_start_step=3), tmp_path)
  assert 'profile of steps 10..11 written to ' in capsys.readouterr().err   # 9 compiles
  assert len(_traces(tmp_path)) == 2


def test_a_trace_that_cannot_start_says_so(tmp_path, capsys):
  result = _train(_gpt(steps=3, profile_steps=2, profile_start_step=3), tmp_path)
  assert result['step'] == 3 and _traces(tmp_path) == []
  assert ('note: train.profile_steps=2 traces nothing: the trace would start after step 3, and '
          'this run ends at train.steps=3') in capsys.readouterr().err


@pytest.mark.parametrize('key,value', [('profile_steps', -1), ('profile_start_step', -2)])
def test_bad_profile_values_are_refused_before_anything_is_written(tmp_path, key, value):
  with pytest.raises(ValueError, match=rf'train\.{key}={value!r};'):
    _train(_gpt(steps=2, **{key: value}), tmp_path / 'w')
  assert not os.path.exists(tmp_path / 'w')


def test_a_trace_that_fails_to_start_does_not_stop_the_run(tmp_path, capsys, monkeypatch):

  def busy(*a, **k):
    raise RuntimeError('Profile has already been started')
  monkeypatch.setattr(jax.profiler, 'start_trace', busy)
  assert _train(_gpt(steps=3, profile_steps=1), tmp_path)['step'] == 3
  assert ('warning: the profile could not start (RuntimeError: Profile has already been '
          'started); training on') in capsys.readouterr().err
