"""Fine-tuning's user errors: task files, config numbers, typo'd labels, the transfer plot, help."""
import json
import os
import types

import commands
import gcs_emulator
import ml_collections
import modeling
import numpy as np
import pytest

from configs import finetune as finetune_config
from pretrain_jax import paths
from pretrain_jax.data import classification, tasks
from pretrain_jax.finetune import run as run_lib
from pretrain_jax.finetune import transfer
from pretrain_jax.models import family_of

GPT_LAYOUT = family_of('gpt').task_layout


def _workdir_with_curves(workdir):
  records = [{'split': 'train', 'step': s, 'loss': 1.0 / s} for s in (1, 2, 3)]
  records += [{'split': 'eval', 'step': s, 'class_accuracy': 0.5 + 0.1 * s} for s in (2, 3)]
  paths.write_atomic(paths.resolve(workdir) / 'metrics.jsonl',
                     ''.join(json.dumps(r) + '\n' for r in records))
  return [{'mode': 'full', 'size': 10, 'seed': 0, 'metric': 'class_accuracy', 'final': 0.8,
           'best': 0.8, 'steps': 3, 'wall_sec': 1.0, 'step_time_sec': 0.1,
           'workdir': str(workdir), 'family': 'gpt'}]


def test_plot_writes_a_png_to_a_path_object_in_a_new_folder(tmp_path):
  rows = _workdir_with_curves(tmp_path / 'full')
  png = transfer.plot(rows, tmp_path / 'new' / 'transfer.png', 'title')
  assert png == str(tmp_path / 'new' / 'transfer.png')
  assert open(png, 'rb').read(8) == b'\x89PNG\r\n\x1a\n'


def test_plot_writes_a_png_to_gcs():
  saved = dict(os.environ)
  with gcs_emulator.serve() as env:
    os.environ.update(env)
    try:
      rows = _workdir_with_curves('gs://bucket/transfer/full')
      png = transfer.plot(rows, 'gs://bucket/transfer/transfer.png')
      assert png == 'gs://bucket/transfer/transfer.png'
      assert paths.resolve(png).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    finally:
      os.environ.clear()
      os.environ.update(saved)


def test_a_failed_plot_comes_after_the_summary(tmp_path, monkeypatch, capsys):
  rows = _workdir_with_curves(tmp_path / 'full')
  def broken(*args):
    del args
    raise PermissionError('transfer.png: read-only')
  monkeypatch.setattr(transfer, 'plot', broken)
  with pytest.raises(PermissionError, match='read-only'):
    transfer.report(rows, str(tmp_path), 'title', init='i', task='t')
  out, err = capsys.readouterr()
  result = json.loads(out.strip().splitlines()[-1])
  assert result['png'] is None and result['init'] == 'i' and len(result['runs']) == 1
  assert result['summary'][0]['final'] == 0.8 and 'full' in err
  monkeypatch.undo()
  result = transfer.report(rows, str(tmp_path), 'title', init='i', task='t')
  assert result['png'] == str(tmp_path / 'transfer.png') and os.path.isfile(result['png'])


def _task_dir(tmp_path, train_lines, validation='text,label\nx,good\n', name='validation.csv'):
  d = tmp_path / 'task'
  d.mkdir(exist_ok=True)
  (d / 'train.jsonl').write_text('\n'.join(train_lines) + '\n')
  (d / name).write_text(validation)
  return d


def test_malformed_task_lines_name_the_file_and_the_line(tmp_path):
  good = [json.dumps({'text': f'sentence {i}', 'label': ['bad', 'good'][i % 2]})
          for i in range(40)]
  d = _task_dir(tmp_path, good[:30] + ['{"text": "a broken line", "label": }'] + good[30:])
  with pytest.raises(ValueError, match=r'train\.jsonl line 31: '):
    tasks.load_task(str(d))
  d = _task_dir(tmp_path, good[:3] + ['', '["text", "label"]'] + good[3:])   # blank line 4
  with pytest.raises(ValueError, match=r'train\.jsonl line 5: a JSON list'):
    tasks.load_task(str(d))
  d = _task_dir(tmp_path, good, 'text,label\nx,good\ny,bad,surplus\n')
  with pytest.raises(ValueError, match=r'validation\.csv line 3: 3 field'):
    tasks.load_task(str(d))
  os.remove(d / 'validation.csv')
  d = _task_dir(tmp_path, good, 'text\tlabel\nx\tgood\nonly text\n', 'validation.tsv')
  with pytest.raises(ValueError, match=r'validation\.tsv line 3: 1 field'):
    tasks.load_task(str(d))
  os.remove(d / 'validation.tsv')
  d = _task_dir(tmp_path, good, '[{"text": "x", "label": "good"},\n {"text" "y"}]',
                'validation.json')
  with pytest.raises(ValueError, match=r'validation.json line 2: not valid JSON'):
    tasks.load_task(str(d))
  (d / 'validation.json').write_text('[{"text": "x", "label": "good"}, "y"]')
  with pytest.raises(ValueError, match=r'validation\.json item 1: a JSON str'):
    tasks.load_task(str(d))
  (d / 'validation.json').write_text('[{"text": "x", "label": "good"}]')
  assert tasks.load_task(str(d)).labels == ('bad', 'good')


