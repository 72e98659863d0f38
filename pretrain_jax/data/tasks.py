"""Labelled tasks for fine-tuning: local files, named tfds datasets, and one embedded task.

`load_task(name, ...)` -> Task: examples per split as plain dicts, either classification
(`text`, optional `text_pair`, `label` a string) or text-to-text (`inputs`, `targets`).

  name = 'word_order'                 the embedded task (no download; see word_order_examples)
  name = 'doc_titles'                 the embedded summarisation task: a section's title from its
                                      text (no download; see title_examples)
  name = 'glue/sst2' (cola, mrpc, qnli, rte, qqp, super_glue/boolq)   tfds, in tfds_data_dir
  name = 'cnn_dailymail', 'xsum'      tfds summarisation (text to text, scored by ROUGE)
  name = DIR                          DIR/train.* and DIR/validation.* (or dev.*; test.*), each
                                      .jsonl / .json / .csv / .tsv
  name = 'train=a.csv,validation=b.csv'   named files

The label set is collected from the training split (sorted; integers numerically) and becomes
the class order; a validation label unseen in training is an error, and a train label on very
few rows (a typo?: rare_labels) a warning on stderr.
"""
import collections
import csv
import dataclasses
import io
import json
import random
import re
import sys
import zlib

from pretrain_jax import paths
from pretrain_jax.data import corpus

EMBEDDED = 'word_order'
EMBEDDED_SUMMARIES = 'doc_titles'
SPLIT_FILES = {'train': ('train',), 'validation': ('validation', 'dev'), 'test': ('test',)}
EXTENSIONS = ('.jsonl', '.json', '.csv', '.tsv')
RARE_FRACTION, RARE_SINGLE = 0.01, 10   # a train label this rare is warned about (rare_labels)
# tfds name -> (text feature, pair feature or None, headline metric, T5 task prefix, the
# question a GPT prompt ends with: data/prompts.py)
TFDS_TASKS = {
    'glue/sst2': ('sentence', None, 'accuracy', 'sst2 sentence', 'Sentiment'),
    'glue/cola': ('sentence', None, 'mcc', 'cola sentence', 'Grammar'),
    'glue/mrpc': ('sentence1', 'sentence2', 'f1', 'mrpc sentence1', 'Paraphrase'),
    'glue/qnli': ('question', 'sentence', 'accuracy', 'qnli question', 'Entailment'),
    'glue/rte': ('sentence1', 'sentence2', 'accuracy', 'rte sentence1', 'Entailment'),
    'glue/qqp': ('question1', 'question2', 'f1', 'qqp question1', 'Duplicate'),
    'super_glue/boolq': ('question', 'passage', 'accuracy', 'boolq question', 'Answer'),
}
# tfds summarisation name -> (document feature, summary feature)
TFDS_SUMMARIES = {'cnn_dailymail': ('article', 'highlights'), 'xsum': ('document', 'summary')}
SUMMARY_PREFIX, SUMMARY_METRIC = 'summarize', 'rougeL'


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  splits: dict                 # split -> list of example dicts
  labels: tuple = ()           # class names in class order; () for free text-to-text
  metric: str = 'accuracy'     # headline validation metric: accuracy | mcc | f1 (of the
                               # classes); rougeL for free text to text
  prefix: str = ''             # T5 input prefix, e.g. 'sst2 sentence'
  question: str = 'Label'      # what a GPT prompt asks before the label (data/prompts.py)

  @property
  def pairs(self) -> bool:
    """Examples are sentence pairs (text, text_pair)."""
    return any(e.get('text_pair') is not None for e in self.splits['train'])

  @property
  def text_to_text(self) -> bool:
    return 'targets' in self.splits['train'][0]

  def t5_example(self, example: dict) -> dict:
    """A classification example as T5 text (`prefix: text [pair: text_pair]` -> label)."""
    if 'targets' in example:
      return example
    text = f'{self.prefix}: {example["text"]}' if self.prefix else example['text']
    if example.get('text_pair') is not None:
      text += f' {self.prefix.split()[0] + " " if self.prefix else ""}pair: {example["text_pair"]}'
    return {'inputs': text, 'targets': example['label']}


def _label_key(label: str):
  return (0, int(label), '') if re.fullmatch(r'-?\d+', label) else (1, 0, label)


