"""Layers shared by the three families. Every parameter carries logical axis names."""
import functools
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from pretrain_jax import ops
from pretrain_jax.models import masks
from pretrain_jax.models.attention import dot_product_attention, runnable_implementation
from pretrain_jax.models.config import ModelConfig

Init = nn.initializers


def param_init(cfg: ModelConfig, fan_in: int | None = None, scale: float = 1.0):
  """Kernel init: normal(0.02) (BERT/GPT-2); with kernel_init='fan_in', normal(1/sqrt(fan_in))
  (T5, as in Mesh TensorFlow); with 'torch_default', uniform(+-1/sqrt(fan_in)) as PyTorch's
  nn.Linear (`scale` ignored: PyTorch does not shrink residual outputs). `scale` shrinks
  residual-output layers."""
  if fan_in is not None and cfg.kernel_init == 'torch_default':
    return _uniform(fan_in ** -0.5)
  if fan_in is not None and cfg.kernel_init == 'fan_in':
    return Init.normal(scale * fan_in ** -0.5)
  return Init.normal(0.02 * scale)


def _uniform(bound: float):
  """U(-bound, bound): PyTorch's default for nn.Linear weights and biases."""
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound,
                                                                  bound)


def partitioned(init, names):
  return nn.with_logical_partitioning(init, names)


def dense(cfg, features, in_names, out_names, name, *, axis=-1, fan_in=None, scale=1.0,
          init=None, use_bias=None):
  """DenseGeneral whose kernel is named in_names + out_names and bias out_names.

  The kernel starts from `init`, else param_init(cfg, fan_in, scale); the bias from zeros, or
  with kernel_init='torch_default' from U(+-1/sqrt(fan_in)) as PyTorch's nn.Linear.
  """
  use_bias = cfg.dense_bias if use_bias is None else use_bias
  bias_init = Init.zeros
  if cfg.kernel_init == 'torch_default':
    if fan_in is None:
      raise ValueError(f'dense layer {name!r}: kernel_init=torch_default needs its fan_in')
    bias_init = _uniform(fan_in ** -0.5)
  return Dense2D(
      features=features, axis=axis, use_bias=use_bias, dtype=cfg.dtype,
      param_dtype=cfg.param_dtype, name=name,
      kernel_init=partitioned(init or param_init(cfg, fan_in, scale),
                              tuple(in_names) + tuple(out_names)),
      bias_init=partitioned(bias_init, tuple(out_names)))


class Dense2D(nn.DenseGeneral):
  """nn.DenseGeneral (same parameters, names and shapes) computed as ONE 2-D matmul:
  (..., *in) -> (prod(...), prod(in)) @ kernel (prod(in), prod(out)) -> (..., *out), by
  ops.matmul (the backend's form of its weight gradient)."""

  @nn.compact
  def __call__(self, inputs):
    features = self.features if isinstance(self.features, tuple) else (self.features,)
    axis = self.axis if isinstance(self.axis, tuple) else (self.axis,)
    n_in = len(axis)
    if sorted(a % inputs.ndim for a in axis) != list(range(inputs.ndim - n_in, inputs.ndim)):
      raise ValueError(f'Dense2D contracts trailing axes; got axis={self.axis}')
    in_shape, batch_shape = inputs.shape[-n_in:], inputs.shape[:-n_in]
    kernel = self.param('kernel', self.kernel_init, in_shape + features, self.param_dtype)
    k_in, k_out = int(np.prod(in_shape)), int(np.prod(features))
    x = inputs.astype(self.dtype).reshape(-1, k_in)                          # (M, K)
    y = ops.matmul(x, kernel.astype(self.dtype).reshape(k_in, k_out))        # (M, F)
    if self.use_bias:
      bias = self.param('bias', self.bias_init, features, self.param_dtype)
      y = y + bias.astype(self.dtype).reshape(k_out)
    return y.reshape(batch_shape + features)


class LMHead(NamedTuple):
  """What an LM head computes its logits from, for a loss that computes them itself
  (training/fused_loss.py): float32 logits = hidden @ kernel (+ bias), the operands in `dtype`.
  Each family's `head_inputs(hidden)` returns it; its `logits(hidden)` is the same head."""
  hidden: jax.Array            # (..., E): what the kernel multiplies (after any transform)
  kernel: jax.Array            # (V, E) when vocab_first (a tied embedding), else (E, V)
  bias: jax.Array | None       # (V,) or None
  vocab_first: bool
  dtype: Any                   # the operands' dtype (the model's compute dtype)


