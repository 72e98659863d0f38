"""The ONE attention core shared by BERT, GPT and T5.

`dot_product_attention` is a pure function; the mask (a `masks.AttentionMask`: causal flag,
segment ids, prefix, bias) is an argument, so the same code serves bidirectional, causal,
packed, padded, cross, relative-position and prefix-LM attention, on whichever path reads it:

    reference  einsum + softmax in fp32; materializes the (B, N, T, S) logits; any mask,
               bias and attention dropout
    xla        jax.nn.dot_product_attention's XLA path: the dense mask, any bias
    cudnn      jax.nn.dot_product_attention on NVIDIA GPUs (bf16 / fp16): causal as a flag,
               tail-padded one-document rows as sequence lengths, packed rows and prefixes
               as a dense mask, any bias
    splash     Pallas splash attention on TPU (models/splash.py): causal / full block masks
               and segment ids, no bias; off TPU it runs in Pallas's interpreter (tests)
    flash      a Pallas flash attention kernel on TPU (models/flash.py) that reads the whole
               value: causal flag, segment ids, prefix and a bias value (T5's relative bias,
               ALiBi) computed per block, its table's gradient reduced inside; off TPU in
               Pallas's interpreter (tests)
    auto       per backend, dtype and mask: `runnable_implementation`
"""
import jax
import jax.numpy as jnp

from pretrain_jax import ops
from pretrain_jax.models import masks

IMPLEMENTATIONS = ('auto', 'reference', 'xla', 'cudnn', 'splash', 'flash')
HALF = (jnp.bfloat16, jnp.float16)
# On XLA:CPU the einsum path trains GPT and T5 faster than jax.nn.dot_product_attention's XLA
# path, and BERT as fast (docs/performance.md, "Attention paths").
CPU_AUTO = 'reference'


def dot_product_attention(query, key, value, mask: masks.AttentionMask, *, scale=None,
                          dropout_rate: float = 0.0, dropout_rng=None,
                          implementation: str = 'auto'):
  """softmax(scale * q.k + mask's bias, where mask's parts allow) . v

  Args:
    query: (B, T, N, H) queries.
    key: (B, S, N, H) keys.
    value: (B, S, N, H) values.
    mask: who sees whom, a masks.AttentionMask (causal flag, segment ids, prefix, bias, a dense
      matrix); AttentionMask() sees everything. The core never assumes causality: callers
      that want it say so in the mask.
    scale: logit scale; None = 1/sqrt(H). T5 passes 1.0 (its init folds the scale in).
    dropout_rate, dropout_rng: dropout on the attention probabilities when both are given
      (a rate > 0 and a key): 'reference' only ('auto' picks it then), drawn by ops.dropout.
    implementation: one of IMPLEMENTATIONS; what runs is runnable_implementation's answer for
      the platform of the ops form in effect (ops.current().platform: the step's devices, or
      JAX's default backend).

  Returns:
    (B, T, N, H) in the query's dtype. A query row whose mask sees no key returns zeros.
  """
  _check_name(implementation)
  if not isinstance(mask, masks.AttentionMask):
    raise TypeError(f'dot_product_attention: mask of type {type(mask).__name__}; expected a '
                    'masks.AttentionMask (a bool matrix goes in as AttentionMask(dense_mask=...))')
  mask.check()
  t, s = query.shape[1], key.shape[1]
  use_dropout = dropout_rng is not None and dropout_rate > 0.0
  backend = ops.current().platform
  if implementation == 'cudnn' and query.dtype not in HALF:
    # Checked on every backend, so a CPU smoke test of a GPU config finds it too.
    raise ValueError(f"attention implementation 'cudnn' needs bfloat16 or float16 queries, "
                     f'keys and values (cuDNN fused attention); got {query.dtype}: set '
                     "model.dtype=bfloat16, or attention_impl='xla'")
  if use_dropout and implementation not in ('auto', 'reference'):
    raise ValueError(f'attention implementation {implementation!r} has no attention '
                     f'dropout (rate {dropout_rate}); set model.attention_impl=\'reference\' '
                     '(implementation=\'reference\' in a direct call) or '
                     'model.attention_dropout_rate=0')
  path = runnable_implementation(implementation, dtype=query.dtype,
                                 bias=mask.bias is not None,
                                 dense=not kernel_readable(mask, t, s), dropout=use_dropout,
                                 backend=backend)
  scale = query.shape[-1] ** -0.5 if scale is None else scale
  interpret = (backend or jax.default_backend()) != 'tpu'
  if path == 'reference':
    out = _reference(query, key, value, mask.dense(t, s), mask.dense_bias(t, s), scale,
                     dropout_rng if use_dropout else None, dropout_rate)
  elif path == 'splash':
    from pretrain_jax.models import splash  # noqa: PLC0415 (Pallas TPU ops: only where asked for)
    out = splash.attention(query, key, value, mask, scale, interpret=interpret)
  elif path == 'flash':
    from pretrain_jax.models import flash  # noqa: PLC0415 (Pallas TPU ops: only where asked for)
    out = flash.attention(query, key, value, mask, scale, interpret=interpret)
  else:
    out = _jax_nn(query, key, value, mask, scale, path)
  sees = mask.rows_that_see(t, s)        # rows that see nothing: zeros, not an average or NaN
  if sees is not None:
    out = jnp.where(sees[..., None], out, jnp.zeros((), out.dtype))
  return out


