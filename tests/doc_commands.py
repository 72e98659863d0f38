"""The `pretrain-jax ...` command lines of README.md and docs/*.md, and each one parsed by its
command's own flag parsing without running the command (tests/test_doc_commands.py).

Command lines: every line of a bash (or unlabelled) code block whose simple command starts with
`pretrain-jax` (or `.../bin/pretrain-jax`), continuation lines joined, after leading
`VAR=value` environment settings, `&&`, `;` and `|` separating commands, redirections dropped;
`S="pretrain-jax ..."` defines a command that `$S ...` lines extend (docs/chapter41.md); the
train arguments after `--` of `pretrain-jax tpu run` are a `pretrain-jax train` line of their
own. Inline code spans of prose that start with `pretrain-jax` are fragments: checked the same
way, but a flag a command requires may be left out, and `tpu status|stop|delete` stands for
each sub-command.

Placeholders, the parts the reader fills in, are what the docs mark so:
  `...` and `<words>`   elided arguments when a whole argument (`<train_flags>`), else part of
                        a value (`runs/x/<step>`)
  `[--flag value]`      optional arguments, parsed as if given
  ALL-CAPS words        in a value (`gs://BUCKET/tfds`, `--workdir W`, `--config NAME`) or as
                        the command (`pretrain-jax COMMAND`)
  `$VAR`, `${VAR}`      shell variables (a `for` loop's)
A value with a placeholder is not type-checked: a string or list flag takes it as it is, a flag
of another type must exist; a `--config.KEY=<placeholder>` must name a key of the config; a
placeholder `--config` stands for a packaged config of the command's kind (STAND_IN). Pasteable
example values (`gs://my-bucket/...`, `/models/gpt2`) are ordinary values.

The parse: one process (`python tests/doc_commands.py`, the JSON requests on stdin) imports what
the commands import, then forks one child per line, which runs `pretrain-jax COMMAND ARGS` as
the dispatcher does with absl's app.run (and the argparse commands' parse_args) replaced by the
parse alone: named configs, flags, enum and typed values, `--config.a.b` keys (at import for a
command whose --config has a default file), a sub-command (a module's COMMANDS), the values a
command checks only in main (`checked_in_main`: suites, variants, modes, TPU types), the
config's kind and section values (`check_sections`), then exit 0.
The error is the command's own one line. No `main` runs, so nothing reads a workdir or a task.
"""
import ast
import dataclasses
import glob
import importlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ELIDED = re.compile(r'\.\.\.|<[^<>]+>')   # a whole argument left out
PLACEHOLDER = re.compile(r'\.\.\.|<[^<>]+>|\$\{?\w+\}?|(?<![\w-])[A-Z][A-Z0-9_]*(?!\w)')
COMMAND_WORD = re.compile(r'(.*/)?pretrain-jax')
ASSIGNMENT = re.compile(r'[A-Za-z_]\w*=')
SEPARATORS = ('&&', '||', '|', ';', '&')
REDIRECTIONS = re.compile(r'\d?(>>?|<)(&\d)?')
# The packaged config a placeholder `--config NAME` stands for: one of the command's kind.
STAND_IN = {'finetune': 'finetune', 'transfer': 'finetune', 'shakespeare': 'shakespeare_char'}
REQUIRED = 'must have a value other than None'   # absl's text of a required flag left out


@dataclasses.dataclass
class DocCommand:
  where: str        # 'docs/finetuning.md:91'
  text: str         # the command as the docs give it (continuations joined)
  argv: list        # COMMAND ARGS as parsed: placeholders settled as the module docstring says
  held: list = dataclasses.field(default_factory=list)    # config keys whose value is a placeholder
  loose: list = dataclasses.field(default_factory=list)   # argv indices of placeholder values
  fragment: bool = False   # inline code in prose
  placeholder_command: bool = False   # `pretrain-jax COMMAND`: nothing to parse


def doc_pages() -> list:
  return ['README.md'] + sorted(os.path.relpath(p, ROOT)
                                for p in glob.glob(os.path.join(ROOT, 'docs', '*.md')))


def code_lines(text: str):
  """(line number, logical line) of the bash and unlabelled code blocks, a line ending in `\\`
  joined with the next."""
  lines, fence, pending, start = text.split('\n'), None, '', 0
  for number, line in enumerate(lines, 1):
    if line.startswith('```'):
      fence = line[3:].strip() if fence is None else None
      continue
    if fence not in ('bash', 'sh', 'shell', 'console', ''):
      continue
    if not pending:
      start = number
    if line.rstrip().endswith('\\'):
      pending += line.rstrip()[:-1] + ' '
      continue
    yield start, pending + line
    pending = ''


