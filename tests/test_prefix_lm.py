"""The prefix LM end to end: `pretrain-jax train --config tiny_prefix_lm` trains it from the
CLI, and `evaluate` and `generate` work on its workdir as on a GPT's."""
import json
import os

import commands
import numpy as np
import pytest
from modeling import tiny

from pretrain_jax.hf.config import export_problems
from pretrain_jax.models import family_of


def _run(command, *flags):
  done = commands.run(command, *flags, timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.slow
def test_tiny_prefix_lm_trains_evaluates_and_generates_from_the_cli(module_cache, tmp_path):
  work = str(tmp_path / 'prefix_lm')
  summary, err = _run('train', '--config', 'tiny_prefix_lm', '--workdir', work,
                      '--config.train.steps=6', '--config.train.batch_size=4',
                      '--config.train.eval_every=6', '--config.train.eval_batches=1',
                      '--config.train.log_every=3', '--config.train.checkpoint_every=6',
                      '--config.data.seq_len=64')
  assert summary['step'] == 6 and np.isfinite(summary['train_loss']), summary
  with open(os.path.join(work, 'config.json')) as f:
    config = json.load(f)
  assert config['model']['prefix_lm'] and config['data']['objective'] == 'prefix_lm'
  metrics, _ = _run('evaluate', '--workdir', work, '--batches', '2')
  assert np.isfinite(metrics['lm_loss']) and 0 <= metrics['lm_accuracy'] <= 1, metrics
  out, _ = _run('generate', '--workdir', work, '--prompt', 'The return statement',
                '--max_new_tokens', '4')
  assert out['family'] == 'gpt' and len(out['results']) == 1, out
  # The objective follows the mask: a prefix-LM model refuses next-token (CLM) data.
  done = commands.run('train', '--config', 'tiny_prefix_lm', '--workdir', tmp_path / 'clm',
                      '--config.data.objective=clm', timeout=600)
  assert done.returncode != 0
  assert "config.data.objective='clm'" in done.stderr and "'prefix_lm'" in done.stderr


def test_a_prefix_lm_is_not_exported_as_hugging_face_gpt2():
  cfg = tiny('gpt', prefix_lm=True)
  assert export_problems(cfg) == ['model.prefix_lm=True; Hugging Face GPT-2 has no '
                                  'bidirectional prefix']
  assert export_problems(tiny('gpt')) == []
  assert family_of(cfg).pretrain_objective(cfg) == 'prefix_lm'
  assert family_of(cfg).pretrain_objective(tiny('gpt')) == 'clm'
