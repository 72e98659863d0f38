"""The frozen model dataclass: the one boundary between ml_collections configs and modules."""
import dataclasses
from typing import Any, ClassVar

import jax.numpy as jnp

from pretrain_jax.models.attention import IMPLEMENTATIONS
from pretrain_jax.sections import Section

FAMILIES = ('bert', 'gpt', 't5')
ACTIVATIONS = ('gelu', 'gelu_tanh', 'relu', 'gated-gelu', 'gated-relu')
POSITION_EMBEDDINGS = ('learned', 'sinusoidal', 'relative', 'alibi')
FAMILY_POSITIONS = {'bert': ('learned', 'sinusoidal', 'alibi'), 'gpt': ('learned', 'sinusoidal'),
                    't5': ('relative',)}
# model.remat, from the least recomputed to the most (layers.REMAT says what each keeps)
REMAT_POLICIES = ('none', 'minimal_with_context', 'minimal', 'save_dot_except_mlp', 'full')
KERNEL_INITS = ('normal', 'fan_in', 'torch_default')
NORMS = ('layernorm', 'rmsnorm')
# The layer choices of each family's published architecture, used where a config leaves a field
# None (configs/ set them explicitly; this keeps older config.json files and short test configs
# meaning what they meant). Shared layers read only these fields, never the family name.
FAMILY_LAYER_DEFAULTS = {
    'bert': dict(norm='layernorm', dense_bias=True, kernel_init='normal',
                 fold_query_scale=False, mlp_dropout=False, embedding_dropout=True),
    'gpt': dict(norm='layernorm', dense_bias=True, kernel_init='normal',
                fold_query_scale=False, mlp_dropout=False, embedding_dropout=True),
    't5': dict(norm='rmsnorm', dense_bias=False, kernel_init='fan_in',
               fold_query_scale=True, mlp_dropout=True, embedding_dropout=True),
}
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}
AUTO = 'auto'   # model.dtype: the compute dtype of the devices the model runs on (auto_dtype)
# NVIDIA GPUs from this compute capability on (Ampere) have bfloat16 tensor cores.
MIN_BF16_CAPABILITY = 8.0


def auto_dtype(device):
  """model.dtype='auto''s compute dtype on `device` (a jax.Device, or a platform name):
  bfloat16 where the matrix units compute it natively at full rate (TPUs; GPUs with bfloat16
  tensor cores), else float32 (CPUs, whose XLA emulates bfloat16 dots, and older GPUs)."""
  platform = getattr(device, 'platform', device)
  if platform == 'tpu':
    return jnp.bfloat16
  if platform != 'gpu':
    return jnp.float32
  capability = getattr(device, 'compute_capability', None)
  try:
    return jnp.float32 if float(capability) < MIN_BF16_CAPABILITY else jnp.bfloat16
  except (TypeError, ValueError):   # unknown (a platform name, another vendor's): bfloat16
    return jnp.bfloat16


