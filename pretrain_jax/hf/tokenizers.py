"""Tokenizers that come with a Hugging Face model directory, behind one small interface.

`encode(str) -> list[int]` (no special tokens added), `decode(ids) -> str`, `vocab_size`,
`pad_id`, `eos_id`, and for BERT `cls_id`, `sep_id`, `mask_id`: the attribute names of
pretrain_jax.data.tokenizer.Tokenizer. `files` lists the files it was read from (copied along
on import and export).

  T5      spiece.model                    sentencepiece (+ `<extra_id_N>` sentinels past it)
  GPT-2   tokenizer.json, or vocab.json + merges.txt   byte-level BPE (`tokenizers`)
  BERT    tokenizer.json, or vocab.txt    WordPiece (`tokenizers`), lowercasing as configured
"""
import json
import os

from pretrain_jax import paths

TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json',
                   'spiece.model', 'vocab.json', 'merges.txt', 'vocab.txt')
BERT_SPECIALS = {'pad': '[PAD]', 'cls': '[CLS]', 'sep': '[SEP]', 'mask': '[MASK]',
                 'unk': '[UNK]'}
T5_EXTRA_IDS = 100


def _token_settings(hf_dir: str) -> dict:
  """tokenizer_config.json merged over special_tokens_map.json; token dicts -> their text."""
  hf_dir = paths.local_copy(hf_dir)  # gs://: read from a local copy
  out = {}
  for name in ('special_tokens_map.json', 'tokenizer_config.json'):
    path = os.path.join(hf_dir, name)
    if os.path.isfile(path):
      with open(path) as f:
        out.update(json.load(f))
  return {k: (v.get('content') if isinstance(v, dict) else v) for k, v in out.items()}


class SentencePieceTokenizer:
  """T5's spiece.model. Sentinels `<extra_id_i>` are virtual ids after the pieces counting
  down (<extra_id_0> = pieces + extra_ids - 1), as in HF's T5Tokenizer and seqio;
  `vocab_size` is rounded up to a multiple of 128 like the project's Tokenizer (32128 for
  T5's public vocabulary: the model's embedding rows)."""

  def __init__(self, path: str, extra_ids: int = T5_EXTRA_IDS):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    self.sp = spm.SentencePieceProcessor()
    try:
      self.sp.Load(path)
    except (OSError, RuntimeError) as e:
      raise ValueError(f'{path!r} is not a sentencepiece model: {e}') from None
    self.path, self.files = path, [path]
    self.num_pieces = self.sp.get_piece_size()
    self.extra_ids = extra_ids
    self.vocab_size = -(-(self.num_pieces + extra_ids) // 128) * 128
    self.pad_id, self.eos_id, self.unk_id = self.sp.pad_id(), self.sp.eos_id(), self.sp.unk_id()

  def sentinel_id(self, i: int) -> int:
    if not 0 <= i < self.extra_ids:
      raise ValueError(f'sentinel {i}; expected 0 <= i < {self.extra_ids}')
    return self.num_pieces + self.extra_ids - 1 - i

  def encode(self, text: str) -> list:
    return self.sp.encode(text)

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
  """A `tokenizers.Tokenizer` (byte-level BPE or WordPiece) with the special ids we use."""

  def __init__(self, tokenizer, family: str, specials: dict, files: list):
    self.tok, self.family, self.files = tokenizer, family, files
    self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    self._ids = {}
    for role, text in specials.items():
      if text is not None and tokenizer.token_to_id(text) is not None:
        self._ids[role] = tokenizer.token_to_id(text)
    # vocab.json + merges.txt alone do not mark '<|endoftext|>' as one token; transformers does
    tokenizer.add_special_tokens([specials[r] for r in self._ids])
    if family == 'gpt':  # GPT-2 has no pad token; padding is marked by segment ids anyway
      self._ids.setdefault('pad', self._ids.get('eos'))
    else:                # BERT ends a sequence with [SEP]
      self._ids.setdefault('eos', self._ids.get('sep'))

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

  def encode(self, text: str) -> list:
    return self.tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids) -> str:
    return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)


def infer_family(hf_dir: str):
  """'t5' | 'gpt' | 'bert' from the tokenizer files in `hf_dir`, or None."""
  hf_dir = paths.local_copy(hf_dir)  # gs://: read from a local copy
  path = lambda name: os.path.join(hf_dir, name)
  if os.path.isfile(path('spiece.model')):
    return 't5'
  if os.path.isfile(path('tokenizer.json')):
    with open(path('tokenizer.json')) as f:
      model_type = json.load(f).get('model', {}).get('type')
    return {'BPE': 'gpt', 'WordPiece': 'bert'}.get(model_type)
  if os.path.isfile(path('vocab.json')):
    return 'gpt'
  return 'bert' if os.path.isfile(path('vocab.txt')) else None


def load_tokenizer(hf_dir: str, family: str = None):
  """The tokenizer in `hf_dir` for `family` ('bert' | 'gpt' | 't5'; None = guess from the
  files), or None if the directory has none."""
  hf_dir = paths.local_copy(hf_dir)  # gs://: read from a local copy
  family = family or infer_family(hf_dir)
  if family is None:
    return None
  settings = _token_settings(hf_dir)
  path = lambda name: os.path.join(hf_dir, name)
  present = [n for n in TOKENIZER_FILES if os.path.isfile(path(n))]
  if family == 't5':
    if not os.path.isfile(path('spiece.model')):
      return None
    return SentencePieceTokenizer(path('spiece.model'),
                                  int(settings.get('extra_ids') or T5_EXTRA_IDS))
  import tokenizers  # pylint: disable=g-import-not-at-top
  if family == 'gpt':
    specials = {'eos': settings.get('eos_token') or '<|endoftext|>',
                'pad': settings.get('pad_token'), 'unk': settings.get('unk_token')}
  else:
    specials = {role: settings.get(f'{role}_token') or text
                for role, text in BERT_SPECIALS.items()}
  if os.path.isfile(path('tokenizer.json')):
    tok = tokenizers.Tokenizer.from_file(path('tokenizer.json'))
  elif family == 'gpt' and os.path.isfile(path('vocab.json')):
    if not os.path.isfile(path('merges.txt')):
      raise FileNotFoundError(f'{hf_dir} has vocab.json but no merges.txt; a GPT-2 byte-level '
                              'BPE tokenizer needs both (or a tokenizer.json)')
    tok = tokenizers.ByteLevelBPETokenizer(path('vocab.json'), path('merges.txt'))
  elif family == 'bert' and os.path.isfile(path('vocab.txt')):
    lower = settings.get('do_lower_case')
    tok = tokenizers.BertWordPieceTokenizer(
        path('vocab.txt'), lowercase=True if lower is None else bool(lower),
        unk_token=specials['unk'], sep_token=specials['sep'], cls_token=specials['cls'],
        pad_token=specials['pad'], mask_token=specials['mask'])
  else:
    return None
  return HFTokenizer(tok, family, specials, [path(n) for n in present])


def tokenizer_files(hf_dir: str) -> list:
  """Paths of the tokenizer files present in `hf_dir`."""
  hf_dir = paths.local_copy(hf_dir)  # gs://: read from a local copy
  return [os.path.join(hf_dir, n) for n in TOKENIZER_FILES
          if os.path.isfile(os.path.join(hf_dir, n))]