def dense_head(dense: Dense2D, hidden) -> LMHead:
  """The LMHead of a (bound) Dense2D (E -> V) applied to hidden."""
  params = dense.variables['params']
  return LMHead(hidden, nn.unbox(params['kernel']), nn.unbox(params.get('bias')), False,
                dense.dtype)


def embedding_head(embedding: nn.Embed, hidden) -> LMHead:
  """The LMHead of embedding.attend(hidden): the tied table (V, E)."""
  return LMHead(hidden, embedding.embedding, None, True, embedding.dtype)


def norm(cfg: ModelConfig, name: str):
  """cfg.norm: 'layernorm' (BERT, GPT) or 'rmsnorm', without bias (T5); statistics in fp32."""
  if cfg.norm == 'rmsnorm':
    return nn.RMSNorm(epsilon=cfg.layer_norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                      scale_init=partitioned(Init.ones, ('embed',)), name=name)
  return nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                      scale_init=partitioned(Init.ones, ('embed',)),
                      bias_init=partitioned(Init.zeros, ('embed',)), name=name)


def embed(cfg: ModelConfig, num: int, names, name: str, std: float = 0.02,
          one_hot: bool = False):
  """An embedding table (num, emb_dim). `one_hot` looks rows up by a one-hot matmul: for small
  tables (positions, token types) whose rows every batch hits many times, so the gradient is a
  matmul rather than a scatter-add of colliding rows (serialized atomics on GPUs)."""
  cls = OneHotEmbed if one_hot else Embed
  if cfg.kernel_init == 'torch_default':  # nn.Embedding: N(0, 1)
    std = 1.0
  return cls(num_embeddings=num, features=cfg.emb_dim, dtype=cfg.dtype,
             param_dtype=cfg.param_dtype, embedding_init=partitioned(Init.normal(std), names),
             name=name)


class Embed(nn.Embed):
  """nn.Embed (same parameter) that gathers rows in the parameter dtype and casts them after.

  nn.Embed casts the whole table to `dtype` first, so with bf16 compute the gradient is a bf16
  scatter-add, which GPUs run as compare-and-swap loops: rows that many tokens share ([MASK],
  ',', 'the') serialize, at a cost that can exceed the rest of the step (docs/performance.md).
  Gathered in f32, the gradient is an f32 scatter-add.
  """

  def __call__(self, inputs):                                            # (...) int
    if not jnp.issubdtype(inputs.dtype, jnp.integer):
      raise ValueError(f'embedding ids must be integers; got {inputs.dtype}')
    return jnp.take(self.embedding, inputs, axis=0).astype(self.dtype)   # (..., E)


class OneHotEmbed(nn.Embed):
  """nn.Embed (same parameter) whose lookup is one_hot(ids) @ table, exact in any dtype."""

  def __call__(self, inputs):                                            # (...) int
    one_hot = jax.nn.one_hot(inputs, self.num_embeddings, dtype=self.dtype)  # (..., num)
    return jnp.einsum('...n,ne->...e', one_hot, self.embedding.astype(self.dtype),
                      precision=jax.lax.Precision.HIGHEST)               # (..., E)


def token_embedding(cfg: ModelConfig, name: str):
  """(embedding module, scale applied to its output).

  With sinusoidal positions, tokens follow Vaswani et al.: init std d**-0.5, output scaled by
  sqrt(d), so token and (unit-amplitude) position signals are of the same size. Learned
  positions keep BERT/GPT-2's N(0, 0.02) with no scale, as the published checkpoints have.
  """
  if cfg.position_embedding == 'sinusoidal' and cfg.kernel_init != 'torch_default':
    return embed(cfg, cfg.vocab_size, ('vocab', 'embed'), name, cfg.emb_dim ** -0.5), \
        cfg.emb_dim ** 0.5
  return embed(cfg, cfg.vocab_size, ('vocab', 'embed'), name), 1.0


def sinusoidal_positions(positions: jnp.ndarray, dim: int) -> jnp.ndarray:
  """(B, T) integer positions -> (B, T, dim) sin/cos features (Vaswani et al.)."""
  half = dim // 2
  freqs = jnp.exp(-np.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)  # (D/2,)
  angles = positions[..., None].astype(jnp.float32) * freqs                         # (B, T, D/2)
  out = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
  return jnp.pad(out, [(0, 0)] * (out.ndim - 1) + [(0, dim - 2 * half)])