@pytest.mark.parametrize('key, value, expected', [
    ('data.seq_len', 0, 'a positive input length'),
    ('data.target_len', -1, 'the T5 target length'),
    ('data.seed', -3, 'a non-negative seed'),
    ('task.max_train_examples', -5, r'0 \(all examples\) or a positive count'),
    ('task.max_eval_examples', -1, r'0 \(all examples\) or a positive count'),
    ('probe_learning_rate', -1e-3, r'0 \(train.learning_rate\) or a positive rate'),
    ('mode', 'probe', r"one of \('full'")])
def test_bad_fine_tune_numbers_are_refused_before_anything_loads(key, value, expected, tmp_path):
  c = finetune_config.get_config()
  section, name = key.rsplit('.', 1) if '.' in key else ('', key)
  (c[section] if section else c)[name] = value
  c.init = str(tmp_path / 'no_checkpoint')   # never read: the config is checked first
  with pytest.raises(ValueError, match=f'^{key}={value!r}; expected {expected}'):
    run_lib.finetune(c, str(tmp_path / 'out'))
  assert not os.path.exists(tmp_path / 'out')


def test_transfer_refuses_a_negative_size_before_the_first_run(tmp_path):
  c = finetune_config.get_config()
  c.init = str(tmp_path / 'no_checkpoint')
  with pytest.raises(ValueError, match=r'sizes \[200, -5\]: -5;'):
    transfer.run_transfer(c, str(tmp_path / 'out'), modes=('full',), sizes=(200, -5))
  with pytest.raises(ValueError, match=r"^modes \['full', 'full'\]: expected distinct values"):
    transfer.run_transfer(c, str(tmp_path / 'out'), modes=('full', 'full'))
  c.data.seq_len = 0
  with pytest.raises(ValueError, match=r'^data\.seq_len=0;'):
    transfer.run_transfer(c, str(tmp_path / 'out'), modes=('full',))
  assert not os.path.exists(tmp_path / 'out')


def test_transfer_reports_the_examples_trained_on_not_the_size_asked(tmp_path, monkeypatch,
                                                                    capsys):
  """--sizes past the task's training set trains on all of it: the rows say how many, and a
  warning names the size; sizes stay apart in the summary even when they train alike."""
  def finetune(c, workdir, init, task):
    return {'train_examples': min(c.task.max_train_examples or 300, 300), 'metric': 'acc',
            'final': 0.5, 'best': 0.6, 'step': 3, 'step_time_sec': 0.1, 'family': 'gpt'}
  monkeypatch.setattr(run_lib, 'finetune', finetune)
  monkeypatch.setattr(run_lib, 'load_init', lambda path: type(
      'Init', (), {'family': 'gpt', 'model_config': type('Cfg', (), {'family': 'gpt'})}))
  monkeypatch.setattr(run_lib, 'load_task', lambda config: None)
  monkeypatch.setattr(run_lib, 'build_config', lambda config, init, task: config)
  c = finetune_config.get_config()
  rows = transfer.run_transfer(c, str(tmp_path), modes=('full',), sizes=(100, 1000, 0))
  assert [(r['size'], r['requested_size']) for r in rows] == [(100, 100), (300, 1000), (300, 0)]
  assert "warning: size 1000 is more than the task's 300 training examples" in (
      capsys.readouterr().err)
  assert [s['size'] for s in transfer.summarize(rows)] == [100, 300, 300]
  for row in rows:
    row.update(seed=0, wall_sec=1.0, steps=3, step_time_sec=0.1)
  assert [line.split()[1:4] for line in transfer.table(rows).splitlines()[2:]] == [
      ['100', '0', 'acc'], ['300', '(asked', '1000)'], ['300', '0', 'acc']]


@pytest.mark.parametrize('family, pair, least', [('bert', True, 4), ('bert', False, 3),
                                                 ('gpt', True, 3), ('gpt', False, 2)])
def test_a_seq_len_with_no_room_for_text_is_refused(family, pair, least):
  class Tok:
    cls_id, sep_id, eos_id, pad_id = 1, 2, 3, 0
    encode = staticmethod(lambda text: [10 + len(w) for w in text.split()])
  example = dict({'text': 'a bb ccc', 'label': 'x'}, **({'text_pair': 'dd ee'} if pair else {}))
  task = tasks.Task('t', {'train': [example, dict(example, label='y')]}, ('x', 'y'))
  with pytest.raises(ValueError, match=f'^data.seq_len={least - 1} .* {least}'):
    classification.encode(task, 'train', Tok, family_of(family).task_layout,
                          seq_len=least - 1)
  rows = classification.encode(task, 'train', Tok, family_of(family).task_layout,
                               seq_len=least).rows
  assert rows['segment_ids'].sum(1).tolist() == [least, least]


