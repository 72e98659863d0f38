"""What a person sees: each command's summary on stderr, a compact last line on stdout (the
headline numbers and paths, < 1 KB; the rest in a file it names), `describe`'s table in
counting order, and no empty workdir left by a run refused at start."""
import json
import os
import re
import shutil

import commands
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import ROOT

from pretrain_jax.cli import terminal
from pretrain_jax.run import checkpoint


def command(name: str, *args, cwd=ROOT, env=None):
  return commands.run(name, *args, cwd=cwd, timeout=900, env=dict(os.environ, **(env or {})))


def last_line(done) -> dict:
  assert done.returncode == 0, done.stderr[-3000:]
  line = done.stdout.strip().splitlines()[-1]
  assert len(line.encode()) < terminal.LINE_BYTES, len(line.encode())
  return commands.strict_json(line)


def test_main_job_ends_with_a_compact_line(tmp_path, gpt_workdir):
  """train_tiny's line was 14 KB (every probe's examples). (evaluate's line and summary:
  test_pretrained.test_api_reproduces_the_logged_eval_loss_and_evaluate_is_deterministic.)"""
  env = {'PRETRAIN_JAX_CACHE': f'{gpt_workdir}_cache'}   # tiny_gpt's tokenizer and corpus
  done = command('train_tiny', '--workdir', 'runs/tiny', '--models', 'tiny_gpt', '--steps', '2',
                 '--probe_sentences', '2', '--eval_batches', '1', cwd=tmp_path, env=env)
  line = last_line(done)
  assert set(line) == {'workdir', 'wall_sec', 'models', 'details'}
  (gpt,) = line['models']
  assert set(gpt) == {'name', 'family', 'workdir', 'step', 'checkpoint_steps', 'train_loss',
                      'eval_loss', 'eval_accuracy', 'held_out_loss_trained',
                      'held_out_loss_random_init'}
  assert (gpt['name'], gpt['workdir'], gpt['step']) == ('tiny_gpt', 'runs/tiny/gpt', 2)
  assert line['details'] == 'runs/tiny/train_tiny_results.json'
  details = json.loads((tmp_path / line['details']).read_text())
  held_out = details['models'][0]['held_out']
  assert len(held_out['continuations']) == 2 and held_out['trained']['target_tokens'] > 0
  assert gpt['held_out_loss_trained'] == round(held_out['trained']['lm_loss'], 4)
  assert gpt['held_out_loss_random_init'] == round(held_out['random_init']['lm_loss'], 4)
  assert f'every number in {line["details"]}' in done.stderr
  assert done.stderr.strip().splitlines()[-1].startswith('next: pretrain-jax generate ')
  # the published model.dtype='auto', resolved for the CPU the run's steps ran on
  assert re.search(r"gpt: [\d,]+ parameters, mesh .*, computing in float32, steps 0\.\.2",
                   done.stderr)


def test_describe_counts_layers_in_order_under_a_header_with_a_total():
  done = command('describe', '--config', 'tiny_gpt', '--config.model.num_layers=11')
  line = last_line(done)
  table = done.stderr.strip().splitlines()
  assert table[0].split()[:2] == ['parameter', 'shape'] and set(table[1]) == {'-'}
  rows = [r for r in table if r.startswith('h_')]
  layers = list(dict.fromkeys(r.split('/')[0] for r in rows))
  assert layers == [f'h_{i}' for i in range(11)]                    # not h_0 h_1 h_10 h_2
  total = re.fullmatch(r'total \((\d+) arrays\)\s+([\d,]+)', table[-1])
  assert total and int(total.group(2).replace(',', '')) == line['params']
  counted = [int(r.split()[-1].replace(',', '')) for r in table[2:-2]]
  assert len(counted) == int(total.group(1)) and sum(counted) == line['params']


def test_a_run_refused_at_start_leaves_no_new_directory(tmp_path):
  nothing = str(tmp_path / 'none' / '*.jsonl')
  done = command('train', '--config', 'tiny_gpt', '--workdir', str(tmp_path / 'runs' / 'mine'),
                 f'--config.data.files={nothing}')
  assert done.returncode == 2 and 'matches no file' in done.stderr, done.stderr[-2000:]
  assert sorted(os.listdir(tmp_path)) == []        # neither runs/mine nor runs/
  (tmp_path / 'kept').mkdir()                       # a workdir that existed stays
  done = command('train', '--config', 'tiny_gpt', '--workdir', str(tmp_path / 'kept'),
                 f'--config.data.files={nothing}')
  assert done.returncode == 2 and sorted(os.listdir(tmp_path)) == ['kept']


