"""SentencePiece tokenizer with the special ids every family needs.

Layout of a tokenizer trained here (pretrain-jax train_tokenizer, or `load_tokenizer` without
`config.data.tokenizer`), T5's conventions first:

    0 <pad> (the [PAD] of every family; also T5's decoder start)   1 </s> (EOS)   2 <unk>
    3 [CLS]  4 [SEP]  5 [MASK]   ...learned pieces...   <unused_k> filler
    ...  ▁<extra_id_99> ... ▁<extra_id_0>   (sentinels; <extra_id_0> is the LAST id)

and the size is a multiple of 128, so `vocab_size` equals the model's embedding rows. An
existing .model loads unchanged: sentinels are its `<extra_id_N>` pieces if it has them, else
virtual ids after its pieces counting down from the end (T5's public 32000-piece vocabulary:
<extra_id_0> = 32099 ... <extra_id_99> = 32000, vocab_size 32128), as seqio does.
"""
import functools
import hashlib
import io
import os
import re
import sys
from typing import NamedTuple

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as sp_model

from pretrain_jax import paths
from pretrain_jax.data.config import TOKENIZER_TYPES, DataConfig

NUM_SENTINELS = 100
VOCAB_MULTIPLE = 128
BERT_SPECIALS = ('[CLS]', '[SEP]', '[MASK]')