def runnable_implementation(implementation: str, *, dtype=jnp.float32, bias: bool = False,
                            dense: bool = False, dropout: bool = False,
                            backend: str = '') -> str:
  """The path that runs `implementation` here, for queries of `dtype` and a mask with a `bias`
  (a value: masks.RelativeBias, masks.AlibiBias), with a part no kernel reads (`dense`: an
  explicit matrix, e.g. the decode cache's, or a bias matrix) and attention `dropout` on.

  'auto': 'reference' while attention dropout is on (no kernel has it); on TPU 'splash', 'flash'
  where the mask has a bias, 'xla' where it has a dense part; on GPU 'cudnn' for bf16 / fp16,
  else 'xla'; on CPU CPU_AUTO. An explicit choice that cannot run here falls back, with the
  same result: 'cudnn' off GPUs runs as 'xla' (so a GPU config smoke-tests on a laptop and its
  checkpoints evaluate anywhere); 'splash' with a bias runs as 'flash'; 'splash' and 'flash'
  with a dense part run as 'xla', on a GPU as 'auto' picks, and on CPU in Pallas's
  interpreter. run/notes.py words each fallback for users.
  """
  _check_name(implementation)
  backend = backend or jax.default_backend()
  if implementation == 'auto':
    if dropout:
      return 'reference'
    if backend == 'tpu':
      return 'xla' if dense else 'flash' if bias else 'splash'
    if backend == 'gpu':
      return 'cudnn' if jnp.dtype(dtype) in map(jnp.dtype, HALF) else 'xla'
    return CPU_AUTO
  if implementation == 'cudnn' and backend != 'gpu':
    return 'xla'
  if implementation in ('splash', 'flash'):
    if backend == 'gpu':
      return runnable_implementation('auto', dtype=dtype, bias=bias, dense=dense,
                                     dropout=dropout, backend=backend)
    if dense:
      return 'xla'
    if bias:
      return 'flash'
  return implementation


def kernel_readable(mask: masks.AttentionMask, q_len: int, kv_len: int) -> bool:
  """Whether a kernel can take `mask` as it is: no explicit matrix (mask or bias), and causal
  only when queries and keys are the same positions."""
  return (mask.dense_mask is None and (mask.bias is None or mask.bias_is_value)
          and not (mask.causal and q_len != kv_len))


def _check_name(implementation: str) -> None:
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f'attention implementation {implementation!r}; expected one of '
                     f'{IMPLEMENTATIONS}')


def _jax_nn(query, key, value, mask, scale, implementation):
  """jax.nn.dot_product_attention ('xla' or 'cudnn'). cuDNN skips the blocks above the
  diagonal when told the mask is causal, so it gets the flag (not with a prefix, which makes
  exceptions to causality); XLA's path materializes the same mask, so it gets the whole one."""
  t, s = query.shape[1], key.shape[1]
  bias = mask.dense_bias(t, s)
  bias = None if bias is None else bias.astype(query.dtype)
  flag = implementation == 'cudnn' and mask.causal and mask.prefix is None and t == s
  if (implementation == 'cudnn' and mask.dense_mask is None and mask.prefix is None
      and mask.segments() is not None):
    return by_segments(query, key, value, bias, mask, scale, flag, implementation)
  return jax.nn.dot_product_attention(query, key, value, bias=bias,
                                      mask=mask.dense(t, s, causal=mask.causal and not flag),
                                      is_causal=flag, scale=scale, implementation=implementation)


def by_segments(query, key, value, bias, mask, scale, is_causal, implementation):
  """Segment ids to jax.nn.dot_product_attention without a mask tensor where possible.

  A batch whose rows each hold one document followed by padding (unpacked rows: fine-tuning,
  evaluation of single texts) goes as `query_seq_lengths` / `key_value_seq_lengths`, which
  cuDNN reads as a padding mask type (no (B, 1, T, S) tensor, no bias for every head); a batch
  with packed rows needs the segment mask, which cuDNN reads as a bias. A `lax.cond` on the
  segment ids picks one per batch.
  """
  q_seg, kv_seg = mask.segments()
  q_len, q_ok = document_lengths(q_seg)
  kv_len, kv_ok = document_lengths(kv_seg)

  def lengths(query, key, value, bias):
    return jax.nn.dot_product_attention(query, key, value, bias=bias, is_causal=is_causal,
                                        query_seq_lengths=q_len, key_value_seq_lengths=kv_len,
                                        scale=scale, implementation=implementation)

  def matrix(query, key, value, bias):
    return jax.nn.dot_product_attention(
        query, key, value, bias=bias, mask=masks.segment_mask(q_seg, kv_seg),
        is_causal=is_causal, scale=scale, implementation=implementation)

  return jax.lax.cond(q_ok & kv_ok, lengths, matrix, query, key, value, bias)


def document_lengths(segment_ids):
  """(B, T) segment ids -> (real tokens per row (B,) int32, whether every row is one document
  followed by padding: ids 1...1 0...0 ())."""
  n = jnp.sum(segment_ids > 0, axis=1, dtype=jnp.int32)
  one_document = jnp.where(jnp.arange(segment_ids.shape[1]) < n[:, None], 1, 0)
  return n, jnp.all(segment_ids == one_document)


def _reference(query, key, value, mask, bias, scale, dropout_rng, dropout_rate):
  logits = jnp.einsum('BTNH,BSNH->BNTS', query, key,
                      preferred_element_type=jnp.float32) * scale  # (B, N, T, S)
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1)
  if dropout_rng is not None:
    probs = ops.dropout(probs, dropout_rng, dropout_rate)
  return jnp.einsum('BNTS,BSNH->BTNH', probs.astype(value.dtype), value)
