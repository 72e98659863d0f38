"""make_dataset: config.data -> a resumable iterator of per-host numpy batches.

    source (tfds) -> stream share (S streams, streams.py) -> seeded per-epoch shuffle
    -> [skip on resume] -> sentencepiece in parallel tf.data calls -> objective + packing
    (batches.py) -> batch-level MLM -> this host's streams side by side
    -> background prefetch thread -> dict of (batch_size, ...) numpy arrays (DESIGN.md keys)

Streams, not hosts: the global batch is S = config.data.num_streams streams of B/S rows each,
stream s reading its own share of the split; a host produces the streams it owns (streams.py
has the rule and its picture), so the global batches do not depend on the host count.

Determinism and resume: everything above is a pure function of (seed, stream, epoch,
position), so the state is tiny: per stream, the position (epoch, doc, token offset) of the
first token not yet in a consumed batch plus the number of batches consumed (which seeds MLM
masking). Restoring skips `doc` documents as STRINGS, before tokenization, and `offset` tokens
of the first document; no earlier batch is rebuilt. The skip still reads those records and
refills the shuffle buffer (tf.data cannot seek into a shuffled stream), so resuming deep into a
large epoch costs reading, not tokenizing, that many documents. A resumed iterator yields
exactly the batches an uninterrupted one would, on any host count that divides S.

BERT rows without NSP are packed documents, each piece wrapped as [CLS] ... [SEP] (token type
0); with NSP each row is one [CLS] A [SEP] B [SEP] pair. CLM, prefix-LM (CLM rows plus a split
per piece, drawn per batch like MLM's masking) and T5 conventions: see objectives/clm.py,
objectives/prefix_lm.py and objectives/span_corruption.py.
"""
import atexit
import collections
import logging
import queue
import threading
import time
import weakref
import zlib

import numpy as np

from pretrain_jax.data import batches, documents, sources, streams
from pretrain_jax.data import tokenizer as tokenizer_lib
from pretrain_jax.data.config import DataConfig
from pretrain_jax.objectives import clm, mlm, prefix_lm, span_corruption

log = logging.getLogger(__name__)
STATE_VERSION = 2  # 1: one position per host (before streams), not resumable
DATA_SIZE = ('documents', 'bytes')  # the split's size in the data position (see restore)
_LIVE = weakref.WeakSet()  # iterators whose prefetch threads are stopped at exit


@atexit.register
def stop_prefetching(timeout: float = 5.0) -> None:
  """Stops every iterator's prefetch thread (each restarts at its position on its next batch):
  all are told at once, then waited for `timeout` seconds in all; a daemon thread still inside
  a TensorFlow read then is left to finish on its own."""
  threads = [it._release() for it in list(_LIVE)]
  deadline = time.monotonic() + timeout
  for thread in filter(None, threads):
    thread.join(max(0.0, deadline - time.monotonic()))


def host_batch_size(global_batch_size: int, process_count: int) -> int:
  """Per-host share of the global batch; each host feeds `global // process_count` rows."""
  if global_batch_size % process_count:
    raise ValueError(f'global batch_size={global_batch_size} does not split over '
                     f'{process_count} hosts; expected a multiple of {process_count}')
  return global_batch_size // process_count


def assemble_global_batch(host_batches: list) -> dict:
  """Concatenate per-host batches in process-index order into the global batch (rows)."""
  return {k: np.concatenate([b[k] for b in host_batches], axis=0) for k in host_batches[0]}


