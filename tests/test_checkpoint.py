"""Checkpoints through the whole loop: SIGTERM + exact resume, restore_params, no NaN saves."""
import os
import signal

import jax
import numpy as np
import pytest
from helpers import train_losses
from modeling import datasets_with_hook, tiny_config

from pretrain_jax.run import checkpoint, loop
from pretrain_jax.training import synthetic


def sigterm_at(n):
  def hook(drawn, batch):
    if drawn == n:
      os.kill(os.getpid(), signal.SIGTERM)
    return batch
  return hook


@pytest.mark.parametrize('family', ['gpt', pytest.param('t5', marks=pytest.mark.slow)])
def test_sigterm_then_resume_matches_an_uninterrupted_run_bitwise(tmp_path, family):
  config = tiny_config(family, steps=20, checkpoint_every=100, schedule='cosine',
                       optimizer='adafactor' if family == 't5' else 'adamw')
  config.model.update(num_layers=1, dropout_rate=0.1)  # dropout randomness must resume too
  whole = loop.train_and_evaluate(config, str(tmp_path / 'whole'),
                                  datasets=synthetic.synthetic_datasets(config))
  assert whole['step'] == 20 and not whole['preempted']

  parts = str(tmp_path / 'parts')
  first = loop.train_and_evaluate(config, parts, datasets=datasets_with_hook(config,
                                                                             sigterm_at(10)))
  assert first['preempted'] and first['step'] == 10
  assert first['checkpoint_steps'] == [10]            # SIGTERM saved exactly where it stopped
  assert signal.getsignal(signal.SIGTERM) is not None  # handler handed back
  second = loop.train_and_evaluate(config, parts, datasets=synthetic.synthetic_datasets(config))
  assert second['start_step'] == 10 and second['step'] == 20

  expected, got = train_losses(str(tmp_path / 'whole')), train_losses(parts)
  assert sorted(got) == list(range(1, 21))
  assert [got[s] for s in range(1, 21)] == [expected[s] for s in range(1, 21)]

  _, params_whole, step = checkpoint.restore_params(str(tmp_path / 'whole'))
  _, params_parts, _ = checkpoint.restore_params(parts)
  assert step == 20
  jax.tree.map(np.testing.assert_array_equal, params_whole, params_parts)


def test_restore_params_reads_config_and_latest_params(tmp_path):
  config = tiny_config('bert', steps=4, checkpoint_every=2, keep_checkpoints=2)
  config.model.num_layers = 1
  result = loop.train_and_evaluate(config, str(tmp_path),
                                   datasets=synthetic.synthetic_datasets(config))
  assert result['checkpoint_steps'] == [2, 4]
  restored_config, params, step = checkpoint.restore_params(str(tmp_path))
  assert step == 4 and restored_config.model.to_dict() == config.model.to_dict()
  _, params_2, step_2 = checkpoint.restore_params(str(tmp_path), step=2)
  assert step_2 == 2
  assert 'word_embeddings' in params and params['word_embeddings']['embedding'].shape == (128, 32)
  assert not np.array_equal(params['word_embeddings']['embedding'],
                            params_2['word_embeddings']['embedding'])
  with pytest.raises(FileNotFoundError, match='no checkpoint 3'):
    checkpoint.restore_params(str(tmp_path), step=3)


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
  config = tiny_config('gpt', steps=12, checkpoint_every=4, log_every=100)
  config.model.num_layers = 1

  def poison(drawn, batch):
    if drawn >= 7:
      batch['loss_weights'] = batch['loss_weights'] * np.float32('nan')
    return batch
  with pytest.raises(FloatingPointError, match='non-finite training at step 7: loss nan'):
    loop.train_and_evaluate(config, str(tmp_path), datasets=datasets_with_hook(config, poison))
  _, params, step = checkpoint.restore_params(str(tmp_path))
  assert step == 4
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(params))
