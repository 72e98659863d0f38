"""The `--config` flag: a packaged config by name, ml_collections' errors on it as one line, and
which commands read a config of which kind. cli.run and cli.parse_flags call these."""
import os
import re

from absl import flags

import configs

CONFIG_HELP = 'a config name (gpt2_small) or file (configs/NAME.py)'
CONFIG_KINDS = {   # a config file's kind: (the keys that mark it, the commands that read it)
    'fine-tuning': (('init', 'mode', 'task'), 'finetune, transfer'),   # (has model/data/train)
    'chapter experiment': (('corpus', 'gpt', 'bert'), 'shakespeare'),
    'pre-training': (('model', 'data', 'train'), 'train, describe, benchmark'),
}
CONFIG_TRACEBACK = 'Error whilst parsing config file:'   # ml_collections: get_config raised


def unknown_override(argv, error) -> str:
  """One line for ml_collections' error on `--config.a.b=v` when the config has no `b`:
  the flag as given, the missing field and ml_collections' suggestion, if any."""
  text = str(error).replace('\\n', ' ')
  found = re.search(r"'([^'\\ ]+)", text)
  field = found.group(1) if found else '?'
  hint = re.search(r'Did you mean "([^"]+)"', text)
  given = next((a for a in argv[1:] if a.startswith('--') and
                field in a.split('=', 1)[0].lstrip('-').split('.')[1:]), field)
  return (f'error: {given}: the config has no field {field!r}'
          + (f' (did you mean {hint.group(1)!r}?)' if hint else '')
          + '; expected a key that the config file defines')



def config_variant_error(text: str) -> str:
  """ml_collections' 'flag --config=FILE:ARG: Error whilst parsing config file: Traceback ...
  TypeError: ...' -> one line: the flag and the last line of the traceback (the error)."""
  flag = text.split(': ' + CONFIG_TRACEBACK)[0].removeprefix('flag ')
  error = [line.strip() for line in text.splitlines() if line.strip()][-1]
  if 'get_config() takes 0 positional arguments' in error:
    error = ("this config file takes no ':variant'; expected "
             f"{flag.split('=', 1)[0]}={flag.split('=', 1)[-1].rsplit(':', 1)[0]}")
  else:
    error = error.split(': ', 1)[-1] if re.match(r'[\w.]+(Error|Exception): ', error) else error
  return f'error: {flag}: {error}'



def config_of(holder, kind: str):
  """The config a DEFINE_config_file flag loaded; a ValueError when it is of another kind than
  the command reads (e.g. `describe --config configs/finetune.py`)."""
  config = holder.value
  actual = next((k for k, (keys, _) in CONFIG_KINDS.items() if all(x in config for x in keys)),
                None)
  if actual == kind:
    return config
  what = (f'a {actual} config (read by {CONFIG_KINDS[actual][1]})' if actual else
          'not a config of any command (no ' + ', '.join(
              k for k in CONFIG_KINDS[kind][0] if k not in config) + ' section)')
  raise ValueError(f'--{holder.name}={flags.FLAGS[holder.name].config_filename} is {what}; '
                   f'expected a {kind} config (read by {CONFIG_KINDS[kind][1]}; '
                   'docs/training.md lists them)')


def named_configs(argv: list) -> list:
  """argv with `--config NAME[:variant]` (a bare name, no such file) as the packaged config's
  path, so `--config gpt2_small` and `--config configs/gpt2_small.py` both work anywhere; a
  ValueError names a bare name that no config has."""
  out = list(argv)
  for i, arg in enumerate(out):
    if arg.startswith('--config='):
      j, flag = i, '--config='
    elif arg == '--config' and i + 1 < len(out):
      j, flag = i + 1, ''
    else:
      continue
    value = out[j].removeprefix(flag)
    name, colon, variant = value.partition(':')
    if (os.path.exists(name)  # noqa: TID251 (config files are local modules)
        or not re.fullmatch(r'[A-Za-z_]\w*', name)):
      continue
    try:
      out[j] = flag + configs.config_path(name) + colon + variant
    except ValueError as e:
      raise ValueError(f'--config={value}: {e}') from None
  return out