def test_a_rare_label_is_warned_about_and_still_trains(capsys):
  rows = [{'text': 'a', 'label': ['bad', 'good'][i % 2]} for i in range(40)]
  labels = tasks.collect_labels('reviews', {'train': rows + [{'text': 'b', 'label': 'Good'}]})
  assert labels == ('Good', 'bad', 'good')   # it trains, as the data says
  err = capsys.readouterr().err
  assert "warning: task 'reviews': train label 'Good' is on 1 of 41 rows (like 'good')" in err
  assert "'bad'" not in err.split('labels:')[0]
  # Legitimately rare labels: 3 of 100, or one row of a tiny set, pass without a word.
  rare = [{'text': 'a', 'label': 'common'}] * 97 + [{'text': 'b', 'label': 'rare'}] * 3
  assert tasks.collect_labels('t', {'train': rare}) == ('common', 'rare')
  tiny = [{'text': 'a', 'label': 'x'}] * 5 + [{'text': 'b', 'label': 'y'}]
  assert tasks.collect_labels('t', {'train': tiny}) == ('x', 'y')
  assert capsys.readouterr().err == ''
  # Under 1% of the rows is warned about at any count.
  many = [{'text': 'a', 'label': 'common'}] * 995 + [{'text': 'b', 'label': 'odd'}] * 5
  tasks.collect_labels('t', {'train': many})
  assert "train label 'odd' is on 5 of 1000 rows; a typo?" in capsys.readouterr().err
  assert tasks.rare_labels({'a': 50, 'b': 1}) == ['b'] and not tasks.rare_labels({'a': 9, 'b': 1})
  np.testing.assert_equal(tasks.RARE_FRACTION, 0.01)


def test_help_lists_the_required_shared_flags():
  for script in ('finetune.py', 'transfer.py'):
    done = commands.run(script[:-3], '--help', timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode in (0, 1), out[-2000:]   # absl's --help exits 1
    shown = out[out.index('\nflags:\n'):]   # cli.usage: the docstring, then the flags
    for flag in ('--config:', '--init:', '--task:', '--workdir:'):
      assert flag in shown, (script, flag, out)


def test_the_first_examples_missing_a_label_are_warned_about(capsys):
  """max_train_examples / --sizes take the first N rows: on a file sorted by label they held one
  class, and the run scored the majority share without a word."""
  rows = [{'text': f't{i}', 'label': 'neg'} for i in range(6)] + [
      {'text': f'u{i}', 'label': 'pos'} for i in range(6)]
  task = tasks.Task('sorted', {'train': rows}, ('neg', 'pos'))
  tok = type('Tok', (), {'encode': lambda self, t: [7, 8], 'eos_id': 1})()
  classification.encode(task, 'train', tok, GPT_LAYOUT, 8, max_examples=4)
  assert ("warning: the first 4 train examples of task 'sorted' hold 1 of its 2 labels "
          "(missing: ['pos'])") in capsys.readouterr().err
  classification.encode(task, 'train', tok, GPT_LAYOUT, 8, max_examples=8)
  classification.encode(task, 'train', tok, GPT_LAYOUT, 8)
  assert capsys.readouterr().err == ''


def test_init_is_recorded_absolute_so_a_resume_may_spell_it_otherwise(tmp_path, monkeypatch):
  """`--init runs/x` then `--init /abs/runs/x` (from another directory) was refused as a config
  change, and init cannot be allowed to change; an older workdir's relative spelling is kept
  when it names the same directory."""
  monkeypatch.chdir(tmp_path)
  init = types.SimpleNamespace(model_config=modeling.tiny('gpt'),
                               config=ml_collections.ConfigDict())
  task = tasks.Task('t', {'train': [{'text': 'a', 'label': 'x'}]}, ('x', 'y'))
  c = finetune_config.get_config()
  c.init, c.data.seq_len = 'runs/x', 16
  built = run_lib.build_config(c, init, task)
  assert built.init == str(tmp_path / 'runs' / 'x')
  (tmp_path / 'old').mkdir()
  (tmp_path / 'old' / 'config.json').write_text(json.dumps(
      {'init': 'runs/x', 'model': {'num_classes': 2}, 'task': {'labels': ['x', 'y']}}))
  run_lib.check_resume(built, str(tmp_path / 'old'))
  assert built.init == 'runs/x'


@pytest.mark.parametrize('name', ['nosuchtask', 'glue/sst3', 'data/no_such_dir'])
def test_a_task_name_that_is_nothing_says_what_a_task_can_be(name):
  """'nosuchtask' said "found splits []" (globbed as a directory), as if it were an empty one."""
  with pytest.raises(ValueError, match=rf"task '{name}' is not a directory .*'word_order'"):
    tasks.load_task(name)


def test_a_tfds_task_that_is_not_prepared_is_one_clear_error(tmp_path):
  """glue/cola in a data_dir that does not hold it: was an AssertionError from inside tfds's
  as_dataset (a 37-line traceback from finetune.py); now the pre-training data's message."""
  with pytest.raises(ValueError, match=r"'glue/cola' in .*empty is not prepared;.* "
                                       r"config\.task\.tfds_data_dir"):
    tasks.load_task('glue/cola', tfds_data_dir=str(tmp_path / 'empty'))
