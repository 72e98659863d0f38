"""The import direction DESIGN.md draws, checked on the source (every import, lazy ones too).

A package may import only the packages below it in the data flow:
objectives and models are independent bottoms; data builds on objectives; training (pure
training math) on models, objectives and data; run (the loop, checkpoints, locks, hosts) on
training; hf, inference, perf and experiments sit on top, and the commands (with cli/, what
they share) above everything. Only the commands and cli/ import configs/ (the library takes
ConfigDicts from its caller), nothing imports scripts/ (comparison tools outside the package),
and cloud/ (the TPU launcher) is the standard library only. paths.py, sections.py and ops/
(the operations whose form depends on the backend) are the bottom layer: every package but
cloud/ may import them, and they import no other pretrain_jax package. chips.py (the table of
accelerator facts) is the bottom too and the standard library only, so cloud/ may import it as
well: the launcher, the MFU and the TPU plans read one table. No module imports itself back
through others (no import cycles, lazy imports included).
"""
import ast
import os
import re

import pytest
from helpers import ROOT

PACKAGE = os.path.join(ROOT, 'pretrain_jax')
ALLOWED = {
    'paths': set(),      # the bottom: every user path (local or gs://) goes through it
    'sections': set(),   # the bottom: a config section as a frozen, checked dataclass
    'chips': set(),      # the bottom: the accelerator table (standard library only)
    'ops': set(),        # the bottom too: the operations whose form depends on the backend
    'models': set(),
    'objectives': set(),
    'data': {'objectives'},
    'training': {'models', 'objectives', 'data'},                 # pure training math
    'run': {'models', 'objectives', 'data', 'training'},          # files, locks, hosts
    'hf': {'models', 'training', 'run', 'data'},
    'inference': {'models', 'training', 'run', 'data', 'hf'},
    'perf': {'models', 'objectives', 'data', 'training', 'run'},
    'experiments': {'models', 'objectives', 'training', 'run'},
    'finetune': {'models', 'training', 'run', 'data', 'inference'},
    'cloud': set(),
    '__init__': {'inference'},
    'cli': set(),        # what the commands share: process set-up, one-line errors, endings
    'commands': {'models', 'objectives', 'data', 'training', 'run', 'hf', 'inference', 'perf',
                 'experiments', 'finetune', 'cloud', 'cli'},   # `pretrain-jax COMMAND`
    '__main__': {'commands'},
}
BOTTOM = ('paths', 'sections', 'ops')   # importable by every package but cloud/
STDLIB_BOTTOM = ('chips',)   # importable by every package, cloud/ included



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
        if target != pkg and target not in ALLOWED[pkg] and target not in STDLIB_BOTTOM and (
            target not in BOTTOM or pkg == 'cloud'):
          bad.append((os.path.relpath(path, ROOT), name))
  assert not bad, f'{package} may import only {sorted(ALLOWED[package])}: {bad}'


def test_the_stdlib_bottom_imports_only_the_standard_library():
  import sys  # noqa: PLC0415
  for name in STDLIB_BOTTOM:
    found = imports_of(os.path.join(PACKAGE, f'{name}.py'))
    assert all(m in sys.stdlib_module_names for m in found), (name, found)


def test_the_checker_sees_lazy_and_from_imports(tmp_path):
  source = tmp_path / 'x.py'
  source.write_text('import configs.common\nfrom pretrain_jax import data\n'
                    'def f():\n  from pretrain_jax.training import loop\n')
  assert imports_of(str(source)) == {'configs', 'pretrain_jax.data', 'pretrain_jax.training'}


def test_code_asks_the_family_record_instead_of_branching_on_the_name():
  """DESIGN.md: "which family?" is a field of the record (models/family.py, hf/record.py);
  only ModelConfig's validation of a family's allowed settings compares the name."""
  branch = re.compile(r"family ==|family in|family !=|\.family not in|name [!=]= '(bert|gpt|t5)'")
  found = [(os.path.relpath(path, ROOT), n) for _, path in library_files()
           for n, line in enumerate(open(path, encoding='utf-8'), 1) if branch.search(line)]
  assert found and {path for path, _ in found} == {'pretrain_jax/models/config.py'}, found


def module_imports(path: str, modules: set) -> set:
  """The pretrain_jax modules (files, packages as their __init__) a file imports, lazily too."""
  out = set()
  for node in ast.walk(ast.parse(open(path, encoding='utf-8').read(), path)):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names if a.name in modules}
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
      for alias in node.names:
        sub = f'{node.module}.{alias.name}'
        out.add(sub if sub in modules else node.module)
  return out


def import_graph() -> dict:
  files = {}
  for _, path in library_files():
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
    files[rel.removesuffix('.__init__')] = path
  return {name: module_imports(path, set(files)) - {name} for name, path in files.items()}


def cycles(graph: dict) -> list:
  """Each strongly connected set of more than one module (Tarjan's algorithm)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component, top = set(), None
      while top != v:
        top = stack.pop()
        on_stack.discard(top)
        component.add(top)
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_no_module_imports_itself_back():
  assert cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]
  assert cycles(import_graph()) == []