def round_up(n: int, multiple: int = VOCAB_MULTIPLE) -> int:
  return -(-n // multiple) * multiple


SENTINEL_TEXT = re.compile(r'<extra_id_(\d+)>')   # a sentinel written in text


def encode_with_sentinels(encode, text: str, sentinel_id, count: int, continuing=None) -> list:
  """encode(text) with every `<extra_id_N>` (N < count) as sentinel_id(N), wherever it stands
  ('dog<extra_id_0>.' too); the text between sentinels is encoded on its own, whitespace around
  a sentinel dropped. Text glued to the sentinel before it: `continuing(text)` (a tokenizer
  trained here: the pieces span corruption leaves after a sentinel, ',' not '▁,'); without it,
  every text after a sentinel starts a word, as in transformers' T5 tokenizer."""
  if '<extra_id_' not in text:
    return encode(text)

  def chunk(part: str, after_sentinel: bool) -> list:
    if not part.strip():
      return []
    if after_sentinel and continuing is not None and not part[0].isspace():
      return continuing(part.rstrip())
    return encode(part.strip())
  ids, start = [], 0
  for m in SENTINEL_TEXT.finditer(text):
    if int(m.group(1)) < count:
      ids += chunk(text[start:m.start()], start > 0) + [sentinel_id(int(m.group(1)))]
      start = m.end()
  return ids + chunk(text[start:], start > 0)


def sentinel_piece(i: int) -> str:
  return f'▁<extra_id_{i}>'  # seqio's spelling (a word-start piece)


class Tokenizer:
  """A sentencepiece model plus the ids the objectives need.

  Attributes: `vocab_size` (multiple of 128), `pad_id` (0), `eos_id`, `unk_id`, `cls_id`,
  `sep_id`, `mask_id` (these three raise ValueError naming the piece when the model lacks it),
  `sentinel_id(i)`, `num_sentinels`, `path`, and per-id tables `special` (never selected by MLM:
  control pieces, unused filler, sentinels, ids past the model), `ordinary_ids` (what MLM's
  random replacement draws from) and `word_start` (pieces that begin a word).
  """

  def __init__(self, path: str):
    file = paths.resolve(path)
    if file.is_dir():
      raise ValueError(f'tokenizer {path!r} is a directory; expected a sentencepiece .model '
                       'file here (a Hugging Face tokenizer directory, such as the '
                       'hf_tokenizer/ of a workdir pretrain-jax convert_hf imported, is loaded by '
                       'pretrain_jax.hf.convert.data_tokenizer: pretrain-jax train does so and '
                       'passes it to train_and_evaluate(tokenizer=...))')
    if not file.is_file():
      raise FileNotFoundError(f'tokenizer model {path!r} does not exist; expected a '
                              'sentencepiece .model file')
    self.path = path
    self.sp = spm.SentencePieceProcessor()
    try:
      self.sp.LoadFromSerializedProto(file.read_bytes())
    except (OSError, RuntimeError, TypeError) as e:
      raise ValueError(f'{path!r} is not a sentencepiece model: {e}') from None
    n = self.sp.get_piece_size()
    self.pad_id, self.eos_id, self.unk_id = self.sp.pad_id(), self.sp.eos_id(), self.sp.unk_id()
    if self.pad_id != 0:
      raise ValueError(f'tokenizer {path!r} has pad id {self.pad_id}; the pipeline and T5\'s '
                       'decoder start need pad id 0 (train one with pretrain-jax train_tokenizer)')
    if self.eos_id < 0:
      raise ValueError(f'tokenizer {path!r} has no EOS piece; CLM and span corruption need one')
    pieces = [self.sp.id_to_piece(i) for i in range(n)]
    index = {p: i for i, p in enumerate(pieces)}
    self._specials = {}
    for name in BERT_SPECIALS:
      for spelling in (name, name.lower(), '<' + name[1:-1].lower() + '>'):
        if spelling in index:
          self._specials[name] = index[spelling]
          break
    own = [index.get(sentinel_piece(i), index.get(f'<extra_id_{i}>')) for i in
           range(NUM_SENTINELS)]
    if all(i is not None for i in own):
      self._sentinels = own
    else:  # seqio's convention for a model without extra ids: virtual ids after the pieces
      self._sentinels = [n + NUM_SENTINELS - 1 - i for i in range(NUM_SENTINELS)]
    self.num_sentinels = NUM_SENTINELS
    self.vocab_size = round_up(max(n, max(self._sentinels) + 1))
    self.num_pieces = n
    special = np.ones(self.vocab_size, bool)
    special[:n] = [self.sp.is_control(i) or self.sp.is_unused(i) for i in range(n)]
    special[self._sentinels] = True
    special[self.pad_id] = True
    self.special = special
    ordinary = ~special
    ordinary[self.unk_id] = False
    self.ordinary_ids = np.flatnonzero(ordinary).astype(np.int32)
    self.word_start = np.ones(self.vocab_size, bool)
    self.word_start[:n] = [p.startswith('▁') for p in pieces]
    self.word_start |= special

  def _special(self, name: str) -> int:
    if name not in self._specials:
      raise ValueError(f'tokenizer {self.path!r} has no {name} piece, which BERT needs; '
                       'train one with pretrain-jax train_tokenizer (it adds [CLS] [SEP] [MASK])')
    return self._specials[name]

  cls_id = property(lambda self: self._special('[CLS]'))
  sep_id = property(lambda self: self._special('[SEP]'))
  mask_id = property(lambda self: self._special('[MASK]'))

  def sentinel_id(self, i: int) -> int:
    """Id of <extra_id_i>; <extra_id_0> is the last sentinel id, later ones count down."""
    if not 0 <= i < NUM_SENTINELS:
      raise ValueError(f'sentinel {i}; expected 0 <= i < {NUM_SENTINELS}')
    return self._sentinels[i]

  def encode(self, text: str, word_start: bool = True) -> list:
    """Ids of `text`, `<extra_id_N>` as sentinel N wherever it stands. word_start=False: the
    text continues a word (it follows a [MASK] directly), so its first piece gets no word
    boundary: sentencepiece's dummy prefix, the ▁ it puts before every text, is left out."""
    encode = (self.sp if word_start else self._continuing).encode
    return encode_with_sentinels(encode, text, self.sentinel_id, NUM_SENTINELS,
                                 continuing=self._continuing.encode)

  @functools.cached_property
  def _continuing(self):
    m = sp_model.ModelProto()
    m.ParseFromString(self.sp.serialized_model_proto())
    m.normalizer_spec.add_dummy_prefix = False
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(m.SerializeToString())
    return sp

  def encode_batch(self, texts: list) -> list:
    return self.sp.encode(texts)

  def id_to_piece(self, i: int) -> str:
    i = int(i)
    if not 0 <= i < self.vocab_size:
      raise ValueError(f'id {i} is outside the vocabulary [0, {self.vocab_size})')
    if i in self._sentinels and i >= self.num_pieces:
      return f'<extra_id_{self._sentinels.index(i)}>'
    return self.sp.id_to_piece(i) if i < self.num_pieces else f'<unused_id_{i}>'

  def decode(self, ids) -> str:
    """Text of `ids`; virtual sentinels print as <extra_id_N>, ids past the model as nothing."""
    ids = [int(i) for i in ids]
    bad = [i for i in ids if not 0 <= i < self.vocab_size]
    if bad:
      raise ValueError(f'ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})')
    out, run = [], []
    for i in ids:
      if i < self.num_pieces:
        run.append(i)
        continue
      out.append(self.sp.decode(run))
      run = []
      if i in self._sentinels:
        out.append(f' <extra_id_{self._sentinels.index(i)}> ')
    out.append(self.sp.decode(run))
    return ''.join(out).strip() if len(out) > 1 else out[0]


class IdTables(NamedTuple):
  """What the objectives need to know about a tokenizer's ids."""
  special: np.ndarray           # (V,) bool: pad, eos, cls, sep, mask, sentinels
  ordinary_ids: np.ndarray      # ids MLM may draw as random replacements
  word_start: np.ndarray | None  # (V,) bool: piece starts a word (whole-word masking)
  num_sentinels: int            # T5 sentinels at the end of the vocabulary


def id_tables(tokenizer) -> IdTables:
  """The IdTables of any tokenizer.

  A `Tokenizer` has them; another object with the same id attributes (e.g. the Hugging Face
  adapters in pretrain_jax.hf: `vocab_size`, `pad_id`, `eos_id`, `cls_id`, ... and T5's
  `sentinel_id`) gets tables built from those ids, and its `word_start` table if it has one
  (WordPiece's: pieces without the '##' of a word's continuation).
  """
  if isinstance(tokenizer, Tokenizer):
    return IdTables(tokenizer.special, tokenizer.ordinary_ids, tokenizer.word_start,
                    NUM_SENTINELS)
  n = tokenizer.vocab_size
  special, not_random = np.zeros(n, bool), np.zeros(n, bool)
  for name in ('pad_id', 'eos_id', 'cls_id', 'sep_id', 'mask_id', 'unk_id'):
    try:
      i = getattr(tokenizer, name)
    except (AttributeError, ValueError):  # a piece this tokenizer lacks
      continue
    if i is not None and 0 <= i < n:
      (not_random if name == 'unk_id' else special)[i] = True
  num_sentinels = 0
  if hasattr(tokenizer, 'sentinel_id'):
    num_sentinels = NUM_SENTINELS
    special[[tokenizer.sentinel_id(k) for k in range(NUM_SENTINELS)
             if tokenizer.sentinel_id(k) < n]] = True
  ordinary = np.flatnonzero(~special & ~not_random).astype(np.int32)
  return IdTables(special, ordinary, getattr(tokenizer, 'word_start', None), num_sentinels)


def add_filler_and_sentinels(model_proto: bytes, total: int) -> bytes:
  """Append <unused_k> filler then ▁<extra_id_99> ... ▁<extra_id_0> so the size is `total`."""
  m = sp_model.ModelProto()
  m.ParseFromString(model_proto)
  n = len(m.pieces)
  if n + NUM_SENTINELS > total:
    raise ValueError(f'{n} pieces + {NUM_SENTINELS} sentinels exceed the vocabulary {total}')
  for k in range(total - NUM_SENTINELS - n):
    m.pieces.add(piece=f'<unused_{k}>', score=0.0, type=sp_model.ModelProto.SentencePiece.UNUSED)
  for i in reversed(range(NUM_SENTINELS)):
    m.pieces.add(piece=sentinel_piece(i), score=0.0,
                 type=sp_model.ModelProto.SentencePiece.USER_DEFINED)
  return m.SerializeToString()


def train_sentencepiece(texts, path: str, *, vocab_size: int, model_type: str = 'unigram',
                        max_sentences: int = 2_000_000) -> str:
  """Train a model on `texts` (iterable of documents) and write it atomically to `path`.

  The final size is round_up(vocab_size, 128) including the specials and 100 sentinels;
  sentencepiece learns as many pieces as the corpus supports and filler pads the rest.
  """
  if model_type not in TOKENIZER_TYPES:
    raise ValueError(f'tokenizer_type={model_type!r}; expected unigram, bpe or char')
  total = round_up(vocab_size)
  learned = total - NUM_SENTINELS
  if learned < 64:
    raise ValueError(f'tokenizer_vocab_size={vocab_size}: too small; expected more than '
                     f'{VOCAB_MULTIPLE} (sizes round up to a multiple of {VOCAB_MULTIPLE}, and '
                     f'{NUM_SENTINELS} ids are T5 sentinels)')

  def lines():
    count = 0
    for text in texts:
      for line in text.split('\n'):
        if line.strip():
          yield line
          count += 1
          if count >= max_sentences:
            return

  proto = _train_proto(lines(), learned, model_type)
  model = sp_model.ModelProto()
  model.ParseFromString(proto)
  if len(model.pieces) < learned // 2:   # the rest is filler every model still embeds
    print(f'warning: the corpus supports {len(model.pieces)} pieces of the {learned} asked '
          f'(tokenizer_vocab_size={vocab_size}); the other {learned - len(model.pieces)} ids '
          'are unused filler (embedding rows that never train): a smaller vocabulary fits '
          'this corpus', file=sys.stderr, flush=True)
  # atomic: a concurrent reader sees no file or the whole file (local rename, or one object)
  paths.write_atomic(path, add_filler_and_sentinels(proto, total))
  return path


def _train_proto(lines, vocab_size: int, model_type: str) -> bytes:
  out = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=lines, model_writer=out, vocab_size=vocab_size,
        model_type=model_type, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        control_symbols=list(BERT_SPECIALS), hard_vocab_limit=False, character_coverage=0.9995,
        num_threads=os.cpu_count() or 1, minloglevel=2, train_extremely_large_corpus=False)
  except RuntimeError as e:
    raise ValueError(f'sentencepiece training failed: {e}') from None
  if not out.getvalue():
    raise ValueError('sentencepiece produced no model; is the corpus empty?')
  return out.getvalue()


