"""Every `pretrain-jax ...` command line of README.md and docs/ parses against its command's
flags and config (tests/doc_commands.py says what counts as a line and as a placeholder): an
unknown command, sub-command or flag, an enum value or config name that does not exist, a
`--config.x.y` key the config lacks and a value of the wrong type each fail, naming the page
and line. Parsing runs no command; the commands that run in seconds on tiny configs run for real
here (LoRA on word_order, plan) or in test_readme.py (the README's Use section)."""
import json
import os

import commands
import doc_commands
import pytest
from conftest import once_per_session
from doc_commands import DocCommand

from pretrain_jax import commands as command_table

# Mistakes the parse must refuse, one per line of a made-up page, each with the word its error
# line must name.
MISTAKES = [
    ('pretrain-jax trian --workdir runs/x', 'trian'),                          # command
    ('pretrain-jax tpu strat --name a --zone b', 'strat'),                      # sub-command
    ('pretrain-jax convert_hf improt --hf_dir a --workdir b', 'improt'),
    ('pretrain-jax evaluate --workdir runs/x --batchs 3', 'batchs'),            # flag
    ('pretrain-jax evaluate --workdir runs/x --batchez $N', 'batchez'),
    ('pretrain-jax evaluate --workdir runs/x --batches many', 'many'),          # type
    ('pretrain-jax finetune --init a --task word_order --workdir w --mode half', 'half'),  # enum
    ('pretrain-jax train_tokenizer --output x.model --type wordpiece', 'wordpiece'),
    ('pretrain-jax train --config tiny_gtp --workdir w', 'tiny_gtp'),           # config name
    ('pretrain-jax train --config tiny_gpt --workdir w --config.train.stepz=3', 'stepz'),  # key
    ('pretrain-jax finetune --init a --task word_order --workdir w --config.train.stepz=3',
     'stepz'),                                  # (a default config file: read at import)
    ('pretrain-jax transfer --init a --task word_order --workdir w '
     '--config.task.beam_sise=$beam', 'beam_sise'),
    ('pretrain-jax train --config tiny_gpt --workdir w --config.train.steps=many', 'many'),
    ('pretrain-jax tpu run --name a --zone b -- --config tiny_gpt --workdir w '
     '--config.data.filez=x', 'filez'),         # the train arguments after --
    ('pretrain-jax generate --workdir runs/tiny/gpt', 'prompt'),                # required flag
    ('pretrain-jax train --config tiny_gpt --workdir w --config.model.attention_impl=flashy',
     'flashy'),                                 # a config value its section refuses
    ('pretrain-jax finetune --init a --task word_order --workdir w --config.task.format=prose',
     'prose'),
    ('pretrain-jax describe --config finetune', 'fine-tuning'),       # a config of another kind
    ('pretrain-jax benchmark --suite gpx', 'gpx'),                   # values checked in main
    ('pretrain-jax benchmark --suite gpu --variants baseline,fp9', 'fp9'),
    ('pretrain-jax transfer --init a --task word_order --workdir w --modes full,lora2', 'lora2'),
    ('pretrain-jax tpu run --name a --zone b --tpu_type v5e-3', 'v5e-3'),
    ('pretrain-jax transfer --init a --task word_order --workdir w --sizes 200,ten', "'ten'"),
]
# Lines with placeholders the parse must accept.
ACCEPTED = [
    'pretrain-jax evaluate --workdir runs/W --batches $N',
    'pretrain-jax transfer --init runs/tiny/$m --task word_order --workdir w '
    '--config.task.beam_size=$beam --sizes ${SIZES}',
    'pretrain-jax plan --config NAME --topology TYPE [--fit]',
    'pretrain-jax train --config tiny_gpt --workdir gs://BUCKET/runs/x <train_flags> ...',
    'pretrain-jax tpu run --name a --zone b -- --config tiny_gpt --workdir gs://my-bucket/x ...',
]
FRAGMENT = 'The baseline is `pretrain-jax generate --workdir runs/tiny/gpt` (a fragment).'


