"""Tokenized documents of one data stream's share of a split, with their position in it.

A position is (epoch, doc): `doc` counts every document of the epoch's shuffled sequence
(including skipped ones), so restarting at (epoch, doc) is `text_dataset(..., skip=doc)` --
the skip happens on strings, before tokenization. Tokenization runs inside tf.data: documents
are batched and encoded by the tokenizer (sentencepiece, or a Hugging Face adapter) in
`num_parallel_calls` parallel calls, prefetched.

Documents that are not valid UTF-8 or that tokenize to nothing are skipped, counted in `stats`
and logged. An epoch that starts at its beginning and yields no token is an error (otherwise a
repeating pipeline would spin forever).
"""
import collections
import functools
import itertools
import logging

import numpy as np
import tensorflow as tf

from pretrain_jax.data import sources
from pretrain_jax.data import tokenizer as tokenizer_lib

log = logging.getLogger(__name__)
DOCS_PER_CALL = 64  # documents per sentencepiece call: amortises the tf <-> python hop
CHAIN_BELOW_DOCS = 100_000  # stream shares smaller than this chain epochs in one pipeline...
MAX_CHAINED_EPOCHS = 32     # ...up to this many (cheap for an in-memory share)
# No tf.data autotuning: each stream's pipeline would run its own model thread, whose CPU a
# small host misses (the tokenizer calls hold the GIL, so there is little to tune), and
# deleting a pipeline waits for that thread, so every run's end would wait for each stream's.
_OPTIONS = tf.data.Options()
_OPTIONS.autotune.enabled = False


def _unk_id(tokenizer):
  try:
    return tokenizer.unk_id
  except (AttributeError, ValueError):   # GPT-2's byte-level BPE has none
    return None


def _encoder(tokenizer):
  # The project's Tokenizer encodes a list in one sentencepiece call; others one by one.
  encode_list = getattr(tokenizer, 'encode_batch', None) or (
      lambda strings: [tokenizer.encode(t) for t in strings])
  # Ids the objectives put in themselves (EOS, [CLS]/[SEP]/[MASK], T5's sentinels) that a
  # document's text spells out ('<extra_id_0>' is a piece of a tokenizer trained here and of
  # T5's Hugging Face tokenizer): as <unk>, or dropped where there is none. Kept, a literal
  # sentinel is a second <extra_id_0> in span corruption's inputs that the target cannot name.
  special, unk = tokenizer_lib.id_tables(tokenizer).special, _unk_id(tokenizer)
  if unk is not None and special[unk]:  # GPT-2 folders saved by transformers: unk = EOS
    unk = None

  def encode(texts):
    """(n,) bytes -> flat ids, lengths (n,), status (n,) 0 ok / 1 invalid UTF-8."""
    strings, status = [], np.zeros(len(texts), np.int32)
    for i, raw in enumerate(texts):
      try:
        strings.append(raw.decode('utf-8'))
      except UnicodeDecodeError:
        strings.append('')
        status[i] = 1
    ids = encode_list(strings)
    lengths = np.fromiter(map(len, ids), np.int32, len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(lengths.sum()))
    spelled = special[flat]
    if spelled.any():
      if unk is not None:
        flat[spelled] = unk
      else:
        doc = np.repeat(np.arange(len(ids)), lengths)
        lengths -= np.bincount(doc[spelled], minlength=len(ids)).astype(np.int32)
        flat = flat[~spelled]
    return flat, lengths, status

  return encode


