"""Local C4-format files as a tfds dataset, so they flow through the same tf.data pipeline.

Files may be local or on gs:// (pretrain_jax.paths; globs work on both). Accepted files:
`.json` / `.jsonl` / `.json.gz` / `.jsonl.gz` with one JSON object per line and the text under
`text_key` (C4's own format; a `.json` file holding one JSON list of objects also works), and
`.txt` / `.txt.gz` with one document per blank-line-separated block.

Bad records (a line that is not JSON, lacks the text field or is not a string, invalid UTF-8,
an empty or whitespace-only document, an empty file) are skipped, counted and logged once when
the dataset is prepared (the counts as a warning; each record at INFO, shown by `--verbose`).
Missing files, `.gz` files that do not decompress, or files with no usable document at all,
are errors.

Documents are numbered in file order (each glob's files sorted by path); an evenly spaced
round(N * validation_fraction) of them (at least one when N >= 2 and the fraction is > 0) form
the `validation` split, the rest `train`. The prepared dataset is written under
`<data_dir>/local_text_files/<fingerprint>`, the fingerprint covering paths, sizes, mtimes
and the split settings, so a later run with the same files reuses it. Which `data_dir`
(this host's cache, or one directory every process of a multi-host run reads) is
sources.prepared_dir's rule; `prepare` writes a copy, `open_prepared` only opens one.
"""
import collections
import contextlib
import gzip
import hashlib
import json
import logging
import sys
import zlib

import tensorflow as tf
import tensorflow_datasets as tfds

from pretrain_jax import paths as paths_lib

log = logging.getLogger(__name__)
EXTENSIONS = ('.jsonl.gz', '.json.gz', '.jsonl', '.json', '.txt.gz', '.txt')
FORMAT_VERSION = 1  # bump when the parsing below changes, so cached datasets are rebuilt


def expand_files(pattern: str, name: str = 'config.data.files') -> list:
  """Paths matching a glob, sorted, or comma-separated globs' in their order; a file two globs
  match is read once (twice, its documents would be trained on twice, and could be in both
  splits). Errors name what is wrong, and `name` (a script's flag, e.g. --files)."""
  paths = {}   # (a dict: insertion order, and one entry per file)
  for part in [p.strip() for p in pattern.split(',') if p.strip()]:
    matched = paths_lib.glob(part)
    if not matched:
      raise FileNotFoundError(f'{name}: {part!r} matches no file')
    paths.update(dict.fromkeys(matched))
  paths = list(paths)
  if not paths:
    raise FileNotFoundError(f'{name}={pattern!r} names no file')
  for p in paths:
    if not p.endswith(EXTENSIONS) and paths_lib.resolve(p).is_dir():   # (a stat only here)
      raise ValueError(f'{name}: {p!r} is a directory; expected files or a glob '
                       f'such as {p.rstrip("/") + "/*.jsonl"!r}')
    if not p.endswith(EXTENSIONS):
      raise ValueError(f'{name}: {p!r} has an unsupported extension; expected one of '
                       f'{", ".join(EXTENSIONS)}')
  return paths


def _open_bytes(path: str) -> bytes:
  data = paths_lib.resolve(path).read_bytes()
  if not path.endswith('.gz'):
    return data
  try:
    return gzip.decompress(data)
  except (OSError, EOFError, zlib.error) as e:   # not gzip, truncated, corrupt
    raise ValueError(f'{path} is not a readable gzip file ({type(e).__name__}: {e}); expected '
                     'a .gz name to hold gzip-compressed text (or rename the file)') from None


def _decode(raw: bytes, where: str, stats: collections.Counter, say):
  try:
    return raw.decode('utf-8')
  except UnicodeDecodeError as e:
    stats['invalid_utf8'] += 1
    if stats['invalid_utf8'] <= 3:
      say('skipping a record with invalid UTF-8 at %s: %s', where, e)
    return None


