"""Task examples -> fixed-length batches in a family's layout, behind pre-training's DataIterator.

The layout is the family record's TaskLayout (models/family.py), whose facts encode reads; the
three families' (all (B, T) int32 unless noted; a padding row has segment ids 0 and label -1):
  bert  inputs = [CLS] text [SEP] (pair [SEP]), token_type_ids 0 / 1 for the pair, segment_ids,
        positions, labels (B,)
  gpt   inputs = text EOS (pair EOS): the last real token (EOS) has read the whole row;
        segment_ids, positions, labels (B,)
  t5    the span-corruption keys (DESIGN.md) with `inputs` + EOS in the encoder and
        `targets` + EOS as decoder targets (teacher forcing), decoder_loss_weights on targets
Inputs longer than `seq_len` are truncated (longest part first) and counted in
`Encoded.truncated`; T5 targets longer than `target_len` are refused (a cut label would be a
different label).
"""
import dataclasses
import sys
import zlib

import numpy as np

from pretrain_jax.data import pipeline


@dataclasses.dataclass
class Encoded:
  rows: dict        # key -> (N, ...) array of every example
  truncated: int    # examples whose input was cut to fit seq_len


def _truncate(a: list, b: list, budget: int):
  a, b = list(a), list(b)
  while len(a) + len(b) > budget:
    (a if len(a) >= len(b) else b).pop()
  return a, b


def label_forms(tokenizer, labels) -> tuple:
  """Each label as T5 reads it back: decode(encode(label)), whitespace-stripped. A decoded
  prediction is the class whose form it equals; the label itself may not survive the round
  trip (' neg' from a `text, label` CSV row decodes to 'neg'; 'café' to 'caf ⁇' where the
  vocabulary lacks 'é'). Labels whose forms coincide could not be told apart: refused."""
  forms = tuple(tokenizer.decode(tokenizer.encode(label)).strip() for label in labels)
  seen = {}
  for label, form in zip(labels, forms, strict=True):
    if form in seen:
      raise ValueError(f'labels {seen[form]!r} and {label!r} both read back as {form!r} '
                       'through the tokenizer, so T5 could not tell them apart; expected labels '
                       'the tokenizer keeps distinct (rename them, e.g. in the task files)')
    seen[form] = label
  return forms


def first_examples(task, split: str, max_examples: int = 0) -> list:
  """The first `max_examples` of `split` (0 = all), with a warning on stderr when they miss a
  label the split has (a file sorted by label)."""
  examples = task.splits[split][:max_examples or None]
  if max_examples and task.labels:
    kept, whole = ({e.get('label') for e in rows} for rows in (examples, task.splits[split]))
    if kept != whole:   # e.g. a file sorted by label
      print(f'warning: the first {len(examples)} {split} examples of task {task.name!r} hold '
            f'{len(kept & whole)} of its {len(whole)} labels (missing: '
            f'{sorted(whole - kept)[:5]}); the file may be sorted by label: shuffle it to '
            'train on a sample of every class', file=sys.stderr, flush=True)
  return examples


