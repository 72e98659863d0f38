"""Bad command lines end in one `error:` line naming the flag, exit 2 (pretrain_jax.cli)."""
import os
import re
import subprocess
import sys

import commands
import modeling
import pytest
from helpers import ROOT, free_port

import configs
from pretrain_jax import cli, paths
from pretrain_jax.cli import config_flag


def run_script(script, *args, cwd=ROOT, fresh=False):
  """The command, forked from tests/commands.py's server, or with `fresh` in a process of its
  own: its whole start, imports included, prints no more than the one line."""
  command = script.removesuffix('.py')
  if fresh:
    return subprocess.run([sys.executable, '-m', f'pretrain_jax.commands.{command}', *args],
                          capture_output=True, text=True, timeout=300, cwd=cwd, check=False)
  return commands.run(command, *args, cwd=cwd, timeout=300)


@pytest.mark.parametrize('script, args, flag, field, hint', [
    ('train.py', ['--config', 'configs/tiny_gpt.py', '--workdir', 'W'], '--config.train.stepz=4',
     'stepz', 'steps'),
    ('describe.py', ['--config', 'configs/tiny_t5.py'], '--config.model.num_layerz=3',
     'num_layerz', 'num_layers'),
    # fine-tuning's default config reads its overrides when the flag is defined
    ('finetune.py', ['--init', 'nowhere', '--task', 'word_order', '--workdir', 'W'],
     '--config.model.emb_dim=64', 'emb_dim', None),
    # so does shakespeare's (it was a 52-line AttributeError traceback)
    ('shakespeare.py', ['--corpus', 'x'], '--config.gpt.train.stepz=3', 'stepz', 'steps'),
])
def test_override_of_a_missing_field_is_one_line(script, args, flag, field, hint, tmp_path):
  args = [str(tmp_path / 'w') if a == 'W' else a for a in args]
  done = run_script(script, *args, flag, fresh=True)
  assert done.returncode == 2, done.stderr[-3000:]
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f'error: {flag}: '), done.stderr[-3000:]
  assert f'no field {field!r}' in lines[0]
  assert (f'did you mean {hint!r}' in lines[0]) if hint else 'did you mean' not in lines[0]
  assert not os.path.exists(tmp_path / 'w')