def inline_spans(text: str):
  """(line number, text) of the inline code spans of the prose (outside code blocks) that start
  with `pretrain-jax`; a span may continue on the next line."""
  prose = re.sub(r'^```.*?^```', lambda m: '\n' * m.group().count('\n'), text,
                 flags=re.S | re.M)
  for m in re.finditer(r'`([^`]+)`', prose):
    span = ' '.join(m.group(1).split())
    if COMMAND_WORD.match(span.split(' ', 1)[0]):
      yield prose[:m.start()].count('\n') + 1, span


def simple_commands(line: str) -> list:
  """The token lists of a shell line's simple commands (comments, redirections dropped)."""
  line = re.sub(r'<[^<>\n]*\s[^<>\n]*>', '<...>', line)   # `<the arguments after -->`: one
  try:
    tokens = shlex.split(line, comments=True)
  except ValueError:   # an unbalanced quote: not a command line
    return []
  out, current, skip = [], [], False
  for token in tokens:
    if skip:
      skip = False
      continue
    ends = token.endswith(';') and token != ';'
    token = token[:-1] if ends else token
    if token in SEPARATORS:
      out.append(current)
      current = []
    elif REDIRECTIONS.fullmatch(token):
      skip = True
    elif not REDIRECTIONS.match(token) or token.startswith('<'):
      current.append(token)
    if ends:
      out.append(current)
      current = []
  return [c for c in out + [current] if c]


def commands_of(page: str, text: str) -> list:
  """Every documented command of a page, as DocCommands (tpu run's train arguments too)."""
  found, variables = [], {}
  for number, line in code_lines(text):
    for tokens in simple_commands(line):
      if len(tokens) == 1 and ASSIGNMENT.match(tokens[0]):   # S="pretrain-jax ..."
        name, value = tokens[0].split('=', 1)
        if COMMAND_WORD.fullmatch(value.split(' ', 1)[0]):
          variables[name] = shlex.split(value)
          tokens = variables[name]
      while tokens and ASSIGNMENT.match(tokens[0]) and len(tokens) > 1:   # XLA_FLAGS=... cmd
        tokens = tokens[1:]
      if tokens and re.fullmatch(r'\$\{?(\w+)\}?', tokens[0]):
        tokens = variables.get(tokens[0].strip('${}'), tokens[:1]) + tokens[1:]
      if tokens and COMMAND_WORD.fullmatch(tokens[0]):
        found += settle(f'{page}:{number}', ' '.join(line.split()), tokens[1:])
  for number, span in inline_spans(text):
    tokens = simple_commands(span)
    if tokens:
      found += settle(f'{page}:{number}', span, tokens[0][1:], fragment=True)
  return found


def settle(where: str, text: str, args: list, fragment: bool = False) -> list:
  """DocCommands of `pretrain-jax ARGS` as the docs give it, placeholders settled."""
  if not args:
    return [DocCommand(where, text, [], fragment=fragment, placeholder_command=True)]
  if PLACEHOLDER.fullmatch(args[0]):
    return [DocCommand(where, text, args[:1], fragment=fragment, placeholder_command=True)]
  variants = [args]
  if fragment and len(args) > 1 and '|' in args[1] and args[1] != '|':   # status|stop|delete
    variants = [[args[0], choice, *args[2:]] for choice in args[1].split('|')]
  out = []
  for variant in variants:
    if variant[0] == 'tpu' and '--' in variant:   # the arguments of pretrain-jax train
      out += settle(where, text + '  (the train arguments after --)',
                    ['train', *variant[variant.index('--') + 1:]], fragment)
    out.append(_settle_one(where, text, variant, fragment))
  return out


def _settle_one(where, text, args, fragment) -> DocCommand:
  command, argv, held, loose, group = args[0], [args[0]], [], [], False
  for i, token in enumerate(args[1:], 1):
    if token == '--':   # tpu run: what follows is settled as a train line of its own
      argv += args[i:]
      break
    if token.startswith('[-'):           # [--sizes 200,0]: optional, parsed as given
      token, group = token[1:], True
    if group and token.endswith(']'):
      token, group = token[:-1], False
    if ELIDED.fullmatch(token):
      continue
    name, eq, value = token.partition('=')
    previous = argv[-1] if len(argv) > 1 else ''
    if token.startswith('--config.') and eq and PLACEHOLDER.search(value):
      held.append(name[len('--config.'):])
    elif name == '--config' and eq and PLACEHOLDER.search(value):
      argv.append(f'--config={STAND_IN.get(command, "tiny_gpt")}')
    elif previous == '--config' and PLACEHOLDER.search(token):
      argv.append(STAND_IN.get(command, 'tiny_gpt'))
    elif token.startswith('-') and eq and PLACEHOLDER.search(value):
      loose.append(len(argv))
      argv.append(token)
    elif (not token.startswith('-') and PLACEHOLDER.search(token) and previous.startswith('-')
          and '=' not in previous):
      loose.append(len(argv))
      argv.append(token)
    else:
      argv.append(token)
  return DocCommand(where, text, argv, held, loose, fragment)