def _json_records(data: bytes, path: str, text_key: str, stats, say):
  stripped = data.lstrip()
  if stripped.startswith(b'['):  # one JSON list of objects
    try:
      items = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
      stats['bad_json'] += 1
      say('skipping %s: not a JSON list: %s', path, e)
      return
    lines = [(f'{path}[{i}]', item) for i, item in enumerate(items)]
  else:
    lines = []
    for n, line in enumerate(data.split(b'\n'), 1):
      if not line.strip():
        continue
      text = _decode(line, f'{path}:{n}', stats, say)
      if text is None:
        continue
      try:
        lines.append((f'{path}:{n}', json.loads(text)))
      except ValueError as e:
        stats['bad_json'] += 1
        if stats['bad_json'] <= 3:
          say('skipping %s:%d: not JSON: %s', path, n, e)
  for where, item in lines:
    value = item.get(text_key) if isinstance(item, dict) else None
    if not isinstance(value, str):
      stats['no_text_field'] += 1
      if stats['no_text_field'] <= 3:
        say('skipping %s: no string field %r', where, text_key)
      continue
    yield where, value


def _txt_records(data: bytes, path: str, stats, say):
  for n, block in enumerate(data.replace(b'\r\n', b'\n').split(b'\n\n')):
    if block.strip():
      text = _decode(block, f'{path} block {n}', stats, say)
      if text is not None:
        yield f'{path} block {n}', text


def read_documents(paths: list, text_key: str = 'text', stats=None, log_skips: bool = True):
  """Yield the text of every good document in `paths`; bad records are counted in `stats` and,
  with `log_skips`, logged at INFO."""
  stats = collections.Counter() if stats is None else stats
  say = log.info if log_skips else lambda *args: None
  for path in paths:
    data = _open_bytes(path)
    if not data.strip():
      stats['empty_file'] += 1
      say('file %s is empty', path)
      continue
    is_txt = path.endswith(('.txt', '.txt.gz'))
    records = _txt_records(data, path, stats, say) if is_txt else _json_records(
        data, path, text_key, stats, say)
    for where, text in records:
      if not text.strip():
        stats['empty_document'] += 1
        continue
      try:
        text.encode('utf-8')
      except UnicodeEncodeError:  # lone surrogates from JSON escapes
        stats['invalid_utf8'] += 1
        say('skipping %s: text is not valid Unicode', where)
        continue
      stats['documents'] += 1
      yield text


def validation_indices(num_docs: int, fraction: float) -> set:
  """Evenly spaced round(N * fraction) indices (at least 1 if N >= 2 and fraction > 0)."""
  if not 0.0 <= fraction < 1.0:
    raise ValueError(f'validation_fraction={fraction}; expected a value in [0, 1)')
  if fraction == 0.0 or num_docs < 2:
    return set()
  n_val = min(max(1, round(num_docs * fraction)), num_docs - 1)
  return {int((k + 0.5) * num_docs / n_val) for k in range(n_val)}


