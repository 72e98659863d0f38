"""The embedded default corpus: CPython's own documentation text, no download needed.

`pydoc_data.topics` ships with every CPython (about 465 KB of English reference text: the
language reference sections behind `help('if')`). Each topic is cut at its section headings,
and sections longer than ~3000 characters at paragraph breaks, giving ~300 documents of about a
paragraph group each -- enough documents for shuffling, a held-out split and NSP pairs.
"""
import hashlib
import json
from pydoc_data import topics

from pretrain_jax import paths

MAX_CHARS = 3000  # longer sections are cut at paragraph breaks into pieces about this size


def is_underline(line: str, title: str) -> bool:
  return bool(line) and len(line) == len(title) and len(set(line)) == 1 and line[0] in '=-*~^'


def _sections(text: str) -> list:
  lines, sections, current = text.split('\n'), [], []
  for i, line in enumerate(lines):
    if current and i + 1 < len(lines) and is_underline(lines[i + 1], line):
      sections.append('\n'.join(current))
      current = []
    current.append(line)
  sections.append('\n'.join(current))
  return [s.strip() for s in sections if s.strip()]


def _cut(section: str) -> list:
  if len(section) <= MAX_CHARS:
    return [section]
  pieces, current = [], ''
  for paragraph in section.split('\n\n'):
    if current and len(current) + len(paragraph) > MAX_CHARS:
      pieces.append(current.strip())
      current = ''
    current += paragraph + '\n\n'
  pieces.append(current.strip())
  return [p for p in pieces if p]


def embedded_documents() -> list:
  """The documents, in a fixed order (sorted topic names, then section order)."""
  return [piece for name in sorted(topics.topics) for section in _sections(topics.topics[name])
          for piece in _cut(section)]


def write_embedded_corpus(directory: str) -> str:
  """Write the documents as C4-style JSON lines (atomically); returns the file path.

  The file name carries a hash of the text, so a different CPython gets its own file.
  """
  lines = ''.join(json.dumps({'text': d}) + '\n' for d in embedded_documents())
  digest = hashlib.sha256(lines.encode()).hexdigest()[:16]
  path = paths.resolve(directory) / f'embedded_pydoc_{digest}.jsonl'
  if not path.exists():
    paths.write_atomic(path, lines)
  return str(path)