@dataclasses.dataclass(frozen=True)
class ModelConfig(Section):
  """config.model: one family's sizes and layer choices (sections.Section: unknown keys are
  refused, missing ones take these defaults, so older config.json files load)."""
  family: str
  vocab_size: int
  num_layers: int
  emb_dim: int
  num_heads: int
  head_dim: int
  mlp_dim: int
  max_len: int = 512
  num_decoder_layers: int = 0           # T5 only; 0 = same as num_layers
  dtype: Any = AUTO                      # compute dtype: 'auto' (auto_dtype: bfloat16 on TPU
                                         # and GPU, float32 on CPU), 'float32', 'bfloat16'
  param_dtype: Any = jnp.float32         # parameter and optimizer-state storage dtype
  attention_impl: str = 'auto'           # see pretrain_jax.models.attention.IMPLEMENTATIONS
  activation: str = 'gelu'
  position_embedding: str = 'learned'
  kernel_init: str | None = None      # 'normal': N(0, 0.02) (BERT/GPT-2); 'fan_in':
                                         # N(0, 1/fan_in) (T5); 'torch_default' (gpt only):
                                         # PyTorch's nn.Linear U(+-1/sqrt(fan_in)) weights and
                                         # biases, nn.Embedding N(0, 1)
  norm: str | None = None             # 'layernorm' (BERT/GPT) or 'rmsnorm' (T5: no bias)
  dense_bias: bool | None = None      # biases on dense layers (T5: none)
  fold_query_scale: bool | None = None  # no 1/sqrt(head_dim) on logits; the query init
                                         # carries it (T5)
  mlp_dropout: bool | None = None     # dropout on the feed-forward activations (T5)
  embedding_dropout: bool | None = None  # dropout on the summed embeddings (all three
                                         # published models; the chapter-41 skeleton: none)
  causal: bool = True                    # gpt: causal self-attention; False = the same stack
                                         # bidirectional (a BERT-like encoder, trained with MLM)
  prefix_lm: bool = False                # gpt: each document's prefix (the batch's `prefix`
                                         # flags; at generation the prompt) sees itself both
                                         # ways, the rest causally (trained with prefix_lm)
  head_bias: bool = True                 # gpt with tie_embeddings=False: a bias on lm_head
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  layer_norm_eps: float = 1e-12
  tie_embeddings: bool = True
  type_vocab_size: int = 2               # BERT token types
  nsp: bool = False                      # BERT next-sentence head
  num_classes: int = 0                   # sequence classification head (BERT/GPT); 0 = none.
                                         # With one, __call__ returns (B, num_classes) logits
  alibi_bias_max: float = 8.0            # position_embedding='alibi' (bert): head h of N adds
                                         # -2**(-alibi_bias_max * h / N) * |i - j| to its logits
                                         # (N a power of two; else MPT's interleaving, see
                                         # layers.alibi_slopes; Press et al., MosaicBERT, MPT: 8)
  relative_buckets: int = 32             # T5 relative position bias
  relative_max_distance: int = 128
  scan_layers: bool = False              # nn.scan over layers (compile time flat in depth)
  remat: str = 'none'                    # what each layer keeps for the backward: REMAT_POLICIES
  deterministic: bool = True             # no dropout (eval); training uses .replace(False)
  decode: bool = False                   # key/value cache, one new token per call

  SECTION: ClassVar[str] = 'model'

  def __post_init__(self):
    for name, value in FAMILY_LAYER_DEFAULTS.get(self.family, {}).items():
      if getattr(self, name) is None:
        object.__setattr__(self, name, value)
    for name in ('dtype', 'param_dtype'):   # a name (config.json, the command line) or a type
      value = getattr(self, name)
      if isinstance(value, str) and not (name == 'dtype' and value == AUTO):
        self.check(value in DTYPES, name, ("'auto' or " if name == 'dtype' else '')
                   + f'one of {sorted(DTYPES)}')
        object.__setattr__(self, name, DTYPES[value])
    super().__post_init__()

  def validate(self):
    check = self.check
    check(self.family in FAMILIES, 'family', f'one of {FAMILIES}')
    check(self.activation in ACTIVATIONS, 'activation', f'one of {ACTIVATIONS}')
    check(self.position_embedding in POSITION_EMBEDDINGS, 'position_embedding',
          f'one of {POSITION_EMBEDDINGS}')
    check(self.kernel_init in KERNEL_INITS, 'kernel_init', f'one of {KERNEL_INITS}')
    check(self.norm in NORMS, 'norm', f'one of {NORMS}')
    check(self.attention_impl in IMPLEMENTATIONS, 'attention_impl', f'one of {IMPLEMENTATIONS}')
    check(self.remat in REMAT_POLICIES, 'remat', f'one of {REMAT_POLICIES}')
    for name in ('vocab_size', 'num_layers', 'emb_dim', 'num_heads', 'head_dim', 'mlp_dim',
                 'max_len'):
      check(getattr(self, name) > 0, name, 'a positive integer')
    check(self.num_classes >= 0, 'num_classes',
          'a non-negative integer (0 = no classification head)')
    check(not self.num_classes or self.family != 't5', 'num_classes',
          '0 for t5 (it classifies text-to-text, by decoding the label)')
    check(0.0 <= self.dropout_rate < 1.0, 'dropout_rate', 'in [0, 1)')
    check(0.0 <= self.attention_dropout_rate < 1.0, 'attention_dropout_rate', 'in [0, 1)')
    check(self.kernel_init != 'torch_default' or self.family == 'gpt', 'kernel_init',
          "'normal' or 'fan_in' for bert/t5 ('torch_default' is the gpt stack's, for the "
          'chapter-41 experiment)')
    check(self.causal or self.family == 'gpt', 'causal',
          'True for bert/t5 (bert is bidirectional by design; a bidirectional gpt stack is '
          'family=gpt, causal=False)')
    check(not self.prefix_lm or (self.family == 'gpt' and self.causal), 'prefix_lm',
          'False except for a causal gpt (family=gpt, causal=True)')
    check(self.causal or not self.decode, 'causal',
          'True to decode with a key/value cache (a bidirectional stack has no left-to-right '
          'generation)')
    check(self.position_embedding in FAMILY_POSITIONS[self.family], 'position_embedding',
          f'one of {FAMILY_POSITIONS[self.family]} for {self.family}')
    check(0 < self.alibi_bias_max <= 64, 'alibi_bias_max',
          'a number in (0, 64] (the steepest slope is 2**-(it / N); beyond 64 every slope is '
          '~0: no position signal)')

  @property
  def decoder_layers(self) -> int:
    return self.num_decoder_layers or self.num_layers

  def resolved(self, device) -> 'ModelConfig':
    """This config with a concrete compute dtype for `device` (a jax.Device or a platform
    name): dtype='auto' becomes auto_dtype(device), an explicit dtype stays. The one place
    'auto' is resolved: training.step.make_steps (its mesh's devices, so `plan` compiles what
    a TPU would), load.Pretrained.evaluate (its parameters' device) and models.build (the
    default device, for a config nobody resolved) call it."""
    return self.replace(dtype=auto_dtype(device)) if self.dtype == AUTO else self

  def to_dict(self) -> dict:
    """The config.model dict from_config reads back: dtypes by name, no eval/decode switches."""
    out = super().to_dict()
    for key in ('deterministic', 'decode'):
      del out[key]
    for key in ('dtype', 'param_dtype'):
      out[key] = out[key] if out[key] == AUTO else jnp.dtype(out[key]).name
    return out
