"""Every command as a new user meets it: --help that reads cleanly, a bad --config key refused in
one line, the documented LoRA command, and no file naming a script or module that is not there."""
import glob
import json
import os
import re
import subprocess
import sys

import commands
import pytest
from helpers import ROOT

from pretrain_jax.commands import COMMANDS
from pretrain_jax.finetune import MODES

# The flags each command cannot run without (argparse commands: train_tokenizer,
# benchmark_data): a literal, so a flag whose marking is lost fails here.
REQUIRED = {
    'train_tiny': set(), 'train': {'config', 'workdir'}, 'evaluate': {'workdir'},
    'generate': {'workdir', 'prompt'}, 'fill_mask': {'workdir', 'text'}, 'describe': {'config'},
    'finetune': {'init', 'task', 'workdir'}, 'transfer': {'init', 'task', 'workdir'},
    'fewshot': {'init', 'task'}, 'convert_hf': {'hf_dir', 'workdir'},
    'train_tokenizer': {'output'}, 'plan': {'config', 'topology'}, 'tpu': set(),
    'benchmark': set(), 'benchmark_data': set(), 'shakespeare': {'corpus'},
}
ARGPARSE = ('train_tokenizer', 'benchmark_data')


def flag_notes(text: str) -> dict:
  """{flag name: its help block} of an absl command's --help."""
  blocks = re.split(r'\n(?=  --)', text.split('\nflags:\n', 1)[1])
  return {re.match(r'\s*--(?:\[no\])?(\w+):', b).group(1): b for b in blocks}


def test_the_table_covers_every_command():
  assert set(REQUIRED) == set(COMMANDS)


@pytest.mark.parametrize('command', sorted(COMMANDS))
def test_help_names_no_machine_path_and_marks_required_flags(command):
  """absl's own --help headed the flags with the command file's absolute path, showed a required
  flag as `(default: 'None')` and a default config as its absolute path."""
  done = commands.run(command, '--help', timeout=120)
  assert done.returncode == 0 and not done.stderr.strip(), done.stderr[-2000:]
  out = done.stdout
  assert ROOT not in out and not re.search(r'^\S*/\S+\.py:$', out, re.M), out
  assert "'None'" not in out
  if command in ARGPARSE:
    assert out.startswith(f'usage: pretrain-jax {command} ')
    usage = out.split('\n\n', 1)[0]
    assert all(f'[--{n}' not in usage and f'--{n} ' in usage for n in REQUIRED[command]), usage
    return
  notes = flag_notes(out)
  marked = {name for name, block in notes.items() if '(required)' in block}
  assert marked == REQUIRED[command], notes
  assert all('(default:' not in notes[name] for name in marked)
  assert 'verbose' in notes or command == 'tpu'


def test_finetune_help_lists_every_mode():
  out = commands.run('finetune', '--help', timeout=120).stdout
  doc, flag_help = out.split('\nflags:\n')
  assert f'--mode: {" | ".join(MODES)} ' in ' '.join(doc.split())
  assert f'<{"|".join(MODES)}>' in flag_notes(out)['mode']


# What each command needs before a --config.* key is read (a config; argparse's required flag).
BEFORE = {'train': ['--config', 'tiny_gpt'], 'describe': ['--config', 'tiny_gpt'],
          'plan': ['--config', 'tiny_gpt'], 'benchmark': ['--config', 'tiny_gpt'],
          'train_tokenizer': ['--output', 'W']}


@pytest.mark.parametrize('command', sorted(COMMANDS))
def test_a_bad_config_key_is_one_line(command, tmp_path):
  """shakespeare's default config read the key at definition: a 52-line AttributeError."""
  args = [str(tmp_path / 'w') if a == 'W' else a for a in BEFORE.get(command, [])]
  done = commands.run(command, *args, '--config.bogus=1', cwd=tmp_path, timeout=120)
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
  assert lines[0].startswith('error: ') and 'bogus' in lines[0], lines


def test_a_missing_required_flag_is_named():
  done = commands.run('finetune', '--task', 'word_order', timeout=120)
  assert done.returncode == 2, done.stderr[-2000:]
  assert done.stderr.strip() == 'error: --init, --workdir required; see --help'


