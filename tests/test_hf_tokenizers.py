"""HF tokenizer files load through pretrain_jax.hf.tokenizers and agree with transformers'."""
import json

import pytest
import sentencepiece as spm
import tokenizers

from pretrain_jax.hf import tokenizers as tok_lib

TEXTS = ['The quick brown fox jumps over the lazy dog.', 'Hello, world!  Tabs\tand ünïcode 42',
         'lower UPPER MiXeD']
CORPUS = [t * 3 for t in TEXTS] + ['the dog the fox the world hello'] * 20


def bert_dir(tmp_path, lower=True):
  words = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'the', 'quick', 'brown', 'fox', 'jump',
           '##s', 'over', 'lazy', 'dog', '.', ',', '!', 'hello', 'world', 'tab', 'and', 'low',
           '##er', 'up', '##per', 'mix', '##ed', '4', '##2', 'un', '##ic', '##ode']
  (tmp_path / 'vocab.txt').write_text('\n'.join(words) + '\n')
  (tmp_path / 'tokenizer_config.json').write_text(json.dumps({'do_lower_case': lower}))
  return tmp_path


def gpt_dir(tmp_path):
  bpe = tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1,
                          special_tokens=['<|endoftext|>'])
  bpe.save_model(str(tmp_path))
  return tmp_path


def t5_dir(tmp_path):
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(CORPUS * 5), model_prefix=str(tmp_path / 'spiece'), vocab_size=60,
      pad_id=0, eos_id=1, unk_id=2, bos_id=-1, model_type='unigram', character_coverage=1.0,
      hard_vocab_limit=False, minloglevel=2)
  return tmp_path


def test_bert_wordpiece_matches_transformers(tmp_path):
  tr = pytest.importorskip('transformers')
  path = bert_dir(tmp_path)
  ours = tok_lib.load_tokenizer(str(path), 'bert')
  ref = tr.BertTokenizer(str(path / 'vocab.txt'), do_lower_case=True)
  for text in TEXTS:
    assert ours.encode(text) == ref.encode(text, add_special_tokens=False), text
  assert (ours.pad_id, ours.cls_id, ours.sep_id, ours.mask_id) == (0, 2, 3, 4)
  assert ours.eos_id == ours.sep_id and ours.vocab_size == 32
  assert ours.decode(ours.encode('the fox jumps')) == 'the fox jumps'
  assert ours.encode('UPPER') == ours.encode('upper')


def test_bert_respects_do_lower_case(tmp_path):
  ours = tok_lib.load_tokenizer(str(bert_dir(tmp_path, lower=False)), 'bert')
  assert ours.encode('The')[0] == 1  # [UNK]: the cased vocabulary has no 'The'


def test_gpt2_byte_level_bpe_matches_transformers(tmp_path):
  tr = pytest.importorskip('transformers')
  path = gpt_dir(tmp_path)
  ours = tok_lib.load_tokenizer(str(path), 'gpt')
  ref = tr.GPT2Tokenizer(str(path / 'vocab.json'), str(path / 'merges.txt'))
  for text in TEXTS:
    ids = ours.encode(text)
    assert ids == ref.encode(text), text
    assert ours.decode(ids) == text           # byte-level BPE is lossless
  eos = ours.encode('<|endoftext|>')
  assert eos == [ours.eos_id] and ours.pad_id == ours.eos_id
  with pytest.raises(ValueError, match='mask'):
    _ = ours.mask_id


def test_gpt2_tokenizer_json_equals_vocab_and_merges(tmp_path):
  path = gpt_dir(tmp_path)
  from_files = tok_lib.load_tokenizer(str(path), 'gpt')
  json_dir = tmp_path / 'json'
  json_dir.mkdir()
  tokenizers.ByteLevelBPETokenizer(str(path / 'vocab.json'), str(path / 'merges.txt')).save(
      str(json_dir / 'tokenizer.json'))
  from_json = tok_lib.load_tokenizer(str(json_dir), 'gpt')
  for text in TEXTS:
    assert from_json.encode(text) == from_files.encode(text)
  assert from_json.vocab_size == from_files.vocab_size


def test_t5_sentencepiece_matches_transformers(tmp_path):
  tr = pytest.importorskip('transformers')
  path = t5_dir(tmp_path)
  ours = tok_lib.load_tokenizer(str(path), 't5')
  ref = tr.T5Tokenizer.from_pretrained(str(path))
  for text in TEXTS:
    assert ours.encode(text) == ref.encode(text, add_special_tokens=False), text
  assert (ours.pad_id, ours.eos_id, ours.unk_id) == (0, 1, 2)
  assert ours.sentinel_id(0) == ref.convert_tokens_to_ids('<extra_id_0>')
  assert ours.sentinel_id(99) == ref.convert_tokens_to_ids('<extra_id_99>')
  assert ours.vocab_size % 128 == 0 and ours.vocab_size >= len(ref)
  ids = ours.encode('the dog') + [ours.sentinel_id(3)] + ours.encode('hello')
  assert ours.decode(ids) == 'the dog<extra_id_3>hello'
  # spiece.model has no sentinel pieces: <extra_id_N> in text is split out as transformers does
  for text in ('the dog <extra_id_0> over the lazy dog', 'the dog<extra_id_0>over',
               'the <extra_id_0><extra_id_1> dog', '<extra_id_0> the', 'a  <extra_id_5>  b',
               'x <extra_id_100> y'):
    assert ours.encode(text) == ref.encode(text, add_special_tokens=False), text
  assert ours.sentinel_id(7) in ours.encode('the<extra_id_7>.')
  (path / 'tokenizer_config.json').write_text('{"extra_ids": 0}')   # 0 is not the default 100
  assert tok_lib.load_tokenizer(str(path), 't5').num_ids == ours.num_ids - 100


def test_directory_without_tokenizer_gives_none(tmp_path):
  for family in ('bert', 'gpt', 't5'):
    assert tok_lib.load_tokenizer(str(tmp_path), family) is None


def test_vocab_json_without_merges_is_an_error(tmp_path):
  (tmp_path / 'vocab.json').write_text('{}')
  with pytest.raises(FileNotFoundError, match='merges.txt'):
    tok_lib.load_tokenizer(str(tmp_path), 'gpt')


def test_family_is_inferred_from_the_files(tmp_path):
  for family, make in (('bert', bert_dir), ('gpt', gpt_dir), ('t5', t5_dir)):
    path = tmp_path / family
    path.mkdir()
    make(path)
    assert tok_lib.infer_family(str(path)) == family
    assert tok_lib.load_tokenizer(str(path)).encode('the dog') == tok_lib.load_tokenizer(
        str(path), family).encode('the dog')
  assert tok_lib.load_tokenizer(str(tmp_path)) is None