def alibi_slopes(num_heads: int, bias_max: float) -> np.ndarray:
  """ALiBi's per-head slopes (Press et al.; MPT's `gen_slopes`): 2**(-bias_max * h / N) for
  h = 1..N when N is a power of two; otherwise those of the next power of two, odd-numbered
  first, then even, cut to N (12 heads, bias_max 8: 2**-1 ... 2**-8, then 2**-0.5 ... 2**-3.5)."""
  padded = 1 << max(num_heads - 1, 0).bit_length()                     # next power of two
  slopes = 2.0 ** (-bias_max * np.arange(1, padded + 1) / padded)
  if padded != num_heads:
    slopes = np.concatenate([slopes[1::2], slopes[::2]])[:num_heads]
  return slopes.astype(np.float32)                                      # (N,)


def alibi_bias(length: int, num_heads: int, bias_max: float) -> jnp.ndarray:
  """Symmetric ALiBi, as MosaicBERT: (1, N, T, T) float32 logit bias -slope_h * |i - j| (the
  matrix of masks.AlibiBias(alibi_slopes(...))). Every head starts out preferring nearby
  tokens; the steepest sees little beyond a few neighbours.

  It reads row indices, not positions: within a packed document positions run on by one, so
  |i - j| is the distance between positions wherever the segment mask lets i see j, and one
  (1, N, T, T) constant, computed inside the program (not embedded in it), serves the whole
  batch with no gradient. (A row with padding in its middle, which no pipeline here makes,
  would count the gap.)"""
  return masks.AlibiBias(alibi_slopes(num_heads, bias_max)).dense(length, length)


def constrain(x, *names):
  """x sharded by its logical axis names (one per axis) under the mesh's rules: the batch over
  the data axes ('batch' takes fsdp first, so the activations' 'embed' is not split). Without
  it XLA's sharding propagation may follow the fsdp-sharded weights instead, splitting the
  features and gathering the whole global batch's activations onto every chip (8x the bytes
  per row with fsdp 8). Outside a mesh (CPU tests, inference) it is x."""
  return nn.with_logical_constraint(x, names) if x.ndim == len(names) else x


def activation_fn(name: str):
  return {'gelu': functools.partial(nn.gelu, approximate=False),
          'gelu_tanh': functools.partial(nn.gelu, approximate=True),
          'relu': nn.relu,
          'gated-gelu': functools.partial(nn.gelu, approximate=True),
          'gated-relu': nn.relu}[name]


class MLP(nn.Module):
  """Feed-forward block: act(x W_i) W_o, or gated act(x W_i0) * (x W_i1) W_o (T5 v1.1)."""
  cfg: ModelConfig
  out_scale: float = 1.0

  @nn.compact
  def __call__(self, x):                                    # (B, T, E)
    cfg = self.cfg
    act = activation_fn(cfg.activation)
    def wi(name):
      return dense(cfg, cfg.mlp_dim, ['embed'], ['mlp'], name, fan_in=cfg.emb_dim)
    if cfg.activation.startswith('gated'):
      h = (act(checkpoint_name(wi('wi_0')(x), 'mlpwi_0'))
           * checkpoint_name(wi('wi_1')(x), 'mlpwi_1'))
    else:
      h = act(checkpoint_name(wi('wi')(x), 'mlpwi'))        # (B, T, F)
    h = constrain(h, 'batch', 'length', 'mlp')
    h = ops.Dropout(cfg.dropout_rate if cfg.mlp_dropout else 0.0)(
        h, deterministic=cfg.deterministic)
    out = dense(cfg, cfg.emb_dim, ['mlp'], ['embed'], 'wo', fan_in=cfg.mlp_dim,
                scale=self.out_scale)(h)                    # (B, T, E)
    return checkpoint_name(out, 'mlpwo')