def encode(task, split: str, tokenizer, layout, seq_len: int, target_len: int = 0,
           max_examples: int = 0) -> Encoded:
  """Every example of `split` (the first `max_examples`; 0 = all) as arrays in a family's
  layout (`layout`: its record's models.family.TaskLayout); class labels are indices into
  task.labels."""
  examples = first_examples(task, split, max_examples)
  n, truncated = len(examples), 0
  def zeros(*shape):
    return np.zeros((n,) + shape, np.int32)
  if layout.text_to_text:
    if not target_len:
      raise ValueError('data.target_len=0; expected the decoder length for T5 targets')
    if seq_len < 2:
      raise ValueError(f'data.seq_len={seq_len} leaves no room for text beside T5\'s EOS; '
                       'expected at least 2')
    rows = {k: zeros(seq_len) for k in ('encoder_input_tokens', 'encoder_segment_ids',
                                        'encoder_positions')}
    rows.update({k: zeros(target_len) for k in ('decoder_input_tokens', 'decoder_target_tokens',
                                                 'decoder_segment_ids', 'decoder_positions')})
    for i, ex in enumerate(examples):
      ex = task.t5_example(ex)
      ids = tokenizer.encode(ex['inputs'])
      if len(ids) + 1 > seq_len:
        ids, truncated = ids[:seq_len - 1], truncated + 1
      ids = ids + [tokenizer.eos_id]
      target = tokenizer.encode(ex['targets']) + [tokenizer.eos_id]
      if len(target) > target_len:
        raise ValueError(f'{split} example {i}: target {ex["targets"][:40]!r} is {len(target)} '
                         f'tokens with EOS; expected at most data.target_len={target_len} '
                         '(raise it; targets are never cut)')
      rows['encoder_input_tokens'][i, :len(ids)] = ids
      rows['encoder_segment_ids'][i, :len(ids)] = 1
      rows['encoder_positions'][i, :len(ids)] = np.arange(len(ids))
      rows['decoder_target_tokens'][i, :len(target)] = target
      rows['decoder_input_tokens'][i, 1:len(target)] = target[:-1]
      rows['decoder_segment_ids'][i, :len(target)] = 1
      rows['decoder_positions'][i, :len(target)] = np.arange(len(target))
    rows['decoder_loss_weights'] = (rows['decoder_segment_ids'] > 0).astype(np.float32)
    if task.labels:
      label_forms(tokenizer, task.labels)                  # refuses labels T5 cannot tell apart
      index = {label: c for c, label in enumerate(task.labels)}
      rows['class_ids'] = np.array([index[e['label']] for e in examples], np.int32)
    return Encoded(rows, truncated)

  pairs = any(e.get('text_pair') is not None for e in examples)
  specials = layout.specials(pairs)
  if seq_len <= specials:
    raise ValueError(f'data.seq_len={seq_len} leaves no room for text beside the {specials} '
                     f'special tokens per {"pair" if pairs else "example"}; expected at least '
                     f'{specials + 1}')
  rows = {k: zeros(seq_len) for k in ('inputs', 'segment_ids', 'positions')}
  if layout.token_types:
    rows['token_type_ids'] = zeros(seq_len)
  index = {label: c for c, label in enumerate(task.labels)}
  rows['labels'] = np.array([index[e['label']] for e in examples], np.int32)
  begin = [getattr(tokenizer, name) for name in layout.begin]
  end = getattr(tokenizer, layout.end)
  for i, ex in enumerate(examples):
    a = tokenizer.encode(ex['text'])
    b = tokenizer.encode(ex['text_pair']) if ex.get('text_pair') is not None else None
    cut_a, cut_b = _truncate(a, b or [], seq_len - layout.specials(b is not None))
    truncated += (len(cut_a), len(cut_b)) != (len(a), len(b or []))
    ids = begin + cut_a + [end]
    types = [0] * len(ids)
    if b is not None:
      ids += cut_b + [end]
      types += [1] * (len(cut_b) + 1)
    if layout.token_types:
      rows['token_type_ids'][i, :len(ids)] = types
    rows['inputs'][i, :len(ids)] = ids
    rows['segment_ids'][i, :len(ids)] = 1
    rows['positions'][i, :len(ids)] = np.arange(len(ids))
  return Encoded(rows, truncated)


def _take(rows: dict, index: np.ndarray, batch_size: int) -> dict:
  """Rows `index` padded to `batch_size` with empty rows (segment ids 0, label -1)."""
  out = {}
  for k, v in rows.items():
    part = v[index]
    pad = np.full((batch_size - len(index),) + v.shape[1:], -1 if k in ('labels', 'class_ids')
                  else 0, v.dtype)
    out[k] = np.concatenate([part, pad])
  return out


def make_task_dataset(encoded: Encoded, *, split: str, batch_size: int, seed: int = 0,
                      repeat: bool = True, process_index: int = 0, process_count: int = 1,
                      keys=None) -> pipeline.DataIterator:
  """Batches of `encoded` with get_state/set_state (pre-training's DataIterator).

  repeat=True: endless, each epoch in a new order from (seed, epoch), batches may span epochs.
  repeat=False: one pass in order, the last batch padded with empty rows. Host `process_index`
  reads rows process_index::process_count. `keys`: the batch keys to emit (default all).
  """
  rows = {k: v[process_index::process_count] for k, v in encoded.rows.items()
          if keys is None or k in keys}
  n = len(next(iter(rows.values())))
  if n == 0:
    raise ValueError(f'{split}: no examples for host {process_index} of {process_count}')
  salt = zlib.crc32(split.encode())

  def order(epoch):
    if not repeat:
      return np.arange(n)
    return np.random.default_rng([seed, salt, epoch]).permutation(n)

  def produce(state, stats):   # one data stream ('0'): pipeline.DataIterator's state layout
    del stats
    position = state['streams']['0']
    epoch, pos = position['epoch'], position['doc']
    perm = order(epoch)
    while True:
      index = []
      while len(index) < batch_size:
        if pos == n:
          if not repeat:
            break
          epoch, pos, perm = epoch + 1, 0, order(epoch + 1)
        take = min(batch_size - len(index), n - pos)
        index.extend(perm[pos:pos + take])
        pos += take
      if not index:
        return
      position = dict(position, epoch=epoch, doc=pos, batches=position['batches'] + 1)
      yield _take(rows, np.asarray(index), batch_size), dict(state, streams={'0': position})
      if not repeat and pos == n:
        return

  identity = dict(split=split, seed=int(seed), objective='task', seq_len=int(
      rows[next(iter(rows))].shape[-1]) if rows[next(iter(rows))].ndim > 1 else 0,
      batch_size=int(batch_size), process_index=int(process_index),
      process_count=int(process_count), num_streams=1)
  return pipeline.DataIterator(produce, identity, range(1), prefetch=2)