def rare_labels(counts: dict) -> list:
  """Labels rare enough to look like typos: on fewer than RARE_FRACTION of the rows, or on one
  row while another label has at least RARE_SINGLE rows."""
  total, most = sum(counts.values()), max(counts.values())
  return [label for label, n in counts.items()
          if n < RARE_FRACTION * total or (n == 1 and most >= RARE_SINGLE)]


def collect_labels(task_name: str, splits: dict) -> tuple:
  """Sorted label set of the train split; errors for an unseen label in any other split."""
  counts = collections.Counter(e['label'] for e in splits['train'])
  labels = tuple(sorted(counts, key=_label_key))
  if len(labels) < 2:
    raise ValueError(f'task {task_name!r}: the train split has labels {list(labels)}; expected '
                     'at least 2 classes')
  for label in rare_labels(counts):
    like = [other for other in labels if other != label and
            other.strip().lower() == label.strip().lower()]
    print(f'warning: task {task_name!r}: train label {label!r} is on {counts[label]} of '
          f'{sum(counts.values())} rows{f" (like {like[0]!r})" if like else ""}; a typo? it '
          f'trains as a class of its own (labels: {dict(counts.most_common(5))})',
          file=sys.stderr, flush=True)
  for split, examples in splits.items():
    unseen = sorted({e['label'] for e in examples} - set(labels))
    if split != 'train' and unseen:
      raise ValueError(f'task {task_name!r}: {split} label(s) {unseen[:5]} never occur in '
                       f'train; expected one of {list(labels)}')
  return labels


def _check_examples(task_name: str, split: str, rows: list, where: str) -> list:
  if not rows:
    raise ValueError(f'task {task_name!r}: {split} split ({where}) is empty; expected '
                     'labelled examples')
  out = []
  for i, row in enumerate(rows):
    if 'inputs' in row or 'targets' in row:
      missing = [k for k in ('inputs', 'targets') if row.get(k) in (None, '')]
      keys = ('inputs', 'targets')
    else:
      missing = [k for k in ('text', 'label') if row.get(k) in (None, '')]
      keys = ('text', 'text_pair', 'label')
    if missing:
      raise ValueError(f'{where} row {i}: no {", ".join(missing)} column/value (has '
                       f'{sorted(row)}); expected text [+ text_pair] + label, or inputs + '
                       'targets')
    out.append({k: str(row[k]) for k in keys if row.get(k) not in (None, '')})
  return out


def read_rows(path: str) -> list:
  """Records of one .jsonl / .json (a list of objects) / .csv / .tsv file (header row); a
  malformed line is an error naming the file and its line number."""
  text = paths.resolve(path).read_text('utf-8')
  if path.endswith('.jsonl'):
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
      if line.strip():
        rows.append(_record(path, number, _json(path, line, number)))
    return rows
  if path.endswith('.json'):
    data = _json(path, text)
    if not isinstance(data, list):
      raise ValueError(f'{path}: a JSON {type(data).__name__}; expected a list of objects')
    return [_record(path, None, row, i) for i, row in enumerate(data)]
  if path.endswith(('.csv', '.tsv')):
    reader = csv.DictReader(io.StringIO(text), delimiter='\t' if path.endswith('.tsv') else ',')
    rows = []
    for row in reader:   # a short row fills None, a long one puts the rest under None
      if None in row or None in row.values():
        fields = len(row) - 1 + len(row[None]) if None in row else sum(
            v is not None for v in row.values())
        raise ValueError(f'{path} line {reader.line_num}: {fields} field(s); expected '
                         f'{len(reader.fieldnames)} as in the header {reader.fieldnames}')
      rows.append(row)
    return rows
  raise ValueError(f'{path}: unknown extension; expected one of {EXTENSIONS}')


def _json(path: str, text: str, number=None):
  """json.loads(text); a syntax error names `path` and the line (`number`: a .jsonl line)."""
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    expected = 'one JSON object per line' if number else 'a list of objects'
    raise ValueError(f'{path} line {number or e.lineno}: not valid JSON ({e.msg}, column '
                     f'{e.colno}); expected {expected}') from None


def _record(path: str, number, row, index=None):
  """`row` when it is a JSON object, else an error naming the line (or list item)."""
  if not isinstance(row, dict):
    where = f'line {number}' if number else f'item {index}'
    raise ValueError(f'{path} {where}: a JSON {type(row).__name__}; expected an object with '
                     'text [, text_pair], label or inputs, targets')
  return row