class LocalTextFiles(tfds.core.GeneratorBasedBuilder):
  """tfds builder over local files; one BuilderConfig per fingerprint of files + settings.

  `name` (a fingerprint) opens a copy prepared elsewhere without touching `paths` (then empty).
  """
  VERSION = tfds.core.Version('1.0.0')
  # No source directory with checksums or metadata: also keeps tfds from resolving this
  # package as a resource path (which needs the optional importlib_resources package).
  code_path = None

  def __init__(self, *, paths: list, text_key: str = 'text', validation_fraction: float = 0.02,
               name: str = '', **kwargs):
    self._paths, self._text_key, self._fraction = list(paths), text_key, validation_fraction
    super().__init__(config=tfds.core.BuilderConfig(
        name=name or fingerprint(paths, text_key, validation_fraction)), **kwargs)

  def _log_download_bytes(self) -> None:
    """tfds announces 'Downloading and preparing dataset Unknown size'; nothing downloads."""
    print(f'preparing {len(self._paths)} local text file(s) for tf.data (once) in '
          f'{self.data_dir} ...', file=sys.stderr, flush=True)

  def _log_download_done(self) -> None:
    print('prepared; later runs reuse it', file=sys.stderr, flush=True)

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self, description='Local C4-format text files (pretrain_jax.data.local_builder).',
        features=tfds.features.FeaturesDict({'text': tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    stats = collections.Counter()
    num_docs = sum(1 for _ in read_documents(self._paths, self._text_key, stats))
    skipped = {k: v for k, v in stats.items() if k != 'documents'}
    if skipped:   # always shown (the per-record reasons are logged: --verbose)
      print(f'warning: local files: {num_docs} documents kept, records skipped: {skipped} '
            '(--verbose names each)', file=sys.stderr, flush=True)
    if num_docs == 0:
      raise ValueError(f'no usable document in {len(self._paths)} file(s) '
                       f'{self._paths[:3]}...: skipped {skipped or "nothing (files empty)"}')
    val = validation_indices(num_docs, self._fraction)
    splits = {'train': self._generate_examples(val, False)}
    if val:  # tfds cannot write an empty split; reading it then names the missing split
      splits['validation'] = self._generate_examples(val, True)
    return splits

  def _generate_examples(self, val: set, validation: bool):
    # (the counting pass above logged each skipped record once)
    for i, text in enumerate(read_documents(self._paths, self._text_key, log_skips=False)):
      if (i in val) == validation:
        yield i, {'text': text}


def fingerprint(paths: list, text_key: str, validation_fraction: float) -> str:
  """Short hash of the files (path, size, mtime) and the split settings."""
  h = hashlib.sha256(repr((FORMAT_VERSION, text_key, validation_fraction)).encode())
  for p in paths:
    size, mtime_ns = paths_lib.size_and_mtime(p)
    h.update(repr((str(paths_lib.resolve(p)), size, mtime_ns)).encode())
  return 'f' + h.hexdigest()[:16]


def prepare(paths: list, data_dir: str, *, text_key: str = 'text',
            validation_fraction: float = 0.02) -> LocalTextFiles:
  """The prepared builder (prepared once, then reused from `data_dir`, which may be gs://)."""
  def builder():
    return LocalTextFiles(paths=paths, text_key=text_key,
                          validation_fraction=validation_fraction, data_dir=data_dir)
  prepared = builder()
  if not prepared.is_prepared():
    tfds.display_progress_bar(False)
    try:
      # tfds prints its progress to stdout, which scripts keep for their JSON results.
      with contextlib.redirect_stdout(sys.stderr):
        prepared.download_and_prepare(download_config=tfds.download.DownloadConfig(
            compute_stats=tfds.download.ComputeStatsMode.SKIP))
    except (OSError, tf.errors.OpError) as e:
      prepared = builder()  # another process may have prepared the same files concurrently
      if not prepared.is_prepared():
        raise OSError(f'cannot prepare the data in {data_dir!r}: {type(e).__name__}: {e}; '
                      'expected a directory this process can write (set '
                      'config.data.prepared_dir to one)') from None
  return prepared


def open_prepared(data_dir: str, name: str, description: str) -> LocalTextFiles:
  """The copy `name` (a fingerprint) of `description` that another process prepared in
  `data_dir`. Never prepares: a missing copy is an error naming the directory."""
  builder = LocalTextFiles(paths=[], name=name, data_dir=data_dir)
  if not builder.is_prepared():
    raise FileNotFoundError(
        f'{description} is not prepared in {data_dir!r} (no {LocalTextFiles.name}/{name} '
        'there after process 0 prepared it): every process must read the directory process 0 '
        'writes; use a shared one (a gs:// workdir, or config.data.prepared_dir on storage '
        'every host reads)')
  return builder