@pytest.mark.parametrize('script, args, expected', [
    ('describe.py', ['--config', 'README.md'], 'error: README.md: not a config file ('),
    ('train_tiny.py', ['--workdir', 'W', '--models', 'tiny_gpz'],
     ('--models', "['tiny_gpz']")),
    ('train_tiny.py', ['--workdir', 'W', '--steps', '-3'], 'error: flag --steps=-3: '),
    ('evaluate.py', ['--workdir', 'W', '--batches', '-1'], 'error: flag --batches=-1: '),
    ('evaluate.py', ['--workdir', 'W', '--random_init', '--step', '60'],
     ('--random_init', '--step 60')),
    ('train.py', ['--config', 'configs/tiny_gpt.py', '--workdir', 'README.md'],
     ('README.md', 'is a file')),
    ('train.py', ['--config', 'configs/tiny_gpt.py', '--workdir', 'W', '--num_processes=2',
                  '--process_id=0'],
     ('--num_processes, --process_id', '--multihost')),
    ('train.py', ['--config', 'configs/tiny_gpt.py', '--workdir', 'W', '--multihost',
                  '--coordinator_address=nohost', '--num_processes=2', '--process_id=1'],
     'error: --coordinator_address=nohost; expected HOST:PORT'),
    ('train.py', ['--config', 'configs/tiny_gpt.py', '--workdir', 'gs://'],
     "error: 'gs://' names no bucket; expected gs://BUCKET/..."),
    # trained into ./gs:/bucket/runs/x, then failed at the first checkpoint (366 lines)
    ('train.py', ['--config', 'configs/tiny_gpt.py', '--workdir', 'gs:/bucket/runs/x'],
     ("'gs:/bucket/runs/x'", 'gs://BUCKET/')),
    ('benchmark.py', ['--config', 'configs/tiny_gpt.py', '--peak_flops', '-5'],
     'error: flag --peak_flops=-5: '),
    ('benchmark.py', ['--config', 'configs/tiny_gpt.py', '--steps', '0'],
     'error: flag --steps=0: '),
    # accepted at start, it failed inside islice at the first evaluation (before that save)
    ('train.py', ['--config', 'configs/tiny_gpt.py', '--workdir', 'W',
                  '--config.train.eval_batches=-1'],
     'error: train.eval_batches=-1;'),
    # a usage line's optional part pasted with its brackets: dropped without a word before
    ('transfer.py', ['--init', 'W', '--task', 'word_order', '--workdir', 'W',
                     '[--sizes', '200,0]'],
     "error: unexpected arguments ['[--sizes', '200,0]']; expected only flags"),
    ('train.py', ['--config', 'configs/tiny_gpt.py', '--workdir', 'W', 'config.train.steps=3'],
     "error: unexpected arguments ['config.train.steps=3']; expected only flags"),
    # a config of another command: AttributeError / TypeError tracebacks from inside before
    ('describe.py', ['--config', 'configs/finetune.py'],
     ('--config=configs/finetune.py', 'fine-tuning', 'expected a pre-training')),
    ('train.py', ['--config', 'configs/shakespeare_char.py', '--workdir', 'W'],
     ('configs/shakespeare_char.py', 'chapter experiment', 'expected a pre-training')),
    ('finetune.py', ['--config', 'configs/tiny_gpt.py', '--init', 'W', '--task', 'word_order',
                     '--workdir', 'W'],
     ('configs/tiny_gpt.py', 'pre-training', 'expected a fine-tuning')),
    # a config file's own error: was one line with ml_collections' traceback flattened in it
    ('describe.py', ['--config', 'configs/tiny_gpt.py:foo'],
     ('--config=configs/tiny_gpt.py:foo', "':variant'")),
    ('shakespeare.py', ['--corpus', 'x', '--config=configs/shakespeare_char.py:prodct'],
     ('--config=configs/shakespeare_char.py:prodct', "'prodct'", "('chapter', 'product')")),
    # argparse scripts: one line, naming the flag the user typed
    ('benchmark_data.py', ['--objectives', 'clm,clmm'],
     ("--objectives=clm,clmm", "'clmm'")),
    ('train_tokenizer.py', ['--output', 'W', '--files', 'nomatch/*.jsonl'],
     "error: --files: 'nomatch/*.jsonl' matches no file"),
    ('benchmark_data.py', ['--files', 'nomatch/*.jsonl'],
     "error: --files: 'nomatch/*.jsonl' matches no file"),
])
def test_bad_command_lines_are_one_line(script, args, expected, tmp_path):
  """`expected`: what the line names (the flag, the value, what is expected), one string or
  several."""
  args = [str(tmp_path / 'w') if a == 'W' else a for a in args]
  done = run_script(script, *args)
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
  expected = (expected,) if isinstance(expected, str) else expected
  assert lines[0].startswith('error: ') and all(e in lines[0] for e in expected), lines
  assert not os.path.exists(tmp_path / 'w')


def test_path_errors_are_user_errors_and_bad_json_is_named(tmp_path):
  assert cli.is_user_error(paths.PathError('gs://nobucket/x: cannot list gs://nobucket'))
  bad = tmp_path / 'config.json'
  bad.write_text('{bad')
  with pytest.raises(ValueError, match=f'{bad} is not valid JSON'):
    paths.read_json(str(bad))
  with pytest.raises(NotADirectoryError, match='is a file; expected a directory'):
    paths.makedirs(str(bad / 'sub'))


def test_a_keyboard_interrupt_is_one_line_and_exit_130(capsys):
  def interrupted():
    raise KeyboardInterrupt
  with pytest.raises(SystemExit) as exit_info:
    cli.call(interrupted)
  assert exit_info.value.code == 130
  assert capsys.readouterr().err == 'interrupted (Ctrl-C)\n'