def test_finetune_takes_lora_on_the_command_line(tmp_path):
  """--mode offered full, linear_probe and scratch: lora was refused at the flag. Now the
  refusal is the init's, a path that is not there."""
  done = commands.run('finetune', '--init', tmp_path / 'nowhere', '--task', 'word_order',
                      '--workdir', tmp_path / 'w', '--mode', 'lora', timeout=300)
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
  assert f"{tmp_path / 'nowhere'}" in lines[0] and '--mode' not in lines[0], lines


@pytest.mark.slow   # ~40 s of CPU: a fine-tune in the command's process, a load in another
def test_finetune_mode_lora_from_the_command_line(bert_nsp_workdir, gpt_workdir, tmp_path):
  """docs/finetuning.md's LoRA command (shortened): refused by --mode's old choices. Then the
  adapter predicts through the public API in a fresh process whose stderr holds no
  TensorFlow log line (TensorFlow's oneDNN notice printed on .predict)."""
  workdir = str(tmp_path / 'lora')
  env = {**os.environ, 'PRETRAIN_JAX_CACHE': f'{gpt_workdir}_cache'}
  done = commands.run(
      'finetune', '--init', bert_nsp_workdir, '--task', 'word_order', '--workdir', workdir,
      '--mode', 'lora', '--config.lora.rank=2', '--config.lora.targets=q,v',
      '--config.data.seq_len=32', '--config.task.max_train_examples=8',
      '--config.task.max_eval_examples=8', '--config.train.batch_size=4',
      '--config.train.steps=2', '--config.train.warmup_steps=1', '--config.train.eval_every=2',
      '--config.train.checkpoint_every=2', env=env, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert (result['mode'], result['step']) == ('lora', 2)
  assert result['trainable_params'] < result['total_params']
  with open(os.path.join(workdir, 'config.json')) as f:
    saved = json.load(f)
  assert saved['mode'] == 'lora' and saved['lora']['rank'] == 2
  assert saved['lora']['base'] == os.path.join(bert_nsp_workdir, 'checkpoints', '3')
  code = ('import json, sys, pretrain_jax\n'
          'model = pretrain_jax.load_pretrained(sys.argv[1])\n'
          "print(json.dumps(model.predict(['The list is sorted.', 'sorted The is list.'])))\n")
  quiet = {k: v for k, v in os.environ.items() if not k.startswith('TF_')}
  done = subprocess.run([sys.executable, '-c', code, workdir], capture_output=True, text=True,
                        env=quiet, cwd=tmp_path, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert set(json.loads(done.stdout.strip().splitlines()[-1])) <= {'original', 'shuffled'}
  assert not re.search(r'^[IWE]\d{4} ', done.stderr, re.M), done.stderr[-3000:]


# A path into the repository's code as text names it: scripts/x.py, configs/x.py,
# pretrain_jax/a/b.py (an upper-case name, configs/NAME.py, is a placeholder).
NAMED = re.compile(r'(?<![\w/.])((?:scripts|configs|pretrain_jax)/[a-z0-9_/]+\.py)\b')


def test_named_paths_finds_paths_and_skips_placeholders():
  text = 'run scripts/tpu_plans.py, see configs/NAME.py, pretrain_jax/a/b.py; x/scripts/y.py'
  assert NAMED.findall(text) == ['scripts/tpu_plans.py', 'pretrain_jax/a/b.py']


def test_every_script_config_and_module_a_file_names_exists():
  """scripts/shakespeare_torch.py's docstring and --help named scripts/shakespeare.py, which
  was never there. Tests are left out: they name made-up paths as inputs."""
  missing = []
  for folder in ('README.md', 'DESIGN.md', 'docs', 'pretrain_jax', 'configs', 'scripts'):
    found = glob.glob(os.path.join(ROOT, folder, '**', '*'), recursive=True) or [
        os.path.join(ROOT, folder)]
    for path in found:
      if os.path.isfile(path) and path.endswith(('.py', '.md', '.toml', '.txt', '.cfg')):
        with open(path, encoding='utf-8', errors='replace') as f:
          missing += [f'{os.path.relpath(path, ROOT)}: {name}' for name in NAMED.findall(f.read())
                      if not os.path.exists(os.path.join(ROOT, name))]
  assert not missing, missing
