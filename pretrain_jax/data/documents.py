"""Tokenized documents of one host's share, with their position in the stream.

A position is (epoch, doc): `doc` counts every document of the epoch's shuffled sequence
(including skipped ones), so restarting at (epoch, doc) is `text_dataset(..., skip=doc)` --
the skip happens on strings, before tokenization. Tokenization runs inside tf.data: documents
are batched and encoded by sentencepiece in `num_parallel_calls` parallel calls, prefetched.

Documents that are not valid UTF-8 or that tokenize to nothing are skipped, counted in `stats`
and logged. An epoch that starts at its beginning and yields no token is an error (otherwise a
repeating pipeline would spin forever).
"""
import collections
import itertools
import logging

import numpy as np
import tensorflow as tf

from pretrain_jax.data import sources

log = logging.getLogger(__name__)
DOCS_PER_CALL = 64  # documents per sentencepiece call: amortises the tf <-> python hop


def _encoder(tokenizer):
  sp = tokenizer.sp

  def encode(texts):
    """(n,) bytes -> flat ids, lengths (n,), status (n,) 0 ok / 1 invalid UTF-8."""
    strings, status = [], np.zeros(len(texts), np.int32)
    for i, raw in enumerate(texts):
      try:
        strings.append(raw.decode('utf-8'))
      except UnicodeDecodeError:
        strings.append('')
        status[i] = 1
    ids = sp.encode(strings)
    lengths = np.fromiter(map(len, ids), np.int32, len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(lengths.sum()))
    return flat, lengths, status

  return encode


class DocumentStream:
  """Iterates (epoch, doc, tokens) over one host's share of a split, epoch after epoch."""

  def __init__(self, source, split: str, tokenizer, *, process_index: int, process_count: int,
               seed: int, shuffle_buffer: int, num_parallel_calls: int, repeat: bool, stats):
    self.source, self.split, self.repeat, self.stats = source, split, repeat, stats
    self.kwargs = dict(process_index=process_index, process_count=process_count, seed=seed,
                       shuffle_buffer=shuffle_buffer)
    self.encode = _encoder(tokenizer)
    self.parallel = tf.data.AUTOTUNE if num_parallel_calls in (-1, None) else num_parallel_calls
    source.check_split(split)

  def _epoch(self, epoch: int, skip: int, stats=None):
    stats = self.stats if stats is None else stats
    ds = sources.text_dataset(self.source, self.split, epoch=epoch, skip=skip, **self.kwargs)
    ds = ds.batch(DOCS_PER_CALL).map(
        lambda t: tf.numpy_function(self.encode, [t], (tf.int32, tf.int32, tf.int32),
                                    stateful=False),
        num_parallel_calls=self.parallel, deterministic=True).prefetch(tf.data.AUTOTUNE)
    doc = skip
    for flat, lengths, status in ds.as_numpy_iterator():
      ends = np.cumsum(lengths)
      for tokens, length, bad in zip(np.split(flat, ends[:-1]), lengths, status):
        if bad:
          stats['skipped_invalid_utf8'] += 1
          if stats['skipped_invalid_utf8'] <= 3:
            log.warning('%s: skipping document %d of epoch %d: invalid UTF-8',
                        self.source.description, doc, epoch)
        elif length == 0:
          stats['skipped_empty'] += 1
          if stats['skipped_empty'] <= 3:
            log.warning('%s: skipping document %d of epoch %d: it tokenizes to nothing',
                        self.source.description, doc, epoch)
        else:
          stats['documents'] += 1
          yield doc, tokens
        doc += 1

  def documents(self, epoch: int = 0, doc: int = 0):
    """(epoch, doc, tokens (n,) int32) from position (epoch, doc) on."""
    while True:
      produced = 0
      for d, tokens in self._epoch(epoch, doc):
        produced += 1
        yield epoch, d, tokens
      if produced == 0 and doc == 0:
        raise ValueError(
            f'split {self.split!r} of {self.source.description} (host share '
            f'{self.kwargs["process_index"]}/{self.kwargs["process_count"]}) has no document '
            f'with any token: skipped {self.stats["skipped_empty"]} that tokenize to nothing, '
            f'{self.stats["skipped_invalid_utf8"]} with invalid UTF-8')
      if not self.repeat:
        return
      epoch, doc = epoch + 1, 0

  def first_document(self, epoch: int):
    """(doc, tokens) of the first non-empty document of `epoch` (NSP: the last one's partner)."""
    for doc, tokens in self._epoch(epoch, 0, stats=collections.Counter()):
      return doc, tokens
    return None, None
