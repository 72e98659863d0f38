"""The character-level BERT-vs-GPT protocol, shortened, on text that ships with CPython."""
import numpy as np
import pytest
from pydoc_data import topics

from configs import shakespeare_char
from pretrain_jax.experiments import char_lm


def test_char_vocab_and_encoding():
  vocab = char_lm.char_vocab('abca')
  assert vocab == ['a', 'b', 'c', '[MASK]']
  np.testing.assert_array_equal(char_lm.encode('cab', vocab), [2, 0, 1])
  with pytest.raises(ValueError, match=r"\['z'\]"):
    char_lm.encode('az', vocab)


def test_short_protocol_learns(tmp_path):
  text = ''.join(topics.topics[k] for k in sorted(topics.topics))[:12_000]
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text(text, encoding='utf-8')
  config = shakespeare_char.get_config()
  config.corpus = str(corpus)
  config.train_chars, config.valid_chars, config.heldout_chars = (0, 9000), (9000, 10_000), \
      (10_000, 12_000)
  config.gpt.train.steps, config.bert.train.steps = 60, 80
  result = char_lm.run(config)
  vocab = result['vocab_size']
  # Uniform guessing has perplexity = vocab size; a few dozen steps must do far better.
  assert result['gpt']['valid_perplexity'] < vocab / 3
  bert = result['bert']
  assert bert['heldout_top1'] > bert['random_init_top1'] + 0.1
  assert bert['heldout_top5'] > bert['heldout_top1']
  with pytest.raises(ValueError, match='needs at least'):
    config.heldout_chars = (10_000, 1_000_000)
    char_lm.run(config)
