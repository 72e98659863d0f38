"""The data sections of a config, as frozen dataclasses (pretrain_jax/sections.py).

`DataConfig` is pre-training's config.data; a fine-tune's config has its own `data`
(`TaskDataConfig`) and `task` (`TaskConfig`) sections. The field defaults are the only defaults
(configs/common.py and configs/finetune.py build their sections from them) and each field's
comment is its documentation. Checks that need the tokenizer or the model stay where those are
known (pipeline.check_lengths, classification.encode).
"""
import dataclasses
from typing import ClassVar

from pretrain_jax.objectives import mlm
from pretrain_jax.sections import Section

OBJECTIVES = ('clm', 'mlm', 'span_corruption', 'prefix_lm')
TOKENIZER_TYPES = ('unigram', 'bpe', 'char')
MASKINGS = ('token', 'span')            # how MLM selects positions (DataConfig.masking)
TASK_FORMATS = ('head', 'generation')   # how BERT / GPT fine-tune on labels (TaskConfig.format)
# The shortest row each objective can fill: CLM an input and its target, MLM [CLS] x [SEP]
# (with NSP [CLS] a [SEP] b [SEP]), span corruption a span and its sentinel.
MIN_SEQ_LEN = {'clm': 2, 'prefix_lm': 2, 'mlm': 3, 'mlm+nsp': 5, 'span_corruption': 3}


@dataclasses.dataclass(frozen=True)
class DataConfig(Section):
  """config.data of pre-training: where documents come from and how they become batches."""
  SECTION: ClassVar[str] = 'data'
  PREFIX: ClassVar[str] = 'config.data'

  objective: str                    # 'clm' (GPT), 'mlm' (BERT), 'span_corruption' (T5) or
                                    # 'prefix_lm' (GPT with model.prefix_lm: a random split per
                                    # piece, the loss after it; objectives/prefix_lm.py)
  seq_len: int                      # packed row length (T5: encoder input length)
  # Source: a named tfds dataset, or local files, or (both empty) the embedded default corpus.
  tfds_name: str = ''               # e.g. 'c4/en:3.1.0'; any tfds dataset with a text feature
  tfds_data_dir: str = ''           # tfds data_dir; may be a gs:// path on a Cloud TPU VM
  files: str = ''                   # glob of C4-format .json/.jsonl/.json.gz ("text") or .txt
  text_key: str = 'text'            # name of the text feature
  train_split: str = 'train'        # split read for training
  eval_split: str = 'validation'    # split read for validation loss / pretrain-jax evaluate
  validation_fraction: float = 0.02  # local files / embedded corpus: share of documents held out
  prepared_dir: str = ''            # local files / embedded corpus: where they are prepared as
                                    # tfds (may be gs://); '' = this host's cache on one
                                    # process, <workdir>/prepared_data (shared) on several
  # Tokenizer.
  tokenizer: str = ''               # a sentencepiece .model (or a Hugging Face tokenizer
                                    # directory: pretrain-jax train); '' = train once and cache
  tokenizer_type: str = 'unigram'   # when training one: 'unigram', 'bpe' or 'char'
  tokenizer_vocab_size: int = 2048  # when training one: size incl. specials, padded to 128s
  tokenizer_train_chars: int = 20_000_000  # when training one: characters of text it reads
  # Sequences and objective.
  pack: bool = True                 # pack several documents per row (segment ids keep them apart)
  mlm_probability: float = 0.15     # MLM: share of tokens selected for prediction
  whole_word_mask: bool = False     # MLM: select whole words instead of single pieces
  masking: str = 'token'            # MLM: 'token' (each position on its own) or 'span'
                                    # (SpanBERT: contiguous spans inside one document, 80/10/10
                                    # per span; objectives/mlm.py mask_spans)
  span_p: float = 0.2               # span masking: span lengths ~ geometric(span_p) ...
  max_span_length: int = 10         # ... truncated at this many tokens (mean 3.8)
  span_length: int = 0              # span masking: > 0 gives every span this length instead
  nsp: bool = False                 # BERT: next-sentence prediction pairs (one pair per row)
  noise_density: float = 0.15       # T5: share of tokens corrupted
  mean_noise_span_length: float = 3.0  # T5: mean corrupted span length
  # Input machinery.
  shuffle_buffer: int = 10_000      # documents in the shuffle buffer
  seed: int = 0                     # data order and masking randomness
  num_streams: int = 0              # the data is this many streams of train.batch_size / n rows,
                                    # each reading its own share of the documents; a host count
                                    # must divide it, and it is fixed for a run (a checkpoint
                                    # resumes on any host count dividing it). 0 = gcd(batch, 8)
  num_parallel_calls: int = -1      # tf.data parallelism for tokenization; -1 = min(16, CPU
                                    # cores), AUTOTUNE's start, not tuned (data/documents.py)
  prefetch: int = 4                 # batches prepared ahead of the train step

  def validate(self) -> None:
    self.check(self.objective in OBJECTIVES, 'objective', f'one of {OBJECTIVES}')
    if self.nsp and self.objective != 'mlm':
      raise ValueError(f'config.data.nsp=True needs objective mlm; got {self.objective!r}')
    minimum = MIN_SEQ_LEN['mlm+nsp' if self.nsp else self.objective]
    if self.seq_len < minimum:
      raise ValueError(f'config.data.seq_len={self.seq_len} is too short for {self.objective}'
                       f'{" with NSP" if self.nsp else ""}; expected >= {minimum}')
    self.check(self.objective != 'mlm' or 0 < self.mlm_probability <= 1, 'mlm_probability',
               'a value in (0, 1] (0 selects no position: nothing to train on)')
    self.check(self.masking in MASKINGS, 'masking', f'one of {MASKINGS}')
    if self.masking == 'span' and self.objective != 'mlm':
      raise ValueError(f'config.data.masking=span needs objective mlm; got {self.objective!r}')
    if self.masking == 'span' and self.whole_word_mask:
      raise ValueError('config.data.masking=span selects spans of tokens; expected '
                       'whole_word_mask=False with it (whole words are token masking\'s option)')
    self.check(0 < self.span_p <= 1, 'span_p', 'a probability in (0, 1]')
    self.check(self.max_span_length >= 1, 'max_span_length', 'a positive number of tokens')
    self.check(self.span_length >= 0, 'span_length',
               '0 (geometric lengths) or a positive fixed length')
    if self.tfds_name and self.files:
      raise ValueError(f'config.data sets both tfds_name={self.tfds_name!r} and '
                       f'files={self.files!r}; expected at most one')
    self.check(self.tokenizer_type in TOKENIZER_TYPES, 'tokenizer_type',
               f'one of {TOKENIZER_TYPES}')
    self.check(self.num_streams >= 0, 'num_streams',
               'a positive integer (or 0 for gcd(global batch, 8))')

  def max_predictions(self, per_seq: int) -> int:
    """train.max_predictions_per_seq for these data: -1 = the MLM objective's bound for
    seq_len (objectives.mlm.max_predictions_per_seq), 0 (every position) for the others."""
    if per_seq != -1:
      return per_seq
    if self.objective != 'mlm':
      return 0
    return mlm.max_predictions_per_seq(self.seq_len, self.mlm_probability)


