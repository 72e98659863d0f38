"""Tokenizers that come with a Hugging Face model directory (the objects: hf/adapters.py).

Which files make a family's tokenizer is its record's `tokenizer` (hf/bert.py, gpt2.py, t5.py):

  T5      spiece.model                    sentencepiece (+ `<extra_id_N>` sentinels past it)
  GPT-2   tokenizer.json, or vocab.json + merges.txt   byte-level BPE (`tokenizers`)
  BERT    tokenizer.json, or vocab.txt    WordPiece (`tokenizers`), lowercasing as configured

`files` of a tokenizer lists the files it was read from (copied along on import and export).
"""
from pretrain_jax import paths
from pretrain_jax.hf import families
from pretrain_jax.hf.adapters import T5_EXTRA_IDS, HFTokenizer, SentencePieceTokenizer

TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json',
                   'spiece.model', 'vocab.json', 'merges.txt', 'vocab.txt')


def _token_settings(hf_dir: str) -> dict:
  """tokenizer_config.json merged over special_tokens_map.json; token dicts -> their text."""
  hf_dir = paths.local_copy(hf_dir)  # gs://: read from a local copy
  out = {}
  for name in ('special_tokens_map.json', 'tokenizer_config.json'):
    if (hf_dir / name).is_file():
      out.update(paths.read_json(hf_dir / name))
  return {k: (v.get('content') if isinstance(v, dict) else v) for k, v in out.items()}


def _present(hf_dir: str) -> dict:
  """{name: local path} of the tokenizer files in (a local copy of) `hf_dir`."""
  hf_dir = paths.local_copy(hf_dir)  # gs://: read from a local copy
  return {n: str(hf_dir / n) for n in TOKENIZER_FILES if (hf_dir / n).is_file()}


def infer_family(hf_dir: str):
  """'t5' | 'gpt' | 'bert' from the tokenizer files in `hf_dir`, or None: a sentencepiece
  model file first, then tokenizer.json's model type, then a vocabulary file."""
  files = _present(hf_dir)
  for record in families.RECORDS:
    if record.sentencepiece_file in files:
      return record.name
  if 'tokenizer.json' in files:
    model = (paths.read_json(files['tokenizer.json']) or {})
    model = model.get('model') if isinstance(model, dict) else None
    model_type = model.get('type') if isinstance(model, dict) else None
    return next((r.name for r in families.RECORDS if r.tokenizer_json_type == model_type), None)
  return next((r.name for name in files for r in families.RECORDS if r.vocab_file == name),
              None)


def load_tokenizer(hf_dir: str, family: str = None):
  """The tokenizer in `hf_dir` for `family` ('bert' | 'gpt' | 't5'; None = guess from the
  files), or None if the directory has none."""
  family = family or infer_family(hf_dir)
  if family is None:
    return None
  files, settings = _present(hf_dir), _token_settings(hf_dir)
  try:
    return families.of(family).tokenizer(files, settings)
  except (ValueError, ImportError, OSError):  # already say what is wrong
    raise
  except Exception as e:  # tokenizers' own errors
    raise ValueError(f'the {family} tokenizer files {sorted(files)} in {hf_dir} could not be '
                     f'read ({type(e).__name__}: {e})') from None


def num_ids(tokenizer) -> int:
  """The largest id `tokenizer` produces + 1 (adapters' `num_ids`; for the project's
  sentencepiece Tokenizer its pieces and virtual sentinels, without the rounding up)."""
  if hasattr(tokenizer, 'num_ids'):
    return tokenizer.num_ids
  return max(tokenizer.num_pieces, tokenizer.sentinel_id(0) + 1)


def check_fits(tokenizer, vocab_size: int, where: str) -> None:
  """ValueError naming both sizes when `tokenizer` has ids past the model's vocabulary (they
  would index past its embedding: NaN or garbage, never an error of their own)."""
  count = num_ids(tokenizer)
  if count > vocab_size:
    files = getattr(tokenizer, 'files', None) or [getattr(tokenizer, 'path', '?')]
    raise ValueError(f'the tokenizer {files} has {count} ids but the model in {where} has '
                     f'vocab_size={vocab_size}; expected a tokenizer with at most {vocab_size} '
                     'ids (the one the model was trained with)')


def tokenizer_files(hf_dir: str) -> list:
  """Paths of the tokenizer files present in `hf_dir`."""
  return list(_present(hf_dir).values())


__all__ = ['HFTokenizer', 'SentencePieceTokenizer', 'T5_EXTRA_IDS', 'TOKENIZER_FILES',
           'check_fits', 'infer_family', 'load_tokenizer', 'num_ids', 'tokenizer_files']
