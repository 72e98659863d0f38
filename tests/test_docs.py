"""The documentation's shape: the README is the front door (small, the two commands first),
DESIGN.md stays a map, every relative link leads to a file, and dates live in docs/, not code.
Reads files only (no subprocess), so it runs in the default set."""
import glob
import os
import re

import pytest
from helpers import ROOT

DOCS = ['README.md', 'DESIGN.md'] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, 'docs', '*.md')))
# The two fresh-machine commands: the first trains the main job, the second runs the tests.
FIRST_COMMANDS = (
    "python3.11 -m venv .venv && .venv/bin/pip install -q -e . && "
    ".venv/bin/pretrain-jax train_tiny --workdir runs/tiny\n"
    "python3.11 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && "
    ".venv/bin/python -m pytest -q -n 2 tests\n")
LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
DATE = re.compile(r'20[0-9]{2}-[0-9]{2}-[0-9]{2}')


def read(relpath: str) -> str:
  with open(os.path.join(ROOT, relpath), encoding='utf-8') as f:
    return f.read()


def relative_links(text: str) -> list:
  """Targets of markdown links, without anchors; web links and pure anchors left out."""
  targets = [t.split('#', 1)[0] for t in LINK.findall(text)]
  return [t for t in targets if t and not re.match(r'[a-z]+://|mailto:', t)]


def test_relative_links_finds_files_and_skips_web_links_and_anchors():
  text = ('[a](docs/data.md#the-tokenizer) [b](https://example.com/x.md) [c](#use) '
          '[d](../DESIGN.md) [e](http://x)')
  assert relative_links(text) == ['docs/data.md', '../DESIGN.md']


@pytest.mark.parametrize('page', DOCS)
def test_every_relative_link_points_at_a_file_that_exists(page):
  folder = os.path.dirname(os.path.join(ROOT, page))
  missing = [t for t in relative_links(read(page))
             if not os.path.exists(os.path.normpath(os.path.join(folder, t)))]
  assert not missing, f'{page} links to missing files: {missing}'


@pytest.mark.parametrize('page', DOCS)
def test_no_link_leaves_the_repository(page):
  folder = os.path.dirname(os.path.join(ROOT, page))
  outside = [t for t in relative_links(read(page))
             if not os.path.normpath(os.path.join(folder, t)).startswith(ROOT + os.sep)
             and os.path.normpath(os.path.join(folder, t)) != ROOT]
  assert not outside, f'{page} links outside the repository: {outside}'
  # (the pattern's character class keeps this file itself from naming the path it looks for)
  assert not re.search(r'/wor[k]/', read(page)), f'{page} names a machine path'


def test_the_docs_pages_exist():
  for name in ('cloud_tpu', 'data', 'training', 'finetuning', 'checkpoints_and_hf',
               'performance', 'chapter41'):
    assert f'docs/{name}.md' in DOCS, name
    assert f'docs/{name}.md' in read('README.md'), f'the README does not link docs/{name}.md'


def test_readme_is_small_and_starts_with_the_two_commands():
  readme = read('README.md')
  assert len(readme.encode('utf-8')) <= 12_000, len(readme.encode('utf-8'))
  assert readme.startswith('# pretrain_jax\n\n```bash\n' + FIRST_COMMANDS + '```\n'), (
      readme[:400])


def test_design_is_a_map_not_a_manual():
  size = len(read('DESIGN.md').encode('utf-8'))
  assert size <= 10_000, size


def test_no_dates_in_code_or_configs():
  """Dates (and the measurements that come with them) belong in docs/performance.md."""
  found = []
  for folder in ('pretrain_jax', 'configs'):
    for path in glob.glob(os.path.join(ROOT, folder, '**', '*'), recursive=True):
      if os.path.isfile(path) and not path.endswith(('.pyc', '.gz', '.model')):
        with open(path, encoding='utf-8', errors='replace') as f:
          for number, line in enumerate(f, 1):
            if DATE.search(line):
              found.append(f'{os.path.relpath(path, ROOT)}:{number}: {line.strip()}')
  assert not found, '\n'.join(found)
