"""The frozen model dataclass: the one boundary between ml_collections configs and modules."""
import dataclasses
import numbers
from typing import Any

import jax.numpy as jnp

from pretrain_jax.models.attention import IMPLEMENTATIONS

FAMILIES = ('bert', 'gpt', 't5')
ACTIVATIONS = ('gelu', 'gelu_tanh', 'relu', 'gated-gelu', 'gated-relu')
POSITION_EMBEDDINGS = ('learned', 'sinusoidal', 'relative', 'alibi')
FAMILY_POSITIONS = {'bert': ('learned', 'sinusoidal', 'alibi'), 'gpt': ('learned', 'sinusoidal'),
                    't5': ('relative',)}
REMAT_POLICIES = ('none', 'minimal', 'full')
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


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  family: str
  vocab_size: int
  num_layers: int
  emb_dim: int
  num_heads: int
  head_dim: int
  mlp_dim: int
  max_len: int = 512
  num_decoder_layers: int = 0           # T5 only; 0 = same as num_layers
  dtype: Any = jnp.float32               # compute dtype
  param_dtype: Any = jnp.float32         # storage dtype
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
  remat: str = 'none'                    # rematerialisation of each layer
  deterministic: bool = True             # no dropout (eval); training uses .replace(False)
  decode: bool = False                   # key/value cache, one new token per call

  def __post_init__(self):
    for name, value in FAMILY_LAYER_DEFAULTS.get(self.family, {}).items():
      if getattr(self, name) is None:
        object.__setattr__(self, name, value)
    def check(ok, what, value, expected):
      if not ok:
        raise ValueError(f'model.{what}={value!r}; expected {expected}')
    check(self.family in FAMILIES, 'family', self.family, f'one of {FAMILIES}')
    check(self.activation in ACTIVATIONS, 'activation', self.activation, f'one of {ACTIVATIONS}')
    check(self.position_embedding in POSITION_EMBEDDINGS, 'position_embedding',
          self.position_embedding, f'one of {POSITION_EMBEDDINGS}')
    check(self.kernel_init in KERNEL_INITS, 'kernel_init', self.kernel_init,
          f'one of {KERNEL_INITS}')
    check(self.norm in NORMS, 'norm', self.norm, f'one of {NORMS}')
    check(self.attention_impl in IMPLEMENTATIONS, 'attention_impl', self.attention_impl,
          f'one of {IMPLEMENTATIONS}')
    check(self.remat in REMAT_POLICIES, 'remat', self.remat, f'one of {REMAT_POLICIES}')
    for name in ('vocab_size', 'num_layers', 'emb_dim', 'num_heads', 'head_dim', 'mlp_dim',
                 'max_len'):
      value = getattr(self, name)
      check(isinstance(value, int) and value > 0, name, value, 'a positive integer')
    check(isinstance(self.num_classes, int) and self.num_classes >= 0, 'num_classes',
          self.num_classes, 'a non-negative integer (0 = no classification head)')
    check(not self.num_classes or self.family != 't5', 'num_classes', self.num_classes,
          '0 for t5 (it classifies text-to-text, by decoding the label)')
    check(0.0 <= self.dropout_rate < 1.0, 'dropout_rate', self.dropout_rate, 'in [0, 1)')
    check(0.0 <= self.attention_dropout_rate < 1.0, 'attention_dropout_rate',
          self.attention_dropout_rate, 'in [0, 1)')
    check(self.kernel_init != 'torch_default' or self.family == 'gpt', 'kernel_init',
          self.kernel_init, "'normal' or 'fan_in' for bert/t5 ('torch_default' is the gpt "
          "stack's, for the chapter-41 experiment)")
    check(self.causal or self.family == 'gpt', 'causal', self.causal,
          'True for bert/t5 (bert is bidirectional by design; a bidirectional gpt stack is '
          'family=gpt, causal=False)')
    check(not self.prefix_lm or (self.family == 'gpt' and self.causal), 'prefix_lm',
          self.prefix_lm, 'False except for a causal gpt (family=gpt, causal=True)')
    check(self.causal or not self.decode, 'causal', self.causal,
          'True to decode with a key/value cache (a bidirectional stack has no left-to-right '
          'generation)')
    check(self.position_embedding in FAMILY_POSITIONS[self.family], 'position_embedding',
          self.position_embedding, f'one of {FAMILY_POSITIONS[self.family]} for {self.family}')
    check(isinstance(self.alibi_bias_max, numbers.Real) and not isinstance(
        self.alibi_bias_max, bool) and 0 < self.alibi_bias_max <= 64, 'alibi_bias_max',
          self.alibi_bias_max, 'a number in (0, 64] (the steepest slope is 2**-(it / N); '
          'beyond 64 every slope is ~0: no position signal)')

  @property
  def decoder_layers(self) -> int:
    return self.num_decoder_layers or self.num_layers

  def replace(self, **kw) -> 'ModelConfig':
    return dataclasses.replace(self, **kw)

  def to_dict(self) -> dict:
    """The inverse of from_config: a plain config.model dict (dtypes by name, no eval/decode
    switches)."""
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
           if f.name not in ('deterministic', 'decode')}
    for key in ('dtype', 'param_dtype'):
      out[key] = jnp.dtype(out[key]).name
    return out

  @classmethod
  def from_config(cls, model_config) -> 'ModelConfig':
    """ml_collections `config.model` -> ModelConfig; unknown keys are an error."""
    kw = dict(model_config.to_dict() if hasattr(model_config, 'to_dict') else model_config)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(kw) - names)
    if unknown:
      raise ValueError(f'unknown config.model keys {unknown}; expected a subset of '
                       f'{sorted(names)}')
    for key in ('dtype', 'param_dtype'):
      if key in kw and isinstance(kw[key], str):
        if kw[key] not in DTYPES:
          raise ValueError(f'model.{key}={kw[key]!r}; expected one of {sorted(DTYPES)}')
        kw[key] = DTYPES[kw[key]]
    return cls(**kw)