def made_up_page() -> str:
  lines = [line for line, _ in MISTAKES] + ACCEPTED
  return '```bash\n' + '\n'.join(lines) + '\n```\n\n' + FRAGMENT + '\n'


@pytest.fixture(scope='module')
def parsed(tmp_path_factory, worker_id):
  """[(DocCommand, {'code', 'error'})] of the docs' commands and the made-up page's, from one
  parsing process per session."""
  found = doc_commands.documented_commands() + doc_commands.commands_of('made_up.md',
                                                                        made_up_page())
  def build(path):
    os.makedirs(path)
    with open(os.path.join(path, 'results.json'), 'w') as f:
      json.dump(doc_commands.parse(found), f)
  path = once_per_session(tmp_path_factory, worker_id, 'doc_commands_parsed', build)
  with open(os.path.join(path, 'results.json')) as f:
    return list(zip(found, json.load(f), strict=True))


def test_lines_are_read_as_a_shell_reads_them_with_placeholders_marked():
  page = '\n'.join([
      'Run `pretrain-jax tpu status|stop --name a',
      '--zone b` or see `pretrain-jax COMMAND`.',
      '```bash',
      'python -m venv .venv && .venv/bin/pretrain-jax train_tiny --workdir runs/tiny',
      'for m in gpt bert; do',
      '  XLA_FLAGS=--x pretrain-jax transfer --init runs/tiny/$m --task word_order \\',
      "      --config.task.beam_size=$beam --seeds 0,1 [--sizes 200,0] > out.jsonl  # note",
      'done',
      'S="pretrain-jax shakespeare --corpus t.txt"',
      '$S --config.seed=1',
      'pretrain-jax tpu run --name a --zone b -- --config tiny_gpt --workdir gs://BUCKET/x ...',
      '```',
      '```python',
      "print('pretrain-jax train --config nothing')",
      '```',
  ])
  found = doc_commands.commands_of('p.md', page)
  assert [(c.where, c.argv, c.held, c.loose, c.fragment) for c in found] == [
      ('p.md:4', ['train_tiny', '--workdir', 'runs/tiny'], [], [], False),
      ('p.md:6', ['transfer', '--init', 'runs/tiny/$m', '--task', 'word_order', '--seeds',
                  '0,1', '--sizes', '200,0'], ['task.beam_size'], [2], False),
      ('p.md:9', ['shakespeare', '--corpus', 't.txt'], [], [], False),
      ('p.md:10', ['shakespeare', '--corpus', 't.txt', '--config.seed=1'], [], [], False),
      ('p.md:11', ['train', '--config', 'tiny_gpt', '--workdir', 'gs://BUCKET/x'], [], [4],
       False),
      ('p.md:11', ['tpu', 'run', '--name', 'a', '--zone', 'b', '--', '--config', 'tiny_gpt',
                   '--workdir', 'gs://BUCKET/x', '...'], [], [], False),
      ('p.md:1', ['tpu', 'status', '--name', 'a', '--zone', 'b'], [], [], True),
      ('p.md:1', ['tpu', 'stop', '--name', 'a', '--zone', 'b'], [], [], True),
      ('p.md:2', ['COMMAND'], [], [], True),
  ]
  assert found[-1].placeholder_command and not found[0].placeholder_command


def test_every_documented_command_parses(parsed):
  failed = [f'{c.where}: pretrain-jax {" ".join(c.argv)}\n    {r["error"] or r["code"]}'
            for c, r in parsed if r['code'] and not c.where.startswith('made_up.md')]
  assert not failed, 'documented commands that do not parse:\n' + '\n'.join(failed)


def test_every_command_has_a_documented_line_that_parses(parsed):
  """The docs give each command in a code block, so a command's flags are all checked
  somewhere; this also fails if the reading of the pages finds nothing."""
  shown = {c.argv[0] for c, r in parsed if not (c.fragment or c.placeholder_command or r['code']
                                                or c.where.startswith('made_up.md'))}
  assert sorted(set(command_table.COMMANDS) - shown) == []
  pages = {c.where.split(':')[0] for c, _ in parsed if not c.fragment}
  assert pages >= {'README.md', 'docs/cloud_tpu.md', 'docs/finetuning.md', 'docs/data.md'}


