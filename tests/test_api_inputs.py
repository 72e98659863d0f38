"""The Python API refuses what a model would silently get wrong (review K): ids outside the
vocabulary (NaN logits), token types outside the table, rows longer than learned positions
(zeros for position: finite, wrong logits); and takes only ints for counts."""
import ml_collections
import modeling
import numpy as np
import pytest

from pretrain_jax.inference import load, text


def _model(family, **kw):
  cfg = modeling.tiny(family, **kw)
  return load.Pretrained(ml_collections.ConfigDict({'model': cfg.to_dict()}), cfg,
                         modeling.init(cfg), tokenizer=None)


@pytest.mark.parametrize('family', ['gpt', 'bert'])
def test_rows_longer_than_learned_positions_are_refused(family):
  model = _model(family)                                    # max_len 32
  ids = np.asarray(modeling.tokens((1, 33)))
  with pytest.raises(ValueError, match=r'33 tokens.* max_len=32'):
    model(ids)
  out = model(ids[:, :32])                                  # the table's length is fine
  assert np.isfinite(np.asarray(getattr(out, 'logits', out))).all()
  # Padding does not count: 40 columns of which 32 are real tokens.
  padded = np.concatenate([np.zeros((1, 8), np.int32), ids[:, :32]], axis=1)
  mask = np.concatenate([np.zeros((1, 8)), np.ones((1, 32))], axis=1)
  assert np.isfinite(np.asarray(getattr(model(padded, attention_mask=mask), 'logits',
                                        model(padded, attention_mask=mask)))).all()


def test_sinusoidal_and_relative_positions_take_any_length():
  assert np.isfinite(np.asarray(_model('gpt', position_embedding='sinusoidal')(
      np.asarray(modeling.tokens((1, 40)))))).all()
  t5 = _model('t5')
  assert np.asarray(t5(np.asarray(modeling.tokens((1, 40))),
                       np.asarray(modeling.tokens((1, 40))))).shape == (1, 40, modeling.VOCAB)


@pytest.mark.parametrize('family,kw,message', [
    ('gpt', dict(input_ids=[[3, modeling.VOCAB, 4]]),
     rf'input_ids holds {modeling.VOCAB};.* vocab_size={modeling.VOCAB}'),
    ('gpt', dict(input_ids=[[3, -1, 4]]), r'input_ids holds -1;'),
    ('bert', dict(input_ids=[[3, 4]], token_type_ids=[[0, 2]]),
     r'token_type_ids holds 2;.* type_vocab_size=2'),
    ('t5', dict(input_ids=[[3, 4]], decoder_input_ids=[[0, 5000]]),
     r'decoder_input_ids holds 5000;'),
])
def test_ids_outside_their_tables_are_refused(family, kw, message):
  model = _model(family)
  with pytest.raises(ValueError, match=message):
    model(kw.pop('input_ids'), **kw)


@pytest.mark.parametrize('kw,message', [
    (dict(max_new_tokens=True), r'max_new_tokens=True is out of range'),
    (dict(max_new_tokens=2.0), r'max_new_tokens=2.0 is out of range'),
    (dict(top_k=2.5), r'top_k=2.5 is out of range;.* 97'),
    (dict(top_k=98), r'top_k=98 is out of range'),
    (dict(top_p=0.0), r'top_p=0.0 is out of range'),
])
def test_sampling_counts_are_integers_in_range(kw, message):
  args = dict(max_new_tokens=4, temperature=1.0, top_k=0, top_p=1.0, vocab_size=97)
  with pytest.raises(ValueError, match=message):
    text.check_sampling(**dict(args, **kw))
  text.check_sampling(**dict(args, top_k=np.int64(5)))     # numpy integers are integers


def test_generate_without_prompts_and_fill_mask_with_a_fractional_top_k_are_refused():
  model = _model('gpt')
  model.tokenizer = _Tokenizer()
  with pytest.raises(ValueError, match='no prompts'):
    model.generate([])
  bert = _model('bert')
  bert.tokenizer = _Tokenizer()
  with pytest.raises(ValueError, match=r'top_k=2.5 is out of range;.* 97'):
    bert.fill_mask('a [MASK] b', top_k=2.5)


class _Tokenizer:
  """Enough of a tokenizer for the checks before any text is encoded."""
  vocab_size, eos_id, pad_id, cls_id, sep_id, mask_id = modeling.VOCAB, 1, 0, 2, 3, 4