class MultiHeadAttention(nn.Module):
  """Self- or cross-attention around the shared core; the mask (a masks.AttentionMask: causal
  flag, segment ids, prefix, bias) comes from the caller.

  In decode mode, self-attention stores this call's keys/values at `decode_index` in the
  `cache` collection and attends over the whole cache (the caller's mask says which keys).
  """
  cfg: ModelConfig
  out_scale: float = 1.0

  @nn.compact
  def __call__(self, x_q, x_kv, mask, decode_index=None):  # (B, T, E), (B, S, E)
    cfg = self.cfg
    heads = (cfg.num_heads, cfg.head_dim)
    # fold_query_scale (T5): no 1/sqrt(H) logit scale; the query init carries it.
    q_init = param_init(cfg, cfg.emb_dim * (cfg.head_dim if cfg.fold_query_scale else 1))
    def proj(name, **kw):
      return dense(cfg, heads, ['embed'], ['heads', 'kv'], name,
                   fan_in=cfg.emb_dim, **kw)
    q = checkpoint_name(proj('query', init=q_init)(x_q), 'query_proj')   # (B, T, N, H)
    k = checkpoint_name(proj('key')(x_kv), 'key_proj')                   # (B, S, N, H)
    v = checkpoint_name(proj('value')(x_kv), 'value_proj')
    if decode_index is not None:
      k, v = self._cached(k, v, decode_index)
    dropout_rng = None
    if not cfg.deterministic and cfg.attention_dropout_rate > 0:
      dropout_rng = self.make_rng('dropout')
    out = dot_product_attention(
        q, k, v, mask, scale=1.0 if cfg.fold_query_scale else None,
        dropout_rate=cfg.attention_dropout_rate, dropout_rng=dropout_rng,
        implementation=cfg.attention_impl)                                   # (B, T, N, H)
    out = checkpoint_name(out, 'context')
    out = dense(cfg, cfg.emb_dim, ['heads', 'kv'], ['embed'], 'out', axis=(-2, -1),
                fan_in=cfg.num_heads * cfg.head_dim, scale=self.out_scale)(out)
    return checkpoint_name(out, 'out_proj')                                  # (B, T, E)

  def _cached(self, k, v, index):
    """Write (B, T, N, H) keys/values at `index` into the cache; return the whole cache."""
    initialized = self.has_variable('cache', 'cached_key')
    cached_k = self.variable('cache', 'cached_key', jnp.zeros, k.shape, k.dtype)
    cached_v = self.variable('cache', 'cached_value', jnp.zeros, v.shape, v.dtype)
    if not initialized:  # the init call sizes the cache with its (B, max_decode_len) input
      return k, v
    start = (0, index, 0, 0)
    cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k.astype(cached_k.value.dtype),
                                                  start)
    cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v.astype(cached_v.value.dtype),
                                                  start)
    return cached_k.value, cached_v.value


def _with_kernels(policy):
  """`policy`, and the attention kernels' residuals kept (masks.KERNEL_RESIDUALS: the
  output and its (B, N, T) logsumexp), so the backward does not run the forward kernel again,
  a rerun the compiler's FLOPs would not show (it counts none in a Mosaic kernel)."""
  return jax.checkpoint_policies.save_from_both_policies(
      policy, jax.checkpoint_policies.save_only_these_names(masks.KERNEL_RESIDUALS))


_policies = jax.checkpoint_policies
ATTENTION_NAMES = ('query_proj', 'key_proj', 'value_proj', 'context', 'out_proj')
# model.remat -> what each layer keeps for the backward pass; the rest it recomputes. The names
# are the checkpoint_name tags above (MaxText's): query_proj, key_proj, value_proj, context
# (the attention output), out_proj, mlpwi (mlpwi_0, mlpwi_1 when gated), mlpwo.
REMAT = {
    # every matmul's output (batched ones too: a reference attention's logits); elementwise
    # ops (LayerNorm, GELU, residual adds, bias adds) recomputed, as XLA's fusion does in an
    # unrolled program. Applied under scan only (apply_stack).
    'none': _with_kernels(_policies.dots_saveable),
    'minimal_with_context': _with_kernels(_policies.save_from_both_policies(
        _policies.dots_with_no_batch_dims_saveable, _policies.save_only_these_names('context'))),
    'minimal': _with_kernels(_policies.dots_with_no_batch_dims_saveable),
    # MaxText's save_dot_with_context_except_mlp: the attention's projections and output kept,
    # the MLP recomputed
    'save_dot_except_mlp': _with_kernels(_policies.save_only_these_names(*ATTENTION_NAMES)),
    'full': _policies.nothing_saveable,
}


def apply_stack(block_cls, cfg: ModelConfig, num_layers: int, name: str, x, *args, **fields):
  """Run `num_layers` copies of `block_cls(cfg, **fields)` on x; args are shared by every layer.

  A block maps (x, *args) -> (x, None). With cfg.scan_layers the copies are one nn.scan, so
  parameters gain a leading 'layers' axis and compile time does not grow with depth; otherwise
  they are `{name}_0 ... {name}_{L-1}`. cfg.remat names the policy (REMAT) each copy runs
  under. An unrolled 'none' runs the block as it is; a scanned one runs it under REMAT['none']:
  without a policy, nn.scan's partial evaluation keeps every intermediate the backward reads
  (float32 LayerNorm and GELU ones among them) as stacked loop outputs, several times the bytes
  of the unrolled program, whose fusions recompute them.
  """
  block = block_cls
  if cfg.remat != 'none' or cfg.scan_layers:
    block = nn.remat(block, policy=REMAT[cfg.remat], prevent_cse=not cfg.scan_layers)
  if cfg.scan_layers:
    stack = nn.scan(block, variable_axes={'params': 0, 'cache': 0},
                    split_rngs={'params': True, 'dropout': True},
                    in_axes=(nn.broadcast,) * len(args), length=num_layers,
                    metadata_params={nn.PARTITION_NAME: 'layers'})
    x, _ = stack(cfg, name=name, **fields)(constrain(x, 'batch', 'length', 'embed'), *args)
    return constrain(x, 'batch', 'length', 'embed')
  for i in range(num_layers):
    x = constrain(x, 'batch', 'length', 'embed')
    x, _ = block(cfg, name=f'{name}_{i}', **fields)(x, *args)
  return constrain(x, 'batch', 'length', 'embed')