def refuse(workdir, write=()):
  """removed_if_refused(workdir) around a start that writes `write` (relative paths), then
  is refused."""
  with pytest.raises(ValueError, match='refused'):
    with terminal.removed_if_refused(str(workdir)):
      for name in write:
        path = workdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('x')
      raise ValueError('refused')


def test_removed_if_refused_removes_only_what_the_start_made(tmp_path):
  refuse(tmp_path / 'a' / 'b' / 'w', ['tokenizer.model', 'sub/tokenizer.model'])
  assert os.listdir(tmp_path) == []                 # the workdir and the folders it made
  for kept in (['LOCK'], ['config.json'], ['checkpoints/1/x', 'tokenizer.model']):
    refuse(tmp_path / 'w', kept)                    # another's lock, a config, a checkpoint
    assert sorted(os.listdir(tmp_path / 'w')) == sorted({k.split('/')[0] for k in kept}), kept
    shutil.rmtree(tmp_path / 'w')
  refuse(tmp_path / 'tiny', ['gpt/config.json', 't5/tokenizer.model'])   # per-model workdirs
  assert os.listdir(tmp_path / 'tiny') == ['gpt']
  (tmp_path / 'old').mkdir()
  refuse(tmp_path / 'old')                          # it existed before: it stays
  assert (tmp_path / 'old').is_dir()
  with terminal.removed_if_refused(str(tmp_path / 'fine')):
    (tmp_path / 'fine').mkdir()
  assert (tmp_path / 'fine').is_dir()               # a start that went on keeps its folder


def test_finish_writes_the_details_and_names_them(tmp_path, capsys):
  line = terminal.finish({'step': 3}, summary=['a summary'], details={'rows': list(range(500))},
                         where=str(tmp_path), name='thing')
  out, err = capsys.readouterr()
  assert json.loads(out) == line == {'step': 3, 'details': str(tmp_path / 'thing_results.json')}
  assert err == 'a summary\n'
  assert json.loads((tmp_path / 'thing_results.json').read_text()) == {'rows': list(range(500))}


def test_finish_writes_non_finite_numbers_as_null_and_says_so(tmp_path, capsys):
  nan, inf = float('nan'), float('inf')
  terminal.finish({'loss': nan, 'rows': [{'x': -inf}, 1.5]}, summary=['loss nan'],
                  details={'loss': inf}, where=str(tmp_path), name='thing')
  out, err = capsys.readouterr()
  assert commands.strict_json(out) == {'loss': None, 'rows': [{'x': None}, 1.5],
                                       'details': str(tmp_path / 'thing_results.json')}
  assert commands.strict_json((tmp_path / 'thing_results.json').read_text()) == {'loss': None}
  assert err.splitlines()[-1].split(' (')[0] == 'non-finite: loss, rows[0].x'


def test_every_command_ends_through_terminal():
  """The JSON every command prints is terminal's (strict); json.dumps would write NaN."""
  folder = os.path.join(ROOT, 'pretrain_jax', 'commands')
  for name in sorted(os.listdir(folder)):
    text = open(os.path.join(folder, name)).read()
    assert 'json.dumps(' not in text, name


def test_evaluate_of_a_checkpoint_whose_loss_is_nan_ends_with_strict_json(tmp_path, gpt_workdir):
  workdir = tmp_path / 'w'
  shutil.copytree(gpt_workdir, workdir)
  shutil.copytree(f'{gpt_workdir}_cache', f'{workdir}_cache')
  ckpt = checkpoint.Checkpointer(str(workdir), async_save=False)
  config, params, step = checkpoint.restore_params(str(workdir))
  huge = jax.tree.map(lambda x: x * np.float32(1e30), params)   # finite weights, NaN loss
  ckpt.manager.save(step + 1, args=ocp.args.Composite(
      state=ocp.args.StandardSave({'params': huge}), data=ocp.args.JsonSave({})))
  ckpt.close()
  done = command('evaluate', '--workdir', workdir, '--batches', '1',
                 env={'PRETRAIN_JAX_CACHE': f'{workdir}_cache'})
  line = last_line(done)
  assert line['step'] == step + 1 and line['loss'] is None
  assert 'non-finite: loss' in done.stderr


def test_the_summary_of_a_finished_run_says_it_is_complete():
  result = {'family': 'gpt', 'workdir': 'w', 'start_step': 20, 'step': 20, 'steps': 20,
            'checkpoint_steps': [20]}
  line = terminal.run_summary(result)
  assert 'already complete at step 20' in line and '--config.train.steps' in line
  assert 'already' not in terminal.run_summary(dict(result, start_step=10))
  assert 'steps 10-20 of 20, computing in bfloat16; ' in terminal.run_summary(
      dict(result, start_step=10, dtype='bfloat16'))
