"""The one record of a model family: everything outside the model that depends on the family.

Each family module (bert.py, gpt.py, t5.py) ends with its `FAMILY = Family(...)`; code that
needs "which family?" asks the record (`pretrain_jax.models.family_of(cfg)`) instead of
branching on the name. A fourth family is one new module and one line in models/__init__.py.
"""
import dataclasses
from collections.abc import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Head:
  """A classification head on the hidden states: BERT's NSP beside the LM loss, or the
  sequence classifier of fine-tuning (`labels`, no LM loss: task.loss_sums)."""
  name: str            # loss / metric prefix: `{name}_loss`, `{name}_accuracy`
  method: str          # model method: hidden (B, T, E), **batch[keys] -> logits (B, C)
  label_key: str       # batch key of the (B,) int labels (-1: a padding row, no loss)
  enabled: str         # ModelConfig field that switches the head on
  keys: tuple = ()     # batch keys the method also reads (GPT: segment_ids, the last real token)
  params: tuple = ()   # top-level parameter names it owns: what a linear probe trains


@dataclasses.dataclass(frozen=True)
class TaskLayout:
  """How a labelled example becomes one row of this family (data/classification.py). Special
  ids are named by their tokenizer attribute, so the record holds no tokenizer."""
  text_to_text: bool = False   # the label is text the decoder writes (T5), not a class head
  begin: tuple = ()            # ids before the text ('cls_id',: BERT's [CLS])
  end: str = 'eos_id'          # the id after each segment (BERT: 'sep_id')
  token_types: bool = False    # token_type_ids: 0 on the text, 1 on its pair (BERT)

  def specials(self, pair: bool) -> int:
    """Special ids around one example (with a pair: one more `end`)."""
    return len(self.begin) + 1 + pair


@dataclasses.dataclass(frozen=True)
class Family:
  """How batches feed a family's model, what its loss reads, and what it costs.

  Batch keys follow DESIGN.md. `input_keys` are passed to the model positionally, `kwarg_keys`
  by name (None where a batch lacks them); the LM loss reads `target_key` / `weight_key`.
  """
  name: str
  model: type                      # the flax.linen Module class; built with a ModelConfig
  objective: str                   # the data.objective it pre-trains with
  input_keys: tuple
  kwarg_keys: tuple
  target_key: str
  weight_key: str
  example_batch: Callable          # (tokens (B, T+1), rng or None, *, nsp, target_len) -> batch
  forward_flops: Callable          # (cfg, batch_size, seq_len, target_len, head_positions)
  hf_inputs: tuple = ()            # (Hugging Face keyword, batch key) pairs of its __call__
  heads: tuple = ()                # Head records
  generation: str | None = None  # 'continue' (GPT), 'fill_spans' (T5), None
  fills_masks: bool = False        # predicts [MASK] tokens in place (BERT)
  task_layout: TaskLayout = TaskLayout()  # a labelled example as a row (fine-tuning, predict)
  encoder_decoder: bool = False    # a separate decoder stack of cfg.decoder_layers (T5)

  @property
  def batch_keys(self) -> tuple:
    """Every key a training batch of this family may hold."""
    return (self.input_keys + self.kwarg_keys + (self.target_key, self.weight_key)
            + tuple(h.label_key for h in self.heads))

  def model_inputs(self, batch: dict) -> tuple:
    """(args, kwargs) of the model's __call__ / hidden from a batch dict."""
    return (tuple(batch[k] for k in self.input_keys),
            {k: batch.get(k) for k in self.kwarg_keys})

  def pretrain_objective(self, cfg) -> str:
    """The data.objective `cfg` pre-trains with: the family's, 'mlm' for a bidirectional stack
    (gpt with causal=False) or 'prefix_lm' for a prefix LM (gpt with prefix_lm=True): the
    mask is the only difference."""
    if not cfg.causal:
      return 'mlm'
    return 'prefix_lm' if cfg.prefix_lm else self.objective

  @property
  def classifier(self) -> Head | None:
    """The sequence-classification head (switched on by model.num_classes), or None: the
    family classifies text to text (T5), with no head a linear probe could train."""
    return next((h for h in self.heads if h.enabled == 'num_classes'), None)

  def active_heads(self, cfg) -> tuple:
    return tuple(h for h in self.heads if getattr(cfg, h.enabled))

  def lengths(self, batch: dict) -> tuple:
    """(batch size, input length, target length or 0) of a batch (arrays or shapes)."""
    def shape(k):
      return np.shape(batch[k])
    batch_size, length = shape(self.input_keys[0])[:2]
    target_len = shape(self.target_key)[1] if self.target_key != 'targets' else 0
    return batch_size, length, target_len

  def init_batch(self, length: int, nsp: bool = False) -> dict:
    """A (1, length) batch of ones in this family's layout: enough to size every parameter."""
    return self.example_batch(np.ones((1, length + 1), np.int32), None, nsp=nsp)