def attention_path(cfg: ModelConfig, *, bias: bool = False) -> str:
  """The attention path (attention.runnable_implementation) cfg's training-shaped attentions
  run on, on the platform of the ops form in effect; `bias`: those with an additive bias (T5's
  relative one, ALiBi)."""
  return runnable_implementation(
      cfg.attention_impl, dtype=cfg.dtype, bias=bias,
      dropout=not cfg.deterministic and cfg.attention_dropout_rate > 0,
      backend=ops.current().platform)


def stack_bias(cfg: ModelConfig, bias, q_len: int, kv_len: int, rows: int | None = None):
  """The bias every layer of a stack adds, in the form its attention path reads: the value
  itself (masks.RelativeBias, masks.AlibiBias) where a kernel computes it per block ('flash'),
  else its (1, N, T, S) matrix, made once for the whole stack; broadcast to (rows, N, T, S)
  with the ops form's bias_per_row on the reference path (ops/backends.py says why)."""
  path = attention_path(cfg, bias=True)
  if path == 'flash':
    return bias
  dense = bias.dense(q_len, kv_len)
  if rows is None or not ops.current().bias_per_row or path != 'reference':
    return dense
  return jnp.broadcast_to(dense, (rows,) + dense.shape[1:])


class DecodeCache(nn.Module):
  """Decode-mode bookkeeping of a causal stack (GPT, the T5 decoder), owned by the model top.

  Keeps `cache_index` and the cached keys' segment ids (and, for a prefix LM, their prefix
  flags) in its own scope of the `cache` collection, appends this call's (B, T) segment ids at
  the index and returns (mask (B, 1, T, S), index, positions): causal over cache slots, or
  bidirectional among prefix tokens (the prompt of a prefix LM), restricted to real tokens of
  the same segment, and positions that count only real tokens (masks.positions_from_mask), so
  left-padded prompts start at position 0. The first (init) call sizes the cache with its
  (B, max_decode_len) input. The mask is a dense matrix over the cache: decoding runs on the
  paths that read one (attention.kernel_readable).
  """
  prefix_lm: bool = False

  @nn.compact
  def __call__(self, segment_ids, prefix=None):                          # (B, T)
    batch, length = segment_ids.shape
    initialized = self.has_variable('cache', 'cache_index')
    index = self.variable('cache', 'cache_index', lambda: jnp.zeros((), jnp.int32))
    cached = self.variable('cache', 'cached_segment_ids', jnp.zeros, (batch, length), jnp.int32)
    if self.prefix_lm:
      cached_prefix = self.variable('cache', 'cached_prefix', jnp.zeros, (batch, length),
                                    jnp.int32)
    prefix = jnp.zeros_like(segment_ids) if prefix is None else prefix
    if not initialized:
      mask = masks.AttentionMask(q_segment_ids=segment_ids, causal=True,
                                 prefix=prefix if self.prefix_lm else None).dense(length, length)
      return mask, index.value, masks.positions_from_mask(jnp.ones((batch, length)))
    i = index.value
    cached.value = jax.lax.dynamic_update_slice(cached.value, segment_ids.astype(jnp.int32),
                                                (0, i))
    positions = jax.lax.dynamic_slice_in_dim(masks.positions_from_mask(cached.value), i, length,
                                             axis=1)
    visible = masks.causal_mask(length, cached.value.shape[1], i)
    if self.prefix_lm:
      cached_prefix.value = jax.lax.dynamic_update_slice(
          cached_prefix.value, (prefix > 0).astype(jnp.int32), (0, i))
      both = (prefix > 0)[:, :, None] & (cached_prefix.value > 0)[:, None, :]
      visible = jnp.logical_or(visible, both[:, None])
    mask = masks.combine_masks(visible, masks.segment_mask(segment_ids, cached.value))
    index.value = i + length
    return mask, i, positions