def _split_files(name: str) -> dict:
  if '=' in name:
    files = dict(part.split('=', 1) for part in name.split(','))
  else:
    files = {}
    for split, stems in SPLIT_FILES.items():
      found = [p for s in stems for ext in EXTENSIONS
               for p in paths.glob(str(paths.resolve(name) / f'{s}{ext}'))]
      if found:
        files[split] = found[0]
  for split, path in files.items():
    if not paths.resolve(path).is_file():
      raise FileNotFoundError(f'task {name!r}: {split} file {path!r} does not exist')
  if 'train' not in files or 'validation' not in files:
    raise ValueError(f'task {name!r}: found splits {sorted(files)}; expected a train.* and a '
                     f'validation.* (or dev.*) file with an extension in {EXTENSIONS}')
  return files


def _tfds_task(name: str, data_dir: str) -> Task:
  import tensorflow_datasets as tfds  # noqa: PLC0415 (TensorFlow)

  from pretrain_jax.data import sources  # noqa: PLC0415 (TensorFlow)
  if name in TFDS_SUMMARIES:
    document, summary = TFDS_SUMMARIES[name]
    builder = sources.open_builder(name, data_dir)
    splits = {split: _check_examples(name, split, [
        {'inputs': ex[document].decode('utf-8'), 'targets': ex[summary].decode('utf-8')}
        for ex in tfds.as_numpy(_tfds_split(builder, name, split, data_dir))],
        f'tfds {name} {split}') for split in ('train', 'validation')}
    return Task(name, splits, (), SUMMARY_METRIC, SUMMARY_PREFIX)
  text_key, pair_key, metric, prefix, question = TFDS_TASKS[name]
  builder = sources.open_builder(name, data_dir)
  names = builder.info.features['label'].names if hasattr(
      builder.info.features['label'], 'names') else None
  splits = {}
  for split in ('train', 'validation'):
    rows = []
    for ex in tfds.as_numpy(_tfds_split(builder, name, split, data_dir)):
      if int(ex['label']) < 0:       # GLUE's unlabelled test rows
        continue
      label = names[int(ex['label'])] if names else str(int(ex['label']))
      row = {'text': ex[text_key].decode('utf-8'), 'label': label}
      if pair_key:
        row['text_pair'] = ex[pair_key].decode('utf-8')
      rows.append(row)
    splits[split] = _check_examples(name, split, rows, f'tfds {name} {split}')
  labels = tuple(names) if names else collect_labels(name, splits)
  return Task(name, splits, labels, metric, prefix, question)


def _tfds_split(builder, name: str, split: str, data_dir: str):
  from pretrain_jax.data import sources  # noqa: PLC0415 (TensorFlow)
  try:
    return builder.as_dataset(split=split, shuffle_files=False)
  except AssertionError:    # tfds: "Dataset glue: could not find data in <data_dir>"
    raise sources.not_prepared(name, data_dir, 'config.task.tfds_data_dir') from None


def title_examples() -> dict:
  """The embedded summarisation task: write a section's title from its text.

  The embedded corpus (data/corpus.py, CPython's documentation) has about 200 titled sections
  ('The "if" statement', 'Customizing attribute access'); each becomes `inputs` = the section's
  text (whitespace collapsed; the encoder keeps its first data.seq_len tokens) and `targets` =
  its title, as headline generation (Gigaword) does. A title names what its text is about, so
  its words are in the text, mostly in the first sentence: ROUGE rises as a model learns which
  words to copy, from 0 for a random one. A section the corpus repeats (several topics share it)
  is kept once; 1 in 5 sections is validation (split by a hash of its text).
  """
  splits, seen = {'train': [], 'validation': []}, set()
  for doc in corpus.embedded_documents():
    lines = doc.split('\n')
    if len(lines) < 3 or not corpus.is_underline(lines[1], lines[0]):
      continue
    title, text = lines[0].strip(), ' '.join(' '.join(lines[2:]).split())
    if not text or text in seen:
      continue
    seen.add(text)
    split = 'validation' if zlib.crc32(text.encode()) % 5 == 0 else 'train'
    splits[split].append({'inputs': text, 'targets': title})
  return splits


