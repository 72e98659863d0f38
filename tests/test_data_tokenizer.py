"""Tokenizer layout (pad/eos/unk, BERT specials, sentinels last, 128 multiple) and caching."""
import io
import os

import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as sp_model

from configs import common
from pretrain_jax.data import corpus
from pretrain_jax.data import tokenizer as tok_lib
from pretrain_jax.data.config import DataConfig

TEXTS = corpus.embedded_documents()[:120]




@pytest.mark.parametrize('model_type', ['unigram', 'bpe', 'char'])
def test_trained_layout(tmp_path, model_type):
  path = tok_lib.train_sentencepiece(TEXTS, str(tmp_path / 't.model'), vocab_size=1000,
                                     model_type=model_type)
  t = tok_lib.Tokenizer(path)
  assert t.vocab_size == 1024 == t.num_pieces  # padded to a multiple of 128 by real pieces
  assert (t.pad_id, t.eos_id, t.unk_id) == (0, 1, 2)
  assert (t.cls_id, t.sep_id, t.mask_id) == (3, 4, 5)
  assert t.sentinel_id(0) == 1023 and t.sentinel_id(99) == 924
  assert t.id_to_piece(1023) == '▁<extra_id_0>'
  assert t.special[[0, 1, 3, 4, 5, 924, 1023]].all() and not t.special[t.ordinary_ids].any()
  assert not t.special[2]  # <unk> may be masked like any token, but is never a random token
  assert 2 not in t.ordinary_ids and t.mask_id not in t.ordinary_ids
  ids = t.encode('The "if" statement is used for conditional execution.')
  assert ids and max(ids) < 924 and t.decode(ids) == ('The "if" statement is used for '
                                                     'conditional execution.')
  assert os.listdir(tmp_path) == ['t.model']  # written atomically: no temporary left over


def _plain_model(tmp_path, vocab=300, control=()):
  """A sentencepiece model with no sentinels and no BERT specials (like T5's public one)."""
  out = io.BytesIO()
  lines = [line for t in TEXTS for line in t.split('\n') if line.strip()]
  spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out,
                                 vocab_size=vocab, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                 control_symbols=list(control), minloglevel=2)
  path = tmp_path / 'plain.model'
  path.write_bytes(out.getvalue())
  return str(path)


def test_existing_model_loads_unchanged_with_t5_sentinel_convention(tmp_path):
  path = _plain_model(tmp_path)
  before = open(path, 'rb').read()
  t = tok_lib.Tokenizer(path)
  assert open(path, 'rb').read() == before
  # T5's 32000-piece vocabulary: <extra_id_0> = 32099 ... <extra_id_99> = 32000, 32128 ids.
  # Same rule here with 300 pieces: 399 ... 300, padded to 512.
  assert t.num_pieces == 300 and t.vocab_size == 512
  assert t.sentinel_id(0) == 399 and t.sentinel_id(99) == 300
  assert t.id_to_piece(399) == '<extra_id_0>'
  assert t.decode([t.sentinel_id(1)]) == '<extra_id_1>'
  assert t.special[300:].all()
  with pytest.raises(ValueError, match=r'no \[MASK\] piece'):
    _ = t.mask_id
  with pytest.raises(ValueError, match='outside the vocabulary'):
    t.decode([512])


def test_bad_model_files(tmp_path):
  with pytest.raises(FileNotFoundError, match='does not exist'):
    tok_lib.Tokenizer(str(tmp_path / 'missing.model'))
  bad = tmp_path / 'bad.model'
  bad.write_bytes(b'not a model')
  with pytest.raises(ValueError, match='not a sentencepiece model'):
    tok_lib.Tokenizer(str(bad))


def test_sentinel_pieces_are_appended_in_t5_order():
  m = sp_model.ModelProto()
  m.pieces.add(piece='<pad>', score=0, type=sp_model.ModelProto.SentencePiece.CONTROL)
  out = sp_model.ModelProto()
  out.ParseFromString(tok_lib.add_filler_and_sentinels(m.SerializeToString(), 128))
  pieces = [p.piece for p in out.pieces]
  assert len(pieces) == 128 and pieces[-1] == '▁<extra_id_0>' and pieces[28] == '▁<extra_id_99>'
  assert pieces[1:28] == [f'<unused_{k}>' for k in range(27)]


def test_too_small_vocab_is_a_clear_error(tmp_path):
  for size in (128, -5):   # 129 already works (256 ids); -5 said 'leaves -100 ids'
    with pytest.raises(ValueError, match=rf'^tokenizer_vocab_size={size}: .*128'):
      tok_lib.train_sentencepiece(TEXTS, str(tmp_path / 'x.model'), vocab_size=size)
  with pytest.raises(ValueError, match="tokenizer_type='wordpiece'"):
    tok_lib.train_sentencepiece(TEXTS, str(tmp_path / 'x.model'), vocab_size=512,
                                model_type='wordpiece')


