"""make_dataset: config.data -> a resumable iterator of per-host numpy batches.

    source (tfds) -> host share -> seeded per-epoch shuffle -> [skip on resume] -> sentencepiece
    in parallel tf.data calls -> objective + packing (batches.py) -> batch-level MLM
    -> background prefetch thread -> dict of (batch_size, ...) numpy arrays (DESIGN.md keys)

Determinism and resume: everything above is a pure function of (seed, epoch, position), so the
state is tiny: the stream position (epoch, doc, token offset) of the first token not yet in a
consumed batch plus the number of batches consumed (which seeds MLM masking). Restoring skips
`doc` documents as STRINGS, before tokenization, and `offset` tokens of the first document; no
earlier batch is rebuilt. The skip still reads those records and refills the shuffle buffer
(tf.data cannot seek into a shuffled stream), so resuming deep into a large epoch costs reading,
not tokenizing, that many documents. A resumed iterator yields exactly the batches an
uninterrupted one would.

BERT rows without NSP are packed documents, each piece wrapped as [CLS] ... [SEP] (token type
0); with NSP each row is one [CLS] A [SEP] B [SEP] pair. CLM and T5 conventions: see
objectives/clm.py and objectives/span_corruption.py.
"""
import atexit
import collections
import logging
import queue
import threading
import weakref
import zlib

import numpy as np

from pretrain_jax.data import batches, documents, sources
from pretrain_jax.data import tokenizer as tokenizer_lib
from pretrain_jax.objectives import clm, mlm, span_corruption

log = logging.getLogger(__name__)
OBJECTIVES = ('clm', 'mlm', 'span_corruption')
STATE_VERSION = 1
_LIVE = weakref.WeakSet()  # iterators whose prefetch threads are stopped at exit


@atexit.register
def _stop_all():
  for it in list(_LIVE):
    it.close()


def host_batch_size(global_batch_size: int, process_count: int) -> int:
  """Per-host share of the global batch; each host feeds `global // process_count` rows."""
  if global_batch_size % process_count:
    raise ValueError(f'global batch_size={global_batch_size} does not split over '
                     f'{process_count} hosts; expected a multiple of {process_count}')
  return global_batch_size // process_count


def assemble_global_batch(host_batches: list) -> dict:
  """Concatenate per-host batches in process-index order into the global batch (rows)."""
  return {k: np.concatenate([b[k] for b in host_batches], axis=0) for k in host_batches[0]}


def check_lengths(data_config, tokenizer, model_max_len: int | None = None) -> dict:
  """Validate the sequence lengths and special tokens the objective needs; returns lengths.

  Raises ValueError naming the bad value (too short for the objective, longer than the model
  holds, more T5 spans than sentinels) or the missing special piece.
  """
  objective, seq_len = data_config.objective, int(data_config.seq_len)
  if objective not in OBJECTIVES:
    raise ValueError(f'config.data.objective={objective!r}; expected one of {OBJECTIVES}')
  if data_config.nsp and objective != 'mlm':
    raise ValueError(f'config.data.nsp=True needs objective mlm; got {objective!r}')
  if model_max_len is not None and seq_len > model_max_len:
    raise ValueError(f'config.data.seq_len={seq_len} is longer than the model holds '
                     f'(max_len={model_max_len})')
  minimum = {'clm': 2, 'mlm': 5 if data_config.nsp else 3, 'span_corruption': 3}[objective]
  if seq_len < minimum:
    raise ValueError(f'config.data.seq_len={seq_len} is too short for {objective}'
                     f'{" with NSP" if data_config.nsp else ""}; expected >= {minimum}')
  lengths = {'seq_len': seq_len}
  if objective == 'mlm':
    _ = tokenizer.mask_id, tokenizer.cls_id, tokenizer.sep_id  # raise naming a missing piece
  if objective == 'span_corruption':
    raw_len, target_len = span_corruption.target_length(
        seq_len, data_config.noise_density, data_config.mean_noise_span_length)
    spans = span_corruption.max_spans(raw_len, data_config.noise_density,
                                      data_config.mean_noise_span_length)
    num_sentinels = tokenizer_lib.id_tables(tokenizer).num_sentinels
    if spans > num_sentinels:
      raise ValueError(f'config.data.seq_len={seq_len} makes up to {spans} noise spans but the '
                       f'tokenizer has {num_sentinels} sentinels; shorten seq_len or '
                       'raise mean_noise_span_length')
    if model_max_len is not None and target_len > model_max_len:
      raise ValueError(f'T5 target length {target_len} exceeds the model max_len '
                       f'{model_max_len}')
    lengths.update(raw_len=raw_len, target_len=target_len)
  return lengths