def word_order_examples(seed: int = 0, window: int = 0) -> dict:
  """The embedded task: is this sentence's word order original, or is one window shuffled?

  Sentences (6-40 words, mostly ordinary words) come from the embedded corpus (data/corpus.py,
  CPython's documentation). Each sentence appears once: with probability 1/2 (a hash of the
  sentence) its words are permuted (never the identity), labelled 'shuffled', else
  'original'. The first and last words stay in place (else a lower-case first word or a
  period mid-sentence would give it away: a from-scratch model reached 0.85 on that cue);
  `window` > 0 permutes only that many consecutive interior words (a harder variant).
  Why it is fair: both classes have exactly the same words, so no keyword or bag-of-words
  feature separates them and length says nothing; only word order does, which is what a
  language model learns and a random network does not know. Train and validation are split by
  DOCUMENT (1 in 8 documents is validation) and a sentence the corpus repeats is kept once, so
  no validation sentence is seen in fine-tuning. The pre-training corpus did contain the
  original text, never with labels; report the from-scratch baseline beside it.
  """
  word = re.compile(r"^[A-Za-z][A-Za-z'-]*[,.;:]?$")
  splits, seen = {'train': [], 'validation': []}, set()
  for d, doc in enumerate(corpus.embedded_documents()):
    split = 'validation' if zlib.crc32(f'doc{d}'.encode()) % 8 == 0 else 'train'
    text = ' '.join(doc.split())
    for sentence in re.split(r'(?<=[.!?])\s+(?=[A-Z])', text):
      words = sentence.split()
      if not 6 <= len(words) <= 40 or sum(bool(word.match(w)) for w in words) < 0.8 * len(words):
        continue
      if sentence in seen:   # the topics repeat some text: each sentence once, in one split
        continue
      seen.add(sentence)
      rng = random.Random(zlib.crc32(f'{seed}:{sentence}'.encode()))
      label = 'original'
      if rng.random() < 0.5:
        size = min(window or len(words) - 2, len(words) - 2)
        start = rng.randrange(1, len(words) - size)
        part = words[start:start + size]
        for _ in range(10):
          shuffled = rng.sample(part, len(part))
          if shuffled != part:
            words = words[:start] + shuffled + words[start + size:]
            label = 'shuffled'
            break
      splits[split].append({'text': ' '.join(words), 'label': label})
  for examples in splits.values():
    random.Random(seed).shuffle(examples)
  return splits


def load_task(name: str, *, tfds_data_dir: str = '', seed: int = 0) -> Task:
  """The Task called `name` (see the module docstring)."""
  if not name:
    raise ValueError("task ''; expected 'word_order', a tfds name like 'glue/sst2', a "
                     'directory with train.* and validation.* files, or train=FILE,'
                     'validation=FILE')
  if name == EMBEDDED:
    splits = word_order_examples(seed)
    return Task(name, splits, ('original', 'shuffled'), 'accuracy', 'word order', 'Word order')
  if name == EMBEDDED_SUMMARIES:
    return Task(name, title_examples(), (), SUMMARY_METRIC, SUMMARY_PREFIX)
  if name in TFDS_TASKS or name in TFDS_SUMMARIES:
    return _tfds_task(name, tfds_data_dir)
  if '=' not in name and not paths.is_remote(name) and not (name and paths.resolve(name).exists()):
    raise ValueError(f'task {name!r} is not a directory and not a known task; expected '
                     f'{EMBEDDED!r}, {EMBEDDED_SUMMARIES!r}, a tfds task (one of '
                     f'{sorted(TFDS_TASKS) + sorted(TFDS_SUMMARIES)}), a directory '
                     'with train.* and validation.* files, or train=FILE,validation=FILE')
  files = _split_files(name)
  splits = {split: _check_examples(name, split, read_rows(path), path)
            for split, path in files.items()}
  kinds = {'targets' in s[0] for s in splits.values()}
  if len(kinds) > 1:
    raise ValueError(f'task {name!r}: some splits are text-to-text (inputs/targets) and some '
                     'classification (text/label); expected one kind')
  labels = () if kinds == {True} else collect_labels(name, splits)
  return Task(name.rstrip('/').rsplit('/', 1)[-1] or name, splits, labels,
              'accuracy' if labels else SUMMARY_METRIC)