def documented_commands() -> list:
  found = []
  for page in doc_pages():
    with open(os.path.join(ROOT, page), encoding='utf-8') as f:
      found += commands_of(page, f.read())
  return found


def parse(commands: list, cwd: str = ROOT, timeout: float = 600) -> list:
  """{'code': exit status, 'error': its last stderr line} of each command's parse, in one
  process (a few seconds of CPU: the libraries' import, then ~0.1 s a line)."""
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(filter(None, [ROOT, env.get('PYTHONPATH')]))
  requests = [dataclasses.asdict(c) for c in commands]
  done = subprocess.run([sys.executable, os.path.abspath(__file__)], input=json.dumps(requests),
                        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


# ---- the parsing process ------------------------------------------------------------------

def _preload() -> None:
  """Imports what the command modules and the config files import at their top (not the
  modules: they define their flags, some reading sys.argv, when imported), so that each child
  imports little (the fine-tuning config's imports alone take seconds)."""
  import pretrain_jax.commands  # noqa: F401, PLC0415
  for path in sorted(glob.glob(os.path.join(ROOT, 'pretrain_jax', 'commands', '*.py')) +
                     glob.glob(os.path.join(ROOT, 'configs', '*.py'))):
    with open(path, encoding='utf-8') as f:
      tree = ast.parse(f.read())
    for node in tree.body:
      if isinstance(node, ast.Import):
        for alias in node.names:
          importlib.import_module(alias.name)
      elif isinstance(node, ast.ImportFrom) and not node.level:
        module = importlib.import_module(node.module)
        for alias in node.names:   # `from ml_collections import config_flags`: a module
          if not hasattr(module, alias.name):
            importlib.import_module(f'{node.module}.{alias.name}')
  importlib.import_module('pretrain_jax.models.config')   # RunConfig's model section: JAX
  checked_in_main()


def _parse_only(request):
  """absl.app.run for the child: the flags parsed as the command parses them, then what
  `after_parse` checks; exit 0 (or 2 and the error) without running main."""
  from absl import flags  # noqa: PLC0415

  def run(main, argv=None, flags_parser=None):
    del main
    argv = _settle_loose(list(argv), request, flags.FLAGS)
    if request['fragment']:   # a fragment may leave out what the command requires
      for name in flags.FLAGS:
        flag = flags.FLAGS[name]
        flag.validators = [v for v in flag.validators if REQUIRED not in v.message]
    rest = flags_parser(argv)   # a refusal: its `error:` line, exit 2
    sys.exit(after_parse(request, flags.FLAGS, rest) or 0)
  return run


def after_parse(request, flag_values, rest):
  """The `error: ...` line of what the parse leaves to main (the sub-command, the keys of
  placeholder config values, the config's sections, `checked_in_main`), or None."""
  from ml_collections.config_flags import config_path  # noqa: PLC0415
  command = request['argv'][0]
  choices = getattr(sys.modules['__main__'], 'COMMANDS', None)   # tpu's, convert_hf's
  if choices is not None and not (request['fragment'] and len(rest) == 1):
    if len(rest) != 2 or rest[1] not in choices:
      return f'error: sub-command {rest[1:]}; expected one of {", ".join(choices)}'
  for key in request['held']:
    try:
      config_path.get_value(key, flag_values['config'].value)
    except (KeyError, AttributeError, IndexError):
      return (f'error: --config.{key}=(a placeholder): the config has no field '
              f'{key.rsplit(".", 1)[-1]!r}')
  try:
    check_sections(command, flag_values)
  except ValueError as e:
    return f'error: {" ".join(str(e).split())}'
  for name, check in checked_in_main().get(command, {}).items():
    values = flag_values[name].value if flag_values[name].present else []
    for value in values if isinstance(values, list) else [values]:
      if PLACEHOLDER.search(value):
        continue
      try:
        check(value)
      except ValueError as e:
        return f'error: --{name}={value}: {e}'
  return None


# The kind of config each command reads (cli.config_of's kinds).
KINDS = {'train': 'pre-training', 'describe': 'pre-training', 'benchmark': 'pre-training',
         'plan': 'pre-training', 'finetune': 'fine-tuning', 'transfer': 'fine-tuning',
         'shakespeare': 'chapter experiment'}


def check_sections(command: str, flag_values) -> None:
  """The parsed --config as main reads it: of the command's kind, and its sections' values
  (enums such as model.attention_impl, ranges) as the frozen dataclasses check them; a
  ValueError names the key. (The chapter experiment's config is read section by section as it
  runs: its kind only.)"""
  from absl import flags  # noqa: PLC0415

  from pretrain_jax import cli  # noqa: PLC0415
  from pretrain_jax.finetune.config import FinetuneConfig  # noqa: PLC0415
  from pretrain_jax.training.config import RunConfig  # noqa: PLC0415
  if command not in KINDS or flag_values['config'].value is None:   # benchmark --suite
    return
  config = cli.config_of(flags.FlagHolder(flag_values, flag_values['config']), KINDS[command])
  if KINDS[command] == 'pre-training':
    RunConfig.from_config(config)
  elif KINDS[command] == 'fine-tuning':   # what main sets from its flags
    config = config.copy_and_resolve_references()
    config.init = flag_values['init'].value or 'INIT'
    config.task.name = flag_values['task'].value or 'TASK'
    if 'mode' in flag_values:
      config.mode = flag_values['mode'].value
    FinetuneConfig.from_config(config)


def checked_in_main() -> dict:
  """{command: {flag: check}}: values a command checks only in main, one check of one value
  (a list flag's item) each, raising ValueError, from what main reads."""
  import configs  # noqa: PLC0415
  from configs import bench_common  # noqa: PLC0415
  from pretrain_jax import chips  # noqa: PLC0415
  from pretrain_jax.data.config import TASK_FORMATS  # noqa: PLC0415
  from pretrain_jax.finetune.config import MODES  # noqa: PLC0415
  from pretrain_jax.perf import suite  # noqa: PLC0415

  def one_of(choices, what):
    def check(value):
      if value not in choices:
        raise ValueError(f'no {what} {value!r}; expected one of {", ".join(choices)}')
    return check

  def suite_or_configs(value):
    if value not in bench_common.SUITES:
      for name in value.split(','):
        configs.config_path(name)
  return {
      'benchmark': {'suite': suite_or_configs, 'models': configs.config_path,
                    'variants': one_of((*suite.VARIANTS, 'all'), 'variant')},
      'transfer': {'modes': one_of(MODES, 'mode'), 'formats': one_of(TASK_FORMATS, 'format'),
                   'sizes': int, 'seeds': int},
      'fewshot': {'shots': int},
      'plan': {'topology': chips.parse_type},
      'tpu': {'tpu_type': chips.parse_type},
  }


def _settle_loose(argv, request, flag_values) -> list:
  """argv (app.run's: the program, then the flags) with each placeholder value kept where its
  flag takes any text, else left out with its flag (which must exist)."""
  drop = set()
  for index in request['loose']:
    i = index   # argv[0] is the program where the request's is the command: the same indices
    if i >= len(argv):
      continue
    token = argv[i]
    name = token.split('=', 1)[0] if token.startswith('-') else argv[i - 1]
    name = name.lstrip('-')
    if name not in flag_values:
      continue   # the parse names it
    if flag_values[name].flag_type() in ('string', 'list', 'multi string'):
      continue
    drop.update({i} if token.startswith('-') else {i - 1, i})
  return [a for j, a in enumerate(argv) if j not in drop]


def _parse_only_argparse(real):
  """cli.argument_parser for the child: its parser exits 0 once the arguments parsed."""
  def make(*args, **kw):
    parser = real(*args, **kw)
    parse = parser.parse_args

    def parse_args(args=None, namespace=None):
      parse(args, namespace)
      sys.exit(0)
    parser.parse_args = parse_args
    return parser
  return make


def _child(request, err_path) -> None:
  code = 0
  try:
    signal.alarm(60)
    fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    from absl import app  # noqa: PLC0415

    from pretrain_jax import cli, commands  # noqa: PLC0415
    commands.missing_workdir = lambda argv: None   # paths are the reader's, not this machine's
    app.run = _parse_only(request)
    cli.argument_parser = _parse_only_argparse(cli.argument_parser)
    commands.main(['pretrain-jax', *request['argv']])
  except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
      code = e.code or 0
    else:
      print(e.code, file=sys.stderr)
      code = 2
  except BaseException as e:  # noqa: BLE001 (reported as the line's error)
    print(f'error: {type(e).__name__}: {e}', file=sys.stderr)
    code = 1
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


def serve() -> None:
  sys.path[0] = ROOT
  requests = json.load(sys.stdin)
  _preload()
  results = []
  with tempfile.TemporaryDirectory() as tmp:
    err_path = os.path.join(tmp, 'stderr')
    for request in requests:
      if request['placeholder_command']:
        results.append({'code': 0, 'error': ''})
        continue
      sys.stdout.flush()
      sys.stderr.flush()
      pid = os.fork()
      if pid == 0:
        _child(request, err_path)
      _, status = os.waitpid(pid, 0)
      with open(err_path, encoding='utf-8', errors='replace') as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
      results.append({'code': os.waitstatus_to_exitcode(status),
                      'error': lines[-1] if lines else ''})
  print(json.dumps(results))


if __name__ == '__main__':
  serve()