TRAIN_VERSION = 1  # bump when training settings change, so cached tokenizers are retrained


def open_tokenizer(path: str) -> Tokenizer:
  """The sentencepiece model at `path` (local, ~ expanded, or gs://)."""
  return Tokenizer(str(paths.resolve(path)))


def load_tokenizer(data_config: DataConfig, source=None) -> Tokenizer:
  """`data_config.tokenizer` loaded unchanged if set; else one trained on the configured source
  (`source`, an opened sources.Source, default sources.open_source(data_config)).

  A trained tokenizer is cached as <cache>/tokenizers/<key>.model, the key hashing the source's
  fingerprint and the tokenizer settings, so it is trained once (seconds on the embedded
  corpus) and every later run, host or test with the same settings loads the same file.
  """
  if data_config.tokenizer:
    return open_tokenizer(data_config.tokenizer)

  from pretrain_jax.data import sources  # noqa: PLC0415 (TensorFlow: only when a source is read)
  source = source or sources.open_source(data_config)
  settings = (TRAIN_VERSION, source.fingerprint, data_config.train_split,
              data_config.tokenizer_type, round_up(data_config.tokenizer_vocab_size),
              data_config.tokenizer_train_chars)
  key = hashlib.sha256(repr(settings).encode()).hexdigest()[:16]
  path = str(sources.cache_dir() / 'tokenizers' / (
      f'{data_config.tokenizer_type}_{round_up(data_config.tokenizer_vocab_size)}_{key}.model'))
  if not paths.resolve(path).exists():
    texts = sources.iter_texts(data_config, data_config.train_split,
                               data_config.tokenizer_train_chars, source)
    train_sentencepiece(texts, path, vocab_size=data_config.tokenizer_vocab_size,
                        model_type=data_config.tokenizer_type)
  return Tokenizer(path)