def test_load_tokenizer_trains_once_and_caches(module_cache, monkeypatch):
  dc = DataConfig.from_config(common.data_config('clm', 64)).replace(tokenizer_vocab_size=1024)
  t = tok_lib.load_tokenizer(dc)
  assert t.path.startswith(module_cache) and t.vocab_size == 1024
  calls = []
  monkeypatch.setattr(tok_lib, 'train_sentencepiece', lambda *a, **k: calls.append(1))
  again = tok_lib.load_tokenizer(dc)
  assert again.path == t.path and calls == []  # loaded from the cache, not retrained
  dc = dc.replace(tokenizer_type='bpe')  # different settings -> different cache entry
  with pytest.raises(FileNotFoundError):  # the stub writes nothing
    tok_lib.load_tokenizer(dc)
  assert calls == [1]
  dc = dc.replace(tokenizer=t.path)  # an explicit model is loaded as is
  assert tok_lib.load_tokenizer(dc).path == t.path


def test_t5_sized_vocabulary_without_extra_ids(tmp_path):
  """A 32000-piece model without extra ids (like T5's public one): 32099..32000, 32128 ids."""
  m = sp_model.ModelProto()
  m.ParseFromString(open(_plain_model(tmp_path), 'rb').read())
  for k in range(32000 - len(m.pieces)):
    m.pieces.add(piece=f'▁zz{k}', score=-20.0 - k * 1e-4)
  path = tmp_path / 't5like.model'
  path.write_bytes(m.SerializeToString())
  t = tok_lib.Tokenizer(str(path))
  assert (t.num_pieces, t.vocab_size) == (32000, 32128)
  assert t.sentinel_id(0) == 32099 and t.sentinel_id(99) == 32000
  assert t.special[32000:].all() and not t.special[32000 - 1]


def test_text_continuing_a_word_gets_no_word_boundary(tmp_path):
  """fill_mask encodes the text after a [MASK] on its own; glued to the mask ('[MASK]__',
  '[MASK]-in') it continues a word, so sentencepiece's dummy-prefix ▁ must not start it."""
  t = tok_lib.Tokenizer(tok_lib.train_sentencepiece(TEXTS, str(tmp_path / 't.model'),
                                                    vocab_size=1000))
  plain, glued = t.encode('__ The list'), t.encode('__ The list', word_start=False)
  assert t.id_to_piece(plain[0]).startswith('▁')           # the boundary a whole text gets
  assert not t.id_to_piece(glued[0]).startswith('▁') and t.decode(glued) == '__ The list'
  assert glued[-2:] == plain[-2:]                           # later words keep theirs
  assert t.encode('x', word_start=True) == t.encode('x')


def test_sentinel_text_is_the_sentinel_wherever_it_stands(tmp_path):
  """The pieces are '▁<extra_id_N>' (a word start): glued to a word or to another sentinel the
  text was spelled out; now it is the sentinel. What follows a sentinel keeps the pieces span
  corruption leaves there: ',' (not '▁,') after '<extra_id_0>,', a word start after a space."""
  t = tok_lib.Tokenizer(tok_lib.train_sentencepiece(TEXTS, str(tmp_path / 't.model'),
                                                    vocab_size=1000))
  s0, s1 = t.sentinel_id(0), t.sentinel_id(1)
  def glued(text):
    return t.encode(text, word_start=False)
  assert t.encode('The <extra_id_0> list') == t.encode('The') + [s0] + t.encode('list')
  assert t.encode('The<extra_id_0>list') == t.encode('The') + [s0] + glued('list')
  assert t.encode('(<extra_id_0><extra_id_1>)') == t.encode('(') + [s0, s1] + glued(')')
  after = t.encode('It is <extra_id_0>, in place.')
  assert after == t.sp.encode('It is <extra_id_0>, in place.')   # the piece after a sentinel
  assert not t.id_to_piece(after[after.index(s0) + 1]).startswith('▁')
  assert s0 not in t.encode('<extra_id_100>') and t.encode('plain text') == t.sp.encode(
      'plain text')



def test_a_vocabulary_the_corpus_cannot_fill_is_warned_about(tmp_path, capsys):
  tok_lib.train_sentencepiece(TEXTS[:2], str(tmp_path / 'big.model'), vocab_size=4096)
  err = capsys.readouterr().err
  assert '3996' in err and 'tokenizer_vocab_size=4096' in err
  tok_lib.train_sentencepiece(TEXTS, str(tmp_path / 'fits.model'), vocab_size=512)
  assert capsys.readouterr().err == ''