def check_lengths(data_config: DataConfig, tokenizer, model_max_len: int | None = None) -> dict:
  """Validate the lengths against the model and the special tokens the objective needs against
  the tokenizer (DataConfig checked the rest); returns lengths.

  Raises ValueError naming the bad value (longer than the model holds, more T5 spans than
  sentinels) or the missing special piece.
  """
  objective, seq_len = data_config.objective, data_config.seq_len
  if model_max_len is not None and seq_len > model_max_len:
    raise ValueError(f'config.data.seq_len={seq_len} is longer than the model holds '
                     f'(max_len={model_max_len})')
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

  def __init__(self, produce, identity: dict, owned: range, prefetch: int):
    self._produce, self._identity, self._prefetch = produce, identity, max(int(prefetch), 1)
    self._owned = owned
    start = dict(epoch=0, doc=0, offset=0, batches=0, exhausted=False)
    self._state = dict(identity, version=STATE_VERSION,
                       streams={str(s): dict(start) for s in owned})
    self._thread = None
    self.stats = collections.Counter()

  # -- state --------------------------------------------------------------------------------
  def get_state(self) -> dict:
    """JSON-serializable position after the last batch returned by __next__: the identity of
    the stream plus `streams`, {str(stream): {epoch, doc, offset, batches, exhausted}} of the
    streams this host owns. Hosts' states merge by uniting `streams` (checkpoint.py)."""
    return dict(self._state, streams={k: dict(v) for k, v in self._state['streams'].items()})

  @property
  def exhausted(self) -> bool:
    return all(v['exhausted'] for v in self._state['streams'].values())

  def set_state(self, state: dict) -> None:
    """Continue from `state`: get_state of an iterator made with the same arguments on any host
    count, or several hosts' states merged; this host takes the streams it owns."""
    version, saved = state.get('version'), state.get('num_streams')
    if version == 1:
      raise ValueError('data iterator state version 1 was saved before data streams (one '
                       'position per host, in a stream that depended on the host count); it '
                       f'cannot continue as version {STATE_VERSION}: finish that run with the '
                       'pretrain_jax that started it, or train in a new workdir')
    if version != STATE_VERSION:
      raise ValueError(f'data iterator state version {version!r}; expected {STATE_VERSION}')
    mine = self._identity['num_streams']
    if saved != mine:
      raise ValueError(f'the data state was saved with {saved} streams (config.data.num_streams) '
                       f'and this run has {mine}; the stream count is fixed for a run: resume '
                       f'with --config.data.num_streams={saved} on a host count dividing it '
                       f'({streams.divisors(saved) if isinstance(saved, int) else "?"})')
    # The split's size: states saved before a key was recorded are not checked on it.
    now = {k: self._identity[k] for k in DATA_SIZE if k in self._identity}
    then = {k: state.get(k, value) for k, value in now.items()}
    if then != now:
      def size(d):
        return ' of '.join(f'{value:,} {k}' for k, value in d.items())
      raise ValueError(f'split {self._identity["split"]!r} had {size(then)} when the data '
                       f'position was saved and has {size(now)} now: the data behind '
                       'config.data.files (or the tfds dataset) changed, and the position would '
                       'continue in other documents; resume on the same data or use a new '
                       'workdir')
    for key, value in self._identity.items():
      if key not in DATA_SIZE and state.get(key) != value:
        raise ValueError(f'data iterator state has {key}={state.get(key)!r} but this iterator '
                         f'has {key}={value!r}; it was saved by a differently configured pipeline')
    missing = [s for s in self._owned if str(s) not in state.get('streams', {})]
    if missing:
      raise ValueError(f'data state has no position for streams {missing} (it holds '
                       f'{sorted(state.get("streams", {}), key=int)}); expected every stream '
                       f'this host owns: {list(self._owned)}')
    self._stop()
    self._state = dict(state, streams={str(s): dict(state['streams'][str(s)])
                                       for s in self._owned})

  # -- iteration ----------------------------------------------------------------------------
  def __iter__(self):
    return self

  def __next__(self) -> dict:
    if self.exhausted:
      raise StopIteration
    if self._thread is None:
      self._start()
    item = self._queue.get()
    if item is None:  # the host's batches end together (NSP: with its first stream)
      self._state = dict(self._state, streams={k: dict(v, exhausted=True)
                                               for k, v in self._state['streams'].items()})
      raise StopIteration
    if isinstance(item, BaseException):
      self._thread = None
      failed = sources.read_error(item)
      if failed is not None:
        raise failed from item
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
    """Share of non-padding positions in the batches returned so far (T5: encoder and decoder
    together, as the train loop counts its tokens); None before the first batch with tokens."""
    s = self.stats
    total = s['tokens'] + s['decoder_tokens']
    return (s['real_tokens'] + s['decoder_real_tokens']) / total if total else None

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

  def _release(self):
    """Tells the prefetch thread to stop and forgets it; returns it (None: none runs)."""
    thread, self._thread = self._thread, None
    if thread is not None:
      self._stop_event.set()
    return thread

  def _stop(self, timeout=None):
    thread = self._release()
    if thread is not None:
      thread.join(timeout)

  def close(self, timeout: float = 5.0):
    """Stops the prefetch thread; one still inside a TensorFlow read after `timeout` seconds (a
    stalled remote file) is left to finish on its own (a daemon), not waited for."""
    self._stop(timeout)

  def __del__(self):
    try:
      self._stop()
    except Exception:  # interpreter shutdown
      pass