class DocumentStream:
  """Iterates (epoch, doc, tokens) over one stream's share of a split, epoch after epoch.

  A small share (the embedded corpus, a validation split) is read as several epochs chained in
  ONE tf.data pipeline, so TensorFlow prefetches across epoch boundaries instead of the stream
  stalling on every epoch's start-up (file open, shuffle-buffer fill); each epoch keeps its
  own seeds, so the documents are the same either way. The chains grow from one epoch (1, 2,
  4, ... up to `chain`): building an epoch's datasets costs milliseconds, and a read that ends
  within the first epochs (an evaluation, a short run) builds no more than it reads.
  """

  def __init__(self, source, split: str, tokenizer, *, process_index: int, process_count: int,
               seed: int, shuffle_buffer: int, num_parallel_calls: int, repeat: bool, stats):
    self.source, self.split, self.repeat, self.stats = source, split, repeat, stats
    self.kwargs = dict(process_index=process_index, process_count=process_count, seed=seed,
                       shuffle_buffer=shuffle_buffer)
    self.encode = _encoder(tokenizer)
    self.parallel = tf.data.AUTOTUNE if num_parallel_calls in (-1, None) else num_parallel_calls
    source.check_split(split)
    share = source.num_examples(split) // process_count
    self.chain = max(1, min(MAX_CHAINED_EPOCHS, CHAIN_BELOW_DOCS // max(share, 1))) \
        if repeat else 1

  def _pipeline(self, epochs: list, skip: int, per_call: int) -> tf.data.Dataset:
    """(epoch, flat ids, lengths, status) per DOCS_PER_CALL documents of `epochs` in order."""
    # Each epoch's batches are tagged by a zip, and ONE map over the chain encodes them: a map
    # traces its function when the dataset is built, and a trace per chained epoch costs more
    # than reading a small share.
    parts = []
    for i, epoch in enumerate(epochs):
      ds = sources.text_dataset(self.source, self.split, epoch=epoch, skip=skip if i == 0 else 0,
                                **self.kwargs)
      parts.append(tf.data.Dataset.zip(
          tf.data.Dataset.from_tensors(np.int32(epoch)).repeat(), ds.batch(per_call)))
    chain = functools.reduce(lambda a, b: a.concatenate(b), parts)
    return chain.map(
        lambda e, t: (e, *tf.numpy_function(self.encode, [t], (tf.int32, tf.int32, tf.int32),
                                            stateful=False)),
        num_parallel_calls=self.parallel,
        deterministic=True).prefetch(tf.data.AUTOTUNE).with_options(_OPTIONS)

  def _read(self, epochs: list, skip: int, stats, produced: dict, per_call=DOCS_PER_CALL):
    doc, current = skip, epochs[0]
    for epoch, flat, lengths, status in self._pipeline(epochs, skip, per_call).as_numpy_iterator():
      if epoch != current:
        doc, current = 0, epoch
      ends = np.cumsum(lengths)
      for tokens, length, bad in zip(np.split(flat, ends[:-1]), lengths, status, strict=True):
        if bad:
          produced[epoch, 'invalid'] += 1
          stats['skipped_invalid_utf8'] += 1
          if stats['skipped_invalid_utf8'] <= 3:
            log.warning('%s: skipping document %d of epoch %d: invalid UTF-8',
                        self.source.description, doc, epoch)
        elif length == 0:
          produced[epoch, 'empty'] += 1
          stats['skipped_empty'] += 1
          if stats['skipped_empty'] <= 3:
            log.warning('%s: skipping document %d of epoch %d: it tokenizes to nothing',
                        self.source.description, doc, epoch)
        else:
          stats['documents'] += 1
          produced[epoch, 'documents'] += 1
          yield int(epoch), doc, tokens
        doc += 1

  def documents(self, epoch: int = 0, doc: int = 0):
    """(epoch, doc, tokens (n,) int32) from position (epoch, doc) on."""
    group = 1
    while True:
      epochs, produced = list(range(epoch, epoch + min(group, self.chain))), collections.Counter()
      yield from self._read(epochs, doc, self.stats, produced)
      for e in epochs:
        if not produced[e, 'documents'] and (e > epoch or doc == 0):
          raise ValueError(
              f'split {self.split!r} of {self.source.description} (stream share '
              f'{self.kwargs["process_index"]}/{self.kwargs["process_count"]}) has no document '
              f'with any token: skipped {produced[e, "empty"]} that tokenize to nothing, '
              f'{produced[e, "invalid"]} with invalid UTF-8')
      if not self.repeat:
        return
      epoch, doc, group = epoch + len(epochs), 0, group * 2

  def first_document(self, epoch: int):
    """(doc, tokens) of the first non-empty document of `epoch` (NSP: the last one's partner)."""
    # One document a call: tokenizing a whole call of 64 to use one would dominate NSP's cost
    # with small stream shares.
    for _, doc, tokens in self._read([epoch], 0, collections.Counter(), collections.Counter(),
                                     per_call=1):
      return doc, tokens
    return None, None
