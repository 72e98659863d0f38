"""A labelled example as a prompt, and its label as the continuation a language model writes.

GPT's generation format (fine-tuning with task.format='generation') and zero- and few-shot
scoring (inference/scoring.py, pretrain-jax fewshot) read the same prompt:

    context       '<text>\\n[<text_pair>\\n]<question>:'      'A fine film.\\nSentiment:'
    continuation  ' <label>'                                  ' positive'

`question` is the task's (tasks.Task.question: 'Sentiment' for glue/sst2, 'Word order' for the
embedded task, 'Label' for a directory) unless config.task.question names another. With k
in-context examples ("shots") their contexts and labels come first, each followed by a blank
line (lm-evaluation-harness's default delimiter):

    '<shot 1 context> <label 1>\\n\\n<shot 2 context> <label 2>\\n\\n<context>'

The context and the continuation are encoded separately, so a label is the same tokens after
every context; a context too long for the model loses its FIRST tokens (the earliest shots go
first, the question and the label stay).
"""
import random
import zlib

import numpy as np

from pretrain_jax.data import classification

SHOT_DELIMITER = '\n\n'


def context(example: dict, question: str) -> str:
  """The prompt of a classification example (see the module docstring)."""
  parts = [example['text']] + ([example['text_pair']] if example.get('text_pair') else [])
  return '\n'.join(parts + [f'{question}:'])


def continuation(label: str) -> str:
  return ' ' + label


def draw_shots(train: list, k: int, seed: int, index: int) -> list:
  """k training examples for the `index`-th query: a sample without replacement from a
  generator seeded by (seed, index), so a query's shots do not depend on batching or order."""
  if k > len(train):
    raise ValueError(f'{k} shots; the training split has only {len(train)} examples to draw '
                     'them from')
  return random.Random(zlib.crc32(f'{seed}:{index}'.encode())).sample(train, k)


def fewshot_context(example: dict, shots: list, question: str) -> str:
  """The shots' prompts and labels, then the query's prompt."""
  done = [context(s, question) + continuation(s['label']) for s in shots]
  return SHOT_DELIMITER.join(done + [context(example, question)])


def encode_choice(tokenizer, text: str, answer: str, length: int):
  """(ids, context tokens, cut): the context `text` then the continuation `answer`, at most
  `length` tokens; a long context loses its first tokens (`cut` True). The continuation is
  never cut, and at least one context token stays (it predicts the first answer token)."""
  ctx, ans = tokenizer.encode(text), tokenizer.encode(answer)
  if not ctx:
    raise ValueError(f'the prompt {text!r} encodes to no tokens; expected text to continue')
  if len(ans) + 1 > length:
    raise ValueError(f'the continuation {answer!r} is {len(ans)} tokens; with a context token '
                     f'it needs {len(ans) + 1}, more than the {length} the model holds')
  room = length - len(ans)
  cut = len(ctx) > room
  ctx = ctx[len(ctx) - room:] if cut else ctx
  return ctx + ans, len(ctx), cut


def encode_generation(task, split: str, tokenizer, seq_len: int, question: str,
                      max_examples: int = 0, prefix_lm: bool = False):
  """Every example of `split` as a causal-LM row that ends in its label (classification.Encoded):

    inputs / targets   the tokens of context + ' ' + label, and the next token of each
    loss_weights       1 exactly where the target is a label token: the loss is the label's
    segment_ids, positions, class_ids (the label's index), and with `prefix_lm` a `prefix` of
    1 on the context (a prefix LM reads its prompt both ways, as it pre-trained)

  Rows are `seq_len` long; a context that does not fit loses its first tokens (counted)."""
  examples = classification.first_examples(task, split, max_examples)
  n = len(examples)
  rows = {k: np.zeros((n, seq_len), np.int32) for k in ('inputs', 'targets', 'segment_ids',
                                                         'positions', 'prefix')}
  rows['loss_weights'] = np.zeros((n, seq_len), np.float32)
  index = {label: c for c, label in enumerate(task.labels)}
  rows['class_ids'] = np.array([index[e['label']] for e in examples], np.int32)
  truncated = 0
  for i, ex in enumerate(examples):
    ids, n_context, cut = encode_choice(tokenizer, context(ex, question),
                                        continuation(ex['label']), seq_len + 1)
    truncated += cut
    length = len(ids) - 1
    rows['inputs'][i, :length], rows['targets'][i, :length] = ids[:-1], ids[1:]
    rows['segment_ids'][i, :length] = 1
    rows['positions'][i, :length] = np.arange(length)
    rows['loss_weights'][i, n_context - 1:length] = 1.0
    rows['prefix'][i, :n_context] = 1
  if not prefix_lm:
    del rows['prefix']
  return classification.Encoded(rows, truncated)