def test_base_config_names_and_paths():
  """convert_hf.py --base_config: a name that is no config was a ModuleNotFoundError traceback,
  and the path form the other scripts take ('configs/tiny_gpt.py') was not understood."""
  with pytest.raises(ValueError, match=r"^base config 'nosuch' .*'tiny_gpt'"):
    configs.base_config(None, 'nosuch')
  name, config = configs.base_config(None, 'configs/tiny_gpt.py')
  assert name == 'tiny_gpt' and config.model.family == 'gpt'
  with pytest.raises(ValueError, match=r"^base config 'tiny_t5' is a t5 .* gpt"):
    configs.base_config(modeling.tiny('gpt'), 'tiny_t5')   # wrote a workdir nothing could use
  assert configs.base_config(modeling.tiny('gpt'), 'tiny_gpt')[0] == 'tiny_gpt'


def test_writing_over_a_directory_is_one_clear_error_and_leaves_no_temporary(tmp_path):
  """train_tokenizer.py --output DIR: an OSError naming 'DIR.tmp-PID' and the temporary left."""
  (tmp_path / 'adir').mkdir()
  with pytest.raises(IsADirectoryError, match='adir is a directory; expected a file path'):
    paths.write_atomic(str(tmp_path / 'adir'), b'x')
  assert os.listdir(tmp_path) == ['adir']


@pytest.mark.parametrize('script', ['train.py', 'transfer.py'])
def test_help_exits_0_and_keeps_the_usage_lines(script):
  """absl's --help exits 1 (a wrapper's smoke test failed on it), and the docstrings' `\\` +
  newline joined the usage examples into one line."""
  done = run_script(script, '--help')
  assert done.returncode == 0, done.stderr[-2000:]
  assert re.search(r'--workdir \S+ \\\n', done.stdout), done.stdout[:600]


def test_a_config_whose_get_config_returns_a_dict_is_one_line(tmp_path):
  """It was an AttributeError traceback ('dict' object has no attribute 'model')."""
  config = tmp_path / 'dictcfg.py'
  config.write_text("def get_config():\n  return {'model': 1}\n")
  done = run_script('describe.py', '--config', str(config))
  assert done.returncode == 2 and 'Traceback' not in done.stderr, done.stderr[-2000:]
  assert done.stderr.strip().splitlines()[-1].startswith(
      f'error: --config={config}: get_config() returned a dict')


def test_a_process_whose_peers_never_join_exits_with_one_line(tmp_path):
  """JAX waits 5 minutes for the other processes, then aborts in C++ (a native stack naming
  RegisterTask, no error line). --init_timeout says what was waited for and exits 2."""
  address = f'127.0.0.1:{free_port()}'
  done = run_script('train.py', '--config', 'configs/tiny_gpt.py', '--workdir',
                    str(tmp_path / 'w'), '--multihost', f'--coordinator_address={address}',
                    '--num_processes=2', '--process_id=0', '--init_timeout=3')
  assert done.returncode == 2, done.stderr[-3000:]
  last = done.stderr.strip().splitlines()[-1]
  assert last.startswith('error: --multihost: ') and all(
      s in last for s in ('2 processes', address, '3 s (--init_timeout)')), done.stderr[-3000:]
  assert 'Check failure' not in done.stderr and not os.path.exists(tmp_path / 'w')


def test_a_config_files_own_error_drops_a_module_qualified_exception_name():
  text = ('flag --config=configs/x.py:a: Error whilst parsing config file: Traceback (most '
          'recent call last):\n  File "configs/x.py", line 3, in get_config\n'
          'module.sub.CustomError: bad value')
  assert config_flag.config_variant_error(text) == 'error: --config=configs/x.py:a: bad value'
  assert config_flag.config_variant_error(text.replace('module.sub.CustomError', 'ValueError')) == \
      'error: --config=configs/x.py:a: bad value'


@pytest.mark.parametrize('name', ['evaluate', 'generate', 'fill_mask'])
def test_a_missing_workdir_is_refused_before_jax_loads(tmp_path, name):
  code = ('import sys\nfrom pretrain_jax import commands\ntry:\n'
          f'  commands.main(["pretrain-jax", {name!r}, "--workdir={tmp_path}/nope"])\n'
          'except SystemExit as e:\n  print(e.code, "jax" in sys.modules)\n')
  done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                        cwd=ROOT, check=False)
  assert done.stdout.split() == ['2', 'False'], done.stderr[-2000:]
  assert f"'{tmp_path}/nope'" in done.stderr
