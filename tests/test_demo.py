"""The main job's BERT probe (inference.demo.masked_word_probe) on a fake model: it masks only
one-piece words, counts a hit when that piece is in the top k, and its shuffled-context variant
tells a model that reads the sentence from one that does not."""
from pretrain_jax.inference import demo


class Tokenizer:
  """Words of the vocabulary are one piece; any other word is '▁' + one piece per letter."""
  VOCAB = ['▁', 'the', 'list', 'sorted', 'place', 'returns', 'new', 'copy']

  def encode(self, text, word_start=True):
    del word_start
    ids = []
    for word in text.split():
      if word in self.VOCAB:
        ids.append(self.VOCAB.index(word))
      else:
        ids += [0] + [100 + ord(c) for c in word]
    return ids


class Model:
  """Predicts the word from its left neighbour when the sentence reads as written, else '▁'."""
  tokenizer = Tokenizer()

  def __init__(self, sentences):
    self.sentences = sentences

  def fill_mask(self, text, top_k=5):
    guesses = [0]
    for sentence in self.sentences:
      words, masked = sentence.split(), text.split()
      if len(words) == len(masked) and all(
          a == b for a, b in zip(words, masked, strict=True) if b != '[MASK]'):
        guesses = [self.tokenizer.encode(words[masked.index('[MASK]')])[0]]
    return [{'candidates': [{'id': i, 'token': str(i), 'word': str(i)} for i in guesses[:top_k]]}]


def test_masks_one_piece_words_and_shuffling_the_context_undoes_a_context_model():
  sentences = ['the list sorted in place', 'returns the new copy of it', 'zzz qqq xyz abc']
  out = demo.masked_word_probe(Model(sentences), sentences)
  # The third sentence has no one-piece word of 3+ letters: it is not probed (its words would
  # "hit" by predicting the bare '▁' piece).
  assert out['sentences'] == 2
  assert all(e['answer'] in Tokenizer.VOCAB for e in out['examples'])
  assert out['top5_hit_rate'] == 1.0
  assert out['top5_hit_rate_context_shuffled'] == 0.0


def test_a_model_that_ignores_context_scores_the_same_shuffled():
  class Frequency(Model):
    def fill_mask(self, text, top_k=5):
      return [{'candidates': [{'id': i, 'token': str(i), 'word': str(i)} for i in range(top_k)]}]
  sentences = ['the list sorted in place', 'returns the new copy of it']
  out = demo.masked_word_probe(Frequency(sentences), sentences)
  assert out['top5_hit_rate'] == out['top5_hit_rate_context_shuffled']


def test_a_word_glued_to_the_text_before_it_is_scored_by_its_piece_there():
  """'instance.__class__': the masked word's piece in the sentence is 'class', not '▁class'."""
  class Glued(Tokenizer):
    def encode(self, text, word_start=True):
      return [i + (0 if word_start else 50) for i in super().encode(text)]

  class Answers(Model):
    tokenizer = Glued()

    def fill_mask(self, text, top_k=5):
      return [{'candidates': [{'id': 2 + 50, 'token': 'list', 'word': 'list'}]}]  # glued 'list'

  out = demo.masked_word_probe(Answers([]), ['x.__list__'])
  assert out['sentences'] == 1 and out['examples'][0]['target_id'] == 52
  assert out['top5_hit_rate'] == 1.0