class DataIterator:
  """Iterator of batches with `get_state()` / `set_state()`; batches are prefetched by a thread.

  `stats` counts documents and skipped records as they are READ (the prefetch thread may be
  ahead of the consumer), and batches and real (non-pad) tokens as they are RETURNED.
  """

  def __init__(self, produce, identity: dict, prefetch: int):
    self._produce, self._identity, self._prefetch = produce, identity, max(int(prefetch), 1)
    self._state = dict(identity, version=STATE_VERSION, epoch=0, doc=0, offset=0, batches=0,
                       exhausted=False)
    self._thread = None
    self.stats = collections.Counter()

  # -- state --------------------------------------------------------------------------------
  def get_state(self) -> dict:
    """JSON-serializable position after the last batch returned by __next__."""
    return dict(self._state)

  def set_state(self, state: dict) -> None:
    """Continue from `state` (from get_state of an iterator made with the same arguments)."""
    for key, value in self._identity.items():
      if state.get(key) != value:
        raise ValueError(f'data iterator state has {key}={state.get(key)!r} but this iterator '
                         f'has {key}={value!r}; it was saved by a differently configured pipeline')
    if state.get('version') != STATE_VERSION:
      raise ValueError(f'data iterator state version {state.get("version")!r}; expected '
                       f'{STATE_VERSION}')
    self._stop()
    self._state = dict(state)

  # -- iteration ----------------------------------------------------------------------------
  def __iter__(self):
    return self

  def __next__(self) -> dict:
    if self._state['exhausted']:
      raise StopIteration
    if self._thread is None:
      self._start()
    item = self._queue.get()
    if item is None:
      self._state = dict(self._state, exhausted=True)
      raise StopIteration
    if isinstance(item, BaseException):
      self._thread = None
      raise item
    batch, state = item
    self._state = state
    self._count(batch)
    return batch

  def _count(self, batch):
    seg = batch.get('segment_ids', batch.get('encoder_segment_ids'))
    self.stats['batches'] += 1
    if seg is None:   # a batch without token rows (e.g. labels only): nothing to count
      return
    self.stats['real_tokens'] += int(np.count_nonzero(seg))
    self.stats['tokens'] += seg.size
    if 'decoder_segment_ids' in batch:
      self.stats['decoder_real_tokens'] += int(np.count_nonzero(batch['decoder_segment_ids']))
      self.stats['decoder_tokens'] += batch['decoder_segment_ids'].size
    if self.stats['batches'] % 1000 == 0:
      log.info('data: %d batches, real-token fraction %.3f, %s', self.stats['batches'],
               self.real_fraction, dict(self.stats))

  @property
  def real_fraction(self) -> float:
    """Share of non-padding positions in the batches returned so far (encoder for T5)."""
    return self.stats['real_tokens'] / max(self.stats['tokens'], 1)

  def _start(self):
    self._queue = queue.Queue(self._prefetch)
    self._stop_event = threading.Event()
    self._thread = threading.Thread(target=self._work, args=(dict(self._state), self._queue,
                                                             self._stop_event), daemon=True)
    self._thread.start()
    _LIVE.add(self)

  def _work(self, state, out, stop):
    def put(item):
      while not stop.is_set():
        try:
          out.put(item, timeout=0.1)
          return True
        except queue.Full:
          pass
      return False

    try:
      for item in self._produce(state, self.stats):
        if not put(item):
          return
      put(None)
    except BaseException as e:  # handed to the consumer, raised by __next__
      put(e)

  def _stop(self):
    if self._thread is not None:
      self._stop_event.set()
      self._thread.join()
      self._thread = None

  def close(self):
    self._stop()

  def __del__(self):
    try:
      self._stop()
    except Exception:  # interpreter shutdown
      pass