@dataclasses.dataclass(frozen=True)
class TaskConfig(Section):
  """config.task of a fine-tune: the labelled task (data/tasks.py)."""
  SECTION: ClassVar[str] = 'task'

  name: str = 'word_order'          # 'word_order' (embedded), a tfds name ('glue/sst2', ...),
                                    # a directory with train.* + validation.*, or
                                    # 'train=FILE,validation=FILE'
  tfds_data_dir: str = ''           # tfds data_dir for named datasets (may be gs://)
  max_train_examples: int = 0       # use the first N training examples (0 = all): the
                                    # labelled-set size of pretrain-jax transfer --sizes
  max_eval_examples: int = 0        # the first N validation examples (0 = all)
  format: str = 'head'              # BERT / GPT: 'head' (a classifier on the hidden states)
                                    # or, GPT only, 'generation' (the label is text the LM
                                    # writes after the prompt, the loss on its tokens alone,
                                    # scored by ranking the labels' log-likelihoods:
                                    # data/prompts.py); T5 is text to text either way
  question: str = ''                # 'generation': what the prompt asks before the label;
                                    # '' = the task's ('Sentiment' for glue/sst2); filled in
  beam_size: int = 1                # T5: decode targets with a beam of this many (1 = greedy)
  labels: tuple = ()                # filled in: the label set collected from train
  metric: str = ''                  # filled in: the headline metric (accuracy, mcc, f1)
  prefix: str = ''                  # filled in: T5's input prefix
  pairs: bool | None = None      # filled in: trained on sentence pairs (predict() must be
                                    # given them); None: a workdir written before it was kept

  def validate(self) -> None:
    for name in ('max_train_examples', 'max_eval_examples'):
      self.check(getattr(self, name) >= 0, name, '0 (all examples) or a positive count')
    self.check(self.format in TASK_FORMATS, 'format', f'one of {TASK_FORMATS}')
    self.check(self.beam_size >= 1, 'beam_size', '1 (greedy) or more beams')


@dataclasses.dataclass(frozen=True)
class TaskDataConfig(Section):
  """config.data of a fine-tune: the lengths and order of its examples (data/classification)."""
  SECTION: ClassVar[str] = 'data'

  seq_len: int = 128                # input length (pairs truncated longest-first, counted)
  target_len: int = 16              # T5 target length (longer targets are refused); a small
                                    # vocabulary splits labels: 'shuffled' is 9 pieces with EOS
                                    # for the main job's 1,024-piece tokenizer
  train_split: str = 'train'
  eval_split: str = 'validation'
  tokenizer: str = ''               # filled in: the checkpoint's tokenizer
  seed: int = 0                     # example order

  def validate(self) -> None:
    self.check(self.seq_len >= 1, 'seq_len', 'a positive input length')
    self.check(self.target_len >= 0, 'target_len',
               'the T5 target length (unused by BERT and GPT)')
    self.check(self.seed >= 0, 'seed', 'a non-negative seed')

  def max_predictions(self, per_seq: int) -> int:
    """train.max_predictions_per_seq for a fine-tune: -1 (the MLM bound) is every position,
    as no fine-tune trains with MLM."""
    return max(per_seq, 0)


def data_section(data):
  """A config.data (ConfigDict or dict, e.g. from a workdir's config.json) as its dataclass:
  pre-training's names its objective (DataConfig), a fine-tune's does not (TaskDataConfig)."""
  return (DataConfig if 'objective' in data else TaskDataConfig).from_config(data)