def make_dataset(data_config: DataConfig, tokenizer, *, split: str, batch_size: int,
                 process_index: int = 0, process_count: int = 1, seed: int | None = None,
                 repeat: bool = True, model_max_len: int | None = None,
                 source=None) -> DataIterator:
  """Per-host batches of `split` for `data_config.objective` (keys and shapes: DESIGN.md).

  Args:
    data_config: config.data (a DataConfig).
    tokenizer: from load_tokenizer (its vocabulary must be the model's).
    split: tfds split name, e.g. data_config.train_split or data_config.eval_split.
    batch_size: rows per host (host_batch_size(global, process_count)).
    process_index, process_count: this host produces the rows of the data streams it owns
      (streams.py); the global batch is the same for every process_count dividing the streams.
    seed: data order and masking seed (default data_config.seed).
    repeat: cycle over epochs (each reshuffled); False ends after one epoch of every stream
      (streams that end first give all-padding rows, NSP label -1), so evaluation reads the
      whole split at any batch size.
    model_max_len: if given, seq_len (and T5's target length) must fit in it.
    source: the opened sources.Source to read (default sources.open_source(data_config); a
      multi-host run passes the one copy every host shares).
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
  source = source or sources.open_source(data_config)
  source.check_split(split)
  global_batch = int(batch_size) * int(process_count)
  num_streams = streams.fit_to_split(
      streams.resolve(data_config.num_streams, global_batch),
      source.num_examples(split), per_stream=2 if data_config.nsp else 1)
  owned = streams.owned(num_streams, process_index, process_count, global_batch)
  rows = global_batch // num_streams
  identity = dict(split=split, seed=int(seed), objective=data_config.objective,
                  seq_len=lengths['seq_len'], num_streams=num_streams, stream_rows=rows,
                  documents=source.num_examples(split), bytes=source.num_bytes(split))
  objective, nsp = data_config.objective, bool(data_config.nsp)
  tables = tokenizer_lib.id_tables(tokenizer)
  if data_config.objective == 'mlm' and data_config.whole_word_mask and tables.word_start is None:
    raise ValueError('config.data.whole_word_mask needs word boundaries, which this tokenizer '
                     f'({type(tokenizer).__name__}) does not provide; a sentencepiece model or a '
                     'WordPiece vocabulary does')

  def stream_batches(index, position, stats):
    """(arrays (rows, ...), position) of stream `index` from `position` on."""
    salt = (zlib.crc32(split.encode()), index)
    stream = documents.DocumentStream(
        source, split, tokenizer, process_index=index, process_count=num_streams,
        seed=seed, shuffle_buffer=data_config.shuffle_buffer,
        num_parallel_calls=data_config.num_parallel_calls, repeat=repeat, stats=stats)
    docs = stream.documents(position['epoch'], position['doc'])
    common = dict(batch_size=rows, seq_len=lengths['seq_len'])
    offset = position['offset']
    if objective in ('clm', 'prefix_lm'):
      gen = batches.clm_batches(docs, offset, pack=data_config.pack, eos_id=tokenizer.eos_id,
                                **common)
    elif objective == 'span_corruption':
      gen = batches.span_corruption_batches(
          docs, offset, pack=data_config.pack, seed=seed, salt=salt,
          first_sentinel=tokenizer.sentinel_id(0), eos_id=tokenizer.eos_id,
          noise_density=data_config.noise_density,
          mean_noise_span_length=data_config.mean_noise_span_length, **common)
    elif nsp:
      gen = batches.nsp_batches(docs, offset, seed=seed, salt=salt, cls_id=tokenizer.cls_id,
                                sep_id=tokenizer.sep_id, first_document=stream.first_document,
                                **common)
    else:
      gen = batches.bert_batches(docs, offset, pack=data_config.pack, cls_id=tokenizer.cls_id,
                                 sep_id=tokenizer.sep_id, **common)
    count = position['batches']
    for arrays, at in gen:
      if objective == 'clm':
        arrays['loss_weights'] = clm.loss_weights(arrays['segment_ids'])
      elif objective == 'prefix_lm':
        arrays.update(prefix_lm.features(arrays['segment_ids'], arrays['positions'],
                                         batches.rng_at(seed, *salt, batches.SALT_PREFIX, count)))
      elif objective == 'span_corruption':
        arrays['decoder_loss_weights'] = clm.loss_weights(arrays['decoder_segment_ids'])
      else:
        arrays = _apply_mlm(arrays, tokenizer, tables, data_config,
                            batches.rng_at(seed, *salt, batches.SALT_MLM, count))
      count += 1
      epoch, doc, offset = at if at is not None else (0, 0, 0)
      yield arrays, dict(epoch=epoch, doc=doc, offset=offset, batches=count,
                         exhausted=at is None)

  def produce(state, stats):
    positions = dict(state['streams'])
    gens = {s: stream_batches(s, positions[str(s)], stats) for s in owned
            if not positions[str(s)]['exhausted']}
    while True:
      parts = {}
      for s in list(gens):
        item = next(gens[s], None)
        if item is None:
          del gens[s]
        else:
          parts[s], positions[str(s)] = item
      if not parts:
        return
      # an ended stream's rows: padding (NSP label -1: no example, as its own last batch has)
      pad = {k: np.full_like(v, -1) if k == 'nsp_labels' else np.zeros_like(v)
             for k, v in next(iter(parts.values())).items()}
      host = [parts.get(s, pad) for s in owned]
      yield ({k: np.concatenate([p[k] for p in host]) if len(host) > 1 else host[0][k]
              for k in host[0]}, dict(state, streams=dict(positions)))

  return DataIterator(produce, identity, owned, data_config.prefetch)


def _apply_mlm(arrays, tokenizer, tables, data_config, rng) -> dict:
  """Batch-level MLM corruption (token or span masking) on packed/NSP rows; adds
  token_type_ids when absent."""
  special, ordinary_ids, word_start = tables.special, tables.ordinary_ids, tables.word_start
  tokens, segment_ids = arrays['inputs'], arrays['segment_ids']
  selectable = ~special[tokens] & (segment_ids > 0)
  if data_config.masking == 'span':
    out = mlm.mask_spans(tokens, rng, selectable=selectable, segment_ids=segment_ids,
                         random_ids=ordinary_ids, mask_id=tokenizer.mask_id,
                         probability=data_config.mlm_probability, p=data_config.span_p,
                         max_span=data_config.max_span_length,
                         span_length=data_config.span_length)
  else:
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