def make_dataset(data_config, tokenizer, *, split: str, batch_size: int, process_index: int = 0,
                 process_count: int = 1, seed: int | None = None, repeat: bool = True,
                 model_max_len: int | None = None) -> DataIterator:
  """Per-host batches of `split` for `data_config.objective` (keys and shapes: DESIGN.md).

  Args:
    data_config: config.data.
    tokenizer: from load_tokenizer (its vocabulary must be the model's).
    split: tfds split name, e.g. data_config.train_split or data_config.eval_split.
    batch_size: rows per host (host_batch_size(global, process_count)).
    process_index, process_count: this host reads share process_index of process_count.
    seed: data order and masking seed (default data_config.seed).
    repeat: cycle over epochs (each reshuffled); False ends after one epoch, the last batch
      filled with all-padding rows (dropped instead with NSP).
    model_max_len: if given, seq_len (and T5's target length) must fit in it.
  Returns:
    DataIterator of dicts of numpy arrays (batch_size, seq_len); T5 decoder features
    (batch_size, target_len) with target_len from span_corruption.target_length.
  """
  if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
    raise ValueError(f'batch_size={batch_size!r}; expected a positive integer')
  lengths = check_lengths(data_config, tokenizer, model_max_len)
  seed = data_config.seed if seed is None else seed
  if not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f'data seed={seed!r}; expected a non-negative integer')
  source = sources.open_source(data_config)
  source.check_split(split)
  salt = (zlib.crc32(split.encode()), process_index)
  identity = dict(split=split, seed=int(seed), objective=data_config.objective,
                  seq_len=lengths['seq_len'], batch_size=int(batch_size),
                  process_index=int(process_index), process_count=int(process_count))
  objective, nsp = data_config.objective, bool(data_config.nsp)
  tables = tokenizer_lib.id_tables(tokenizer)
  if data_config.objective == 'mlm' and data_config.whole_word_mask and tables.word_start is None:
    raise ValueError('config.data.whole_word_mask needs word boundaries, which this tokenizer '
                     f'({type(tokenizer).__name__}) does not provide; use a sentencepiece model')

  def produce(state, stats):
    stream = documents.DocumentStream(
        source, split, tokenizer, process_index=process_index, process_count=process_count,
        seed=seed, shuffle_buffer=data_config.shuffle_buffer,
        num_parallel_calls=data_config.num_parallel_calls, repeat=repeat, stats=stats)
    docs = stream.documents(state['epoch'], state['doc'])
    common = dict(batch_size=batch_size, seq_len=lengths['seq_len'])
    if objective == 'clm':
      gen = batches.clm_batches(docs, state['offset'], pack=data_config.pack,
                                eos_id=tokenizer.eos_id, **common)
    elif objective == 'span_corruption':
      gen = batches.span_corruption_batches(
          docs, state['offset'], pack=data_config.pack, seed=seed, salt=salt,
          first_sentinel=tokenizer.sentinel_id(0), eos_id=tokenizer.eos_id,
          noise_density=data_config.noise_density,
          mean_noise_span_length=data_config.mean_noise_span_length, **common)
    elif nsp:
      gen = batches.nsp_batches(docs, state['offset'], seed=seed, salt=salt,
                                cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id,
                                first_document=stream.first_document, **common)
    else:
      gen = batches.bert_batches(docs, state['offset'], pack=data_config.pack,
                                 cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id, **common)
    count = state['batches']
    for arrays, position in gen:
      if objective == 'clm':
        arrays['loss_weights'] = clm.loss_weights(arrays['segment_ids'])
      elif objective == 'span_corruption':
        arrays['decoder_loss_weights'] = clm.loss_weights(arrays['decoder_segment_ids'])
      else:
        arrays = _apply_mlm(arrays, tokenizer, tables, data_config,
                            batches.rng_at(seed, *salt, batches.SALT_MLM, count))
      count += 1
      epoch, doc, offset = position if position is not None else (0, 0, 0)
      yield arrays, dict(state, epoch=epoch, doc=doc, offset=offset, batches=count,
                         exhausted=position is None)

  return DataIterator(produce, identity, data_config.prefetch)


def _apply_mlm(arrays, tokenizer, tables, data_config, rng) -> dict:
  """Batch-level MLM corruption on packed/NSP rows; adds token_type_ids when absent."""
  special, ordinary_ids, word_start = tables.special, tables.ordinary_ids, tables.word_start
  tokens, segment_ids = arrays['inputs'], arrays['segment_ids']
  selectable = ~special[tokens] & (segment_ids > 0)
  word_starts = None
  if data_config.whole_word_mask:
    word_starts = word_start[tokens] | (arrays['positions'] == 0)
  out = mlm.mask_tokens(tokens, rng, selectable=selectable, random_ids=ordinary_ids,
                        mask_id=tokenizer.mask_id, probability=data_config.mlm_probability,
                        word_starts=word_starts)
  result = {'inputs': out['inputs'], 'targets': out['targets'], 'segment_ids': segment_ids,
            'positions': arrays['positions'], 'loss_weights': out['loss_weights'],
            'token_type_ids': arrays.get('token_type_ids', np.zeros_like(tokens))}
  if 'nsp_labels' in arrays:
    result['nsp_labels'] = arrays['nsp_labels']
  return result
