"""The import direction DESIGN.md draws, checked on the source (every import, lazy ones too).

A package may import only the packages below it in the data flow:
objectives and models are independent bottoms; data builds on objectives; training on models,
objectives and data; hf, inference, perf and experiments sit on top, and the commands (with
cli.py, what they share) above everything. Only the commands and cli.py import configs/ (the
library takes ConfigDicts from its caller), nothing imports scripts/ (comparison tools outside
the package), and cloud/ (the TPU launcher) is the standard library only. paths.py,
sections.py and tuning/ (how each backend computes, tuning/backends.py) are the bottom layer:
every package but cloud/ may import them, and they import no other pretrain_jax package.
"""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, 'pretrain_jax')
ALLOWED = {
    'paths': set(),   # the bottom: every user path (local or gs://) goes through it
    'sections': set(),   # the bottom: a config section as a frozen, checked dataclass
    'tuning': set(),     # the bottom too: what each backend computes differently
    'models': set(),
    'objectives': set(),
    'data': {'objectives'},
    'training': {'models', 'objectives', 'data'},
    'hf': {'models', 'training', 'data'},
    'inference': {'models', 'training', 'data', 'hf'},
    'perf': {'models', 'objectives', 'data', 'training'},
    'experiments': {'models', 'objectives', 'training'},
    'finetune': {'models', 'training', 'data', 'inference'},
    'cloud': set(),
    '__init__': {'inference'},
    'commands': {'models', 'objectives', 'data', 'training', 'hf', 'inference', 'perf',
                 'experiments', 'finetune', 'cloud', 'cli'},   # `pretrain-jax COMMAND`
    '__main__': {'commands'},
    'cli': set(),                  # what commands share: quiet logs, one-line errors
}
BOTTOM = ('paths', 'sections', 'tuning')   # importable by every package but cloud/



def imports_of(path: str) -> set:
  """Top-level module names and pretrain_jax subpackages a file imports (any depth in it)."""
  out = set()
  for node in ast.walk(ast.parse(open(path, encoding='utf-8').read(), path)):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      names = ([f'pretrain_jax.{a.name}' for a in node.names] if node.module == 'pretrain_jax'
               else [node.module])
    else:
      continue
    for name in names:
      parts = name.split('.')
      out.add(f'pretrain_jax.{parts[1]}' if parts[0] == 'pretrain_jax' and len(parts) > 1
              else parts[0])
  return out


def library_files():
  for folder, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith('.py'):
        path = os.path.join(folder, name)
        rel = os.path.relpath(path, PACKAGE).split(os.sep)
        yield (rel[0] if len(rel) > 1 else rel[0][:-3]), path


def test_every_package_has_a_rule():
  packages = {p for p, _ in library_files()}
  assert packages <= set(ALLOWED), packages - set(ALLOWED)


@pytest.mark.parametrize('package', sorted(ALLOWED))
def test_imports_run_down_the_data_flow(package):
  bad = []
  for pkg, path in library_files():
    if pkg != package:
      continue
    for name in imports_of(path):
      if name == 'scripts' or (name == 'configs' and pkg not in ('commands', 'cli')):
        bad.append((os.path.relpath(path, ROOT), name))
      elif name.startswith('pretrain_jax.'):
        target = name.split('.')[1]
        if target != pkg and target not in ALLOWED[pkg] and (
            target not in BOTTOM or pkg == 'cloud'):
          bad.append((os.path.relpath(path, ROOT), name))
  assert not bad, f'{package} may import only {sorted(ALLOWED[package])}: {bad}'


def test_the_checker_sees_lazy_and_from_imports(tmp_path):
  source = tmp_path / 'x.py'
  source.write_text('import configs.common\nfrom pretrain_jax import data\n'
                    'def f():\n  from pretrain_jax.training import loop\n')
  assert imports_of(str(source)) == {'configs', 'pretrain_jax.data', 'pretrain_jax.training'}


def test_code_asks_the_family_record_instead_of_branching_on_the_name():
  """DESIGN.md: "which family?" is a field of the record (models/family.py, hf/family.py);
  only ModelConfig's validation of a family's allowed settings compares the name."""
  import re  # pylint: disable=g-import-not-at-top
  branch = re.compile(r"family ==|family in|family !=|\.family not in|name [!=]= '(bert|gpt|t5)'")
  found = [(os.path.relpath(path, ROOT), n) for _, path in library_files()
           for n, line in enumerate(open(path, encoding='utf-8'), 1) if branch.search(line)]
  assert found and {path for path, _ in found} == {'pretrain_jax/models/config.py'}, found
