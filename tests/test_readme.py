"""The README as a newcomer runs it: the main job (first command, shortened), then every command
of the Use section in order, verbatim plus only flags that make it shorter, then its Python
block. A command that stops working, or a README that names a flag or path that does not exist,
fails here."""
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
from conftest import once_per_session
from helpers import ROOT

from pretrain_jax.data import corpus

BIN = os.path.dirname(sys.executable)
# Flags appended to each command: fewer steps, batches and tokens, nothing else.
SHORTER = {
    'train_tiny': ['--steps', '2', '--probe_sentences', '3', '--eval_batches', '1'],
    'evaluate': ['--batches', '1'],
    'generate': ['--max_new_tokens', '3'],
    'fill_mask': [], 'describe': [],
    'train': ['--config.train.steps=2', '--config.train.warmup_steps=1',
              '--config.train.eval_every=2', '--config.train.eval_batches=1',
              '--config.train.checkpoint_every=2', '--config.data.tokenizer_vocab_size=512',
              '--config.model.vocab_size=512'],
}


def readme() -> str:
  with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
    return f.read()


def blocks(text: str, lang: str) -> list:
  return re.findall(rf'```{lang}\n(.*?)```', text, re.S)


def main_job_command() -> list:
  """The first README command's last step: `.venv/bin/pretrain-jax train_tiny ...`."""
  first = blocks(readme(), 'bash')[0].splitlines()[0]
  return shlex.split(first.split('&&')[-1])


def use_commands() -> list:
  use = readme().split('## Use', 1)[1]
  return [shlex.split(line, comments=True) for line in blocks(use, 'bash')[0].splitlines()
          if line.startswith('pretrain-jax ')]


def run(argv: list, cwd) -> dict:
  command = argv[0].replace('.venv/bin/', '')
  assert command == 'pretrain-jax', argv
  argv = [os.path.join(BIN, 'pretrain-jax')] + argv[1:] + SHORTER[argv[1]]
  out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, (argv, out.stderr[-3000:])
  assert not re.search(r'^(I|W)\d{4} ', out.stderr, re.M), out.stderr[-3000:]  # absl chatter
  result = json.loads(out.stdout.strip().splitlines()[-1])
  result['_stderr'] = out.stderr
  return result


@pytest.fixture(scope='module')
def newcomer(tmp_path_factory, worker_id):
  """A directory like a clone's after the main job: configs/ and runs/tiny/{bert,gpt,t5}; and
  the main job's result. Made once per session (pytest-xdist may give this module's tests to
  both workers)."""

  def build(path):
    cwd = pathlib.Path(path)
    cwd.mkdir()
    os.symlink(os.path.join(ROOT, 'configs'), cwd / 'configs')
    corpus.write_embedded_corpus(str(cwd / 'my_corpus'))   # "your own text" for the train line
    result = run(main_job_command(), cwd)
    (cwd.parent / 'clone.json').write_text(json.dumps(result))
  cwd = pathlib.Path(once_per_session(tmp_path_factory, worker_id, 'clone', build))
  return cwd, json.loads((cwd.parent / 'clone.json').read_text())


@pytest.mark.slow   # ~160 s: the main job shortened; CI runs it (.ci/run)
def test_main_job_trains_three_models_and_probes_them(newcomer):
  cwd, result = newcomer
  assert [m['family'] for m in result['models']] == ['bert', 'gpt', 't5']
  assert [m['name'] for m in result['models']] == ['tiny_bert', 'tiny_gpt', 'tiny_t5']
  for m in result['models']:
    assert m['workdir'] == os.path.join('runs', 'tiny', m['family'])
    assert m['step'] == 2 and m['checkpoint_steps'] == [2]
    assert os.path.isdir(cwd / 'runs' / 'tiny' / m['family'] / 'checkpoints' / '2')
  # The stdout line is the headline (read at a glance, piped to jq); every number is in the
  # details file it names.
  line = json.dumps({k: v for k, v in result.items() if k != '_stderr'})
  assert len(line.encode()) < 1024, len(line.encode())
  assert result['details'] == os.path.join('runs', 'tiny', 'train_tiny_results.json')
  details = json.loads((cwd / result['details']).read_text())
  assert [m['name'] for m in details['models']] == ['tiny_bert', 'tiny_gpt', 'tiny_t5']
  for m, headline in zip(details['models'], result['models'], strict=True):
    held_out = m['held_out']
    assert held_out['trained']['target_tokens'] > 0
    assert set(held_out['trained']) == set(held_out['random_init'])
    assert headline['held_out_loss_trained'] == round(held_out['trained']['lm_loss'], 4)
  assert 'tiny_gpt' in result['_stderr'] and 'train loss' in result['_stderr']
  bert, gpt, t5 = (m['held_out'] for m in details['models'])
  assert bert['masked_word']['sentences'] == 3
  assert len(gpt['continuations']) == 3 and len(t5['span_fills']) == 3
  hint = result['_stderr'].rsplit('next: ', 1)[1].splitlines()[0]   # a README command
  assert hint.startswith('pretrain-jax generate --workdir runs/tiny/gpt '), hint
  assert any(line.startswith(hint) for line in readme().splitlines()), hint


@pytest.mark.slow   # ~100 s after the main job's fixture
def test_every_use_command_runs_in_order(newcomer):
  cwd, _ = newcomer
  commands = use_commands()
  assert [c[1] for c in commands] == ['evaluate', 'evaluate', 'generate', 'generate',
                                      'fill_mask', 'describe', 'train']
  results = [run(c, cwd) for c in commands]
  assert results[0]['random_init'] is False and results[1]['random_init'] is True
  assert results[0]['step'] > 0 and results[1]['step'] is None  # the baseline is no checkpoint
  assert results[1]['lm_loss'] > results[0]['lm_loss']         # training did something
  assert all(r['text'] is not None for r in results[2]['results'])
  assert results[4]['masks'][0]['candidates']
  assert results[5]['params'] > 100_000_000                    # gpt2_small
  assert results[6]['step'] == 2 and results[6]['family'] == 'gpt'


@pytest.mark.slow   # needs the main job's fixture
def test_the_python_block_runs(newcomer):
  cwd, _ = newcomer
  (code,) = blocks(readme().split('## Use', 1)[1].split('###', 1)[0], 'python')
  out = subprocess.run([sys.executable, '-c', code], cwd=cwd, capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'token' in out.stdout and out.stdout.strip().splitlines()[-1]
