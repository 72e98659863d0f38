"""A command's --help: its docstring, then its own flags, each with what it takes by default or
`(required)`. cli.parse_flags prints it for --help, -h, -? and --helpshort, and exits 0.

absl's own --help heads the flags with the command file's absolute path (absl files __main__'s
flags under sys.argv[0], which `python -m` and runpy set to that file), shows a required flag
as `(default: 'None')` and a default config as its absolute path.
"""
import sys

from absl import flags

import configs

HELP_ARGS = ('--help', '-h', '-?', '--helpshort')
SHARED = ('verbose',)   # flags cli defines for every command (listed with each command's)


def asked(argv) -> bool:
  """Whether argv (program first) asks for --help before a `--` (tpu passes what follows on)."""
  args = argv[1:argv.index('--')] if '--' in argv else argv[1:]
  return any(a in HELP_ARGS for a in args)


def is_required(flag) -> bool:
  """Whether the flag must be given: a validator of it alone refuses its unset value, None
  (absl's mark_flag_as_required and `required=True` register one)."""
  return flag.default is None and any(
      v.get_flags_names() == [flag.name] and not v.checker(None) for v in flag.validators)


def missing_required() -> list:
  """The required flags a parsed command line left unset, as `--name`."""
  return [f'--{name}' for name in sorted(flags.FLAGS)
          if is_required(flags.FLAGS[name]) and flags.FLAGS[name].value is None]


def default_text(flag) -> str:
  """What the flag takes when not given, as a user would type it: a packaged config by name."""
  if type(flag).__name__ == '_ConfigFlag':   # ml_collections: the default is a file's path
    path = flag.default_as_str.strip("'")
    return next((n for n in configs.config_names() if configs.config_path(n) == path), path)
  return flag.default_as_str


def flag_text(flag) -> str:
  name = f'--[no]{flag.name}' if flag.boolean else f'--{flag.name}'
  lines = [flags.text_wrap(f'{name}: {flag.help}', indent='    ', firstline_indent='  ')]
  default = None if flag.default is None else default_text(flag)
  notes = ['required'] if is_required(flag) else [f'default: {default}'] if default else []
  if flag.parser.syntactic_help:
    notes.append(flag.parser.syntactic_help)
  lines += [flags.text_wrap(f'({note})', indent='    ') for note in notes]
  return '\n'.join(lines)


def help_text() -> str:
  """__main__'s docstring and the flags it defines or adopts (absl's key flags), by name."""
  doc = (sys.modules['__main__'].__doc__ or '').rstrip('\n')
  own = flags.FLAGS.get_key_flags_for_module(sys.argv[0])
  own += [flags.FLAGS[name] for name in SHARED if name in flags.FLAGS]
  listed = sorted({f.name: f for f in own}.values(), key=lambda f: f.name)
  return f'{doc}\n\nflags:\n' + '\n'.join(flag_text(f) for f in listed) + '\n'