def test_each_kind_of_mistake_fails_naming_it_and_placeholders_pass(parsed):
  made_up = [(c, r) for c, r in parsed if c.where.startswith('made_up.md')]
  by_line = {}
  for c, r in made_up:
    by_line.setdefault(int(c.where.split(':')[1]), []).append((c, r))
  for number, (line, word) in enumerate(MISTAKES, 2):
    c, r = by_line[number][0]   # a tpu run's train arguments come first
    assert r['code'] == 2, (line, r)
    assert word in r['error'], (line, r)
    assert '\n' not in r['error']
  for number, line in enumerate(ACCEPTED, 2 + len(MISTAKES)):
    assert [r['code'] for _, r in by_line[number]] == [0] * len(by_line[number]), (
        line, by_line[number])
  fragment = by_line[len(MISTAKES) + len(ACCEPTED) + 4]   # a fragment may leave out --prompt
  assert [(c.argv, c.fragment, r['code']) for c, r in fragment] == [
      (['generate', '--workdir', 'runs/tiny/gpt'], True, 0)]


def _documented(page: str, *words) -> DocCommand:
  """The first command of a code block of `page` whose arguments include `words`."""
  return next(c for c in doc_commands.documented_commands()
              if c.where.startswith(page + ':') and not c.fragment
              and all(w in c.argv for w in words))


@pytest.mark.slow   # after the main job's tiny BERT (shared with test_finetune's slow set)
def test_lora_on_word_order_runs_as_documented(bert_init, tmp_path):
  """docs/finetuning.md's LoRA command from runs/tiny/bert, 2 steps instead of 200."""
  doc = _documented('docs/finetuning.md', 'finetune', '--mode', 'lora')
  cwd = tmp_path / 'clone'
  (cwd / 'runs' / 'tiny').mkdir(parents=True)
  os.symlink(bert_init, cwd / 'runs' / 'tiny' / 'bert')
  shorter = ['--config.train.steps=2', '--config.train.warmup_steps=1',
             '--config.train.eval_every=2', '--config.train.checkpoint_every=2',
             '--config.task.max_eval_examples=32']
  env = dict(os.environ, PRETRAIN_JAX_CACHE=str(tmp_path / 'cache'))
  done = commands.run('pretrain_jax', *doc.argv, *shorter, cwd=cwd, env=env)
  assert done.returncode == 0, (doc.where, done.stderr[-3000:])
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert (result['mode'], result['task'], result['step']) == ('lora', 'word_order', 2)
  assert 0 < result['trainable_params'] < result['total_params'] / 10
  saved = json.loads((cwd / 'runs' / 'lora' / 'bert' / 'config.json').read_text())
  assert (saved['lora']['rank'], saved['lora']['alpha']) == (8, 16)


@pytest.mark.slow   # ~1 min of TPU-compiler CPU: 2 train-step compiles and the eval step's
def test_plan_runs_as_documented_for_a_tiny_config(libtpu_python):
  """docs/cloud_tpu.md's plan command with tiny_gpt for gpt2_small, --fit included: the train
  and eval steps compile for a v5e-16, and --fit's search makes at most 4 train-step compiles
  (it once made dozens, many minutes for tiny_gpt)."""
  doc = _documented('docs/cloud_tpu.md', 'plan')
  argv = ['tiny_gpt' if a == 'gpt2_small' else a for a in doc.argv]
  assert argv != doc.argv and '--fit' in argv, doc.argv
  done = commands.run('pretrain_jax', *argv, timeout=900)
  assert done.returncode == 0, (doc.where, done.stderr[-3000:])
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert (result['topology'], result['chips'], result['fits'], result['eval_fits']) == (
      'v5litepod-16', 16, True, True)
  assert result['attention_kernels'] > 0     # splash on the TPU, as gpt2_small's would
  # tiny_gpt fits far more than 64 times its batch: the search stops there, in 2 compiles
  assert result['fit_capped'] and result['max_batch_size'] == 64 * result['batch_size']
  assert result['fit_compiles'] == 2 and result['remat_choice'] == 'none'
