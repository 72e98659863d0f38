"""The tokenizer objects a Hugging Face directory loads into, behind one small interface.

`encode(str) -> list[int]` (no special tokens added), `decode(ids) -> str`, `vocab_size`,
`pad_id`, `eos_id`, `id_to_piece(id)`, and for BERT `cls_id`, `sep_id`, `mask_id` and
`word_start`: the attribute names of pretrain_jax.data.tokenizer.Tokenizer, so the pre-training
pipeline reads these too. `files` lists the files it was read from; `num_ids` is the largest id
it produces + 1 (the model's vocabulary must hold them).
Which files make which tokenizer is the family record's business (hf/bert.py, gpt2.py, t5.py).
"""
import numpy as np
import sentencepiece as spm

from pretrain_jax.data import tokenizer as data_tok

T5_EXTRA_IDS = 100


class SentencePieceTokenizer:
  """T5's spiece.model. Sentinels `<extra_id_i>` are virtual ids after the pieces counting
  down (<extra_id_0> = pieces + extra_ids - 1), as in HF's T5Tokenizer and seqio;
  `vocab_size` is rounded up to a multiple of 128 like the project's Tokenizer (32128 for
  T5's public vocabulary: the model's embedding rows)."""

  def __init__(self, path: str, extra_ids: int = T5_EXTRA_IDS):
    self.sp = spm.SentencePieceProcessor()
    try:
      self.sp.Load(path)
    except (OSError, RuntimeError) as e:
      raise ValueError(f'{path!r} is not a sentencepiece model: {e}') from None
    self.path, self.files = path, [path]
    self.num_pieces = self.sp.get_piece_size()
    self.extra_ids = self.num_sentinels = extra_ids   # (num_sentinels: as data.Tokenizer's)
    self.num_ids = self.num_pieces + extra_ids
    self.vocab_size = -(-self.num_ids // 128) * 128
    self.pad_id, self.eos_id, self.unk_id = self.sp.pad_id(), self.sp.eos_id(), self.sp.unk_id()

  def sentinel_id(self, i: int) -> int:
    if not 0 <= i < self.extra_ids:
      raise ValueError(f'sentinel {i}; expected 0 <= i < {self.extra_ids}')
    return self.num_pieces + self.extra_ids - 1 - i

  def id_to_piece(self, i: int) -> str:
    i = int(i)
    if i < self.num_pieces:
      return self.sp.id_to_piece(i)
    if i < self.num_ids:
      return f'<extra_id_{self.num_ids - 1 - i}>'
    return f'<unused_id_{i}>'

  def encode(self, text: str) -> list:
    """Ids of `text`; `<extra_id_N>` is sentinel N wherever it stands (T5's spiece.model has
    no sentinel pieces: as plain text it would be spelled out)."""
    return data_tok.encode_with_sentinels(self.sp.encode, text, self.sentinel_id,
                                          self.extra_ids)

  def decode(self, ids) -> str:
    text, run = [], []
    for i in (int(i) for i in ids):
      if i < self.num_pieces:
        run.append(i)
        continue
      text.append(self.sp.decode(run))
      run = []
      if i < self.num_pieces + self.extra_ids:
        text.append(f'<extra_id_{self.num_pieces + self.extra_ids - 1 - i}>')
    return ''.join(text + [self.sp.decode(run)])


class HFTokenizer:
  """A `tokenizers.Tokenizer` (byte-level BPE, WordPiece, Unigram) with the special ids we use.

  `specials` maps a role ('pad', 'eos', ...) to its token text; `fallbacks` maps a role the
  vocabulary lacks to the role that stands in for it (GPT-2's pad is its eos).
  """

  def __init__(self, tokenizer, family: str, specials: dict, files: list,
               fallbacks: dict = None):
    self.tok, self.family, self.files = tokenizer, family, files
    self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    self._ids = {}
    for role, text in specials.items():
      if text is not None and tokenizer.token_to_id(text) is not None:
        self._ids[role] = tokenizer.token_to_id(text)
    # vocab.json + merges.txt alone do not mark '<|endoftext|>' as one token; transformers does
    tokenizer.add_special_tokens([specials[r] for r in self._ids])
    for role, stand_in in (fallbacks or {}).items():
      self._ids.setdefault(role, self._ids.get(stand_in))
    self.num_ids = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    self.word_start = self._word_starts(tokenizer)

  def _word_starts(self, tokenizer):
    """(vocab_size,) bool, True where a token begins a word, for whole-word masking: WordPiece
    marks the pieces that continue a word ('##'); None for other models (their markers are
    not one rule: byte-level BPE's 'Ġ' is absent at a text's start)."""
    prefix = getattr(tokenizer.model, 'continuing_subword_prefix', None)
    if type(tokenizer.model).__name__ != 'WordPiece' or not prefix:
      return None
    starts = np.ones(self.vocab_size, bool)
    for token, i in tokenizer.get_vocab(with_added_tokens=True).items():
      if i < self.vocab_size and token.startswith(prefix):
        starts[i] = False
    return starts

  def _id(self, role: str) -> int:
    if self._ids.get(role) is None:
      raise ValueError(f'the {self.family} tokenizer from {self.files} has no {role} token')
    return self._ids[role]

  pad_id = property(lambda self: self._id('pad'))
  eos_id = property(lambda self: self._id('eos'))
  unk_id = property(lambda self: self._id('unk'))
  cls_id = property(lambda self: self._id('cls'))
  sep_id = property(lambda self: self._id('sep'))
  mask_id = property(lambda self: self._id('mask'))

  def encode(self, text: str, word_start: bool = True) -> list:
    """Ids of `text`. `word_start` is not applied: a text after a [MASK] starts a new word,
    as in transformers' fill-mask pipeline (the tokenizer splits the text at special tokens)."""
    del word_start
    return self.tok.encode(text, add_special_tokens=False).ids

  def id_to_piece(self, i: int) -> str:
    """The token text of id `i`; `<unused_id_i>` for a model row past the vocabulary."""
    piece = self.tok.id_to_token(int(i))
    return f'<unused_id_{int(i)}>' if piece is None else piece

  def decode(self, ids) -> str:
    return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)
