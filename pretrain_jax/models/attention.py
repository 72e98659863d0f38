"""The ONE attention core shared by BERT, GPT and T5.

`dot_product_attention` is a pure function; the mask and bias are arguments, so the same code
serves bidirectional, causal, packed, padded, cross and relative-position attention.
"""

import jax
import jax.numpy as jnp

from pretrain_jax.models import masks
from pretrain_jax.tuning import backends

IMPLEMENTATIONS = ('reference', 'xla', 'cudnn')


def dot_product_attention(query, key, value, *, mask=None, causal=False, bias=None, scale=None,
                          dropout_rng=None, dropout_rate=0.0, deterministic=True,
                          implementation='reference', dropout_fn=backends.dropout):
  """softmax(scale * q.k + bias, masked) . v

  Args:
    query: (B, T, N, H) queries.
    key: (B, S, N, H) keys.
    value: (B, S, N, H) values.
    mask: bool, broadcastable to (B, N, T, S); True = attend. None = attend everywhere.
    causal: the caller's causal part of the mask, given in factored form: the effective mask
      is `mask AND masks.causal_mask(T, S)` (query i sees keys j <= i). Kernels that can skip
      the hidden blocks (cuDNN) get it as a flag; the other paths materialize it. The core
      never assumes it: callers that want causality say so.
    bias: float, broadcastable to (B, N, T, S), added to the logits (T5's relative positions).
    scale: logit scale; None = 1/sqrt(H). T5 passes 1.0 (its init folds the scale in).
    dropout_rng, dropout_rate, deterministic: dropout on the attention probabilities, drawn by
      dropout_fn(probs, dropout_rng, dropout_rate) (default flax.linen.Dropout's; layers pass
      their ModelConfig's tuning.dropout).
    implementation: 'reference' (einsum + softmax in fp32), 'xla' or 'cudnn'
      (`jax.nn.dot_product_attention`; no attention dropout; 'cudnn' runs as 'xla' where the
      backend is not a GPU: runnable_implementation). Room for TPU Pallas kernels here.

  Returns:
    (B, T, N, H) in the query's dtype. A query row whose mask sees no key returns zeros.
  """
  requested, implementation = implementation, runnable_implementation(implementation)
  if requested == 'cudnn' and query.dtype not in (jnp.bfloat16, jnp.float16):
    # Checked on every backend, so a CPU smoke test of a GPU config finds it too.
    raise ValueError(f"attention implementation 'cudnn' needs bfloat16 or float16 queries, "
                     f'keys and values (cuDNN fused attention); got {query.dtype}: set '
                     "model.dtype=bfloat16, or attention_impl='xla'")
  scale = query.shape[-1] ** -0.5 if scale is None else scale
  use_dropout = not deterministic and dropout_rate > 0.0
  full_mask = mask
  if causal:
    full_mask = masks.combine_masks(mask, masks.causal_mask(query.shape[1], key.shape[1]))
  if implementation == 'reference':
    out = _reference(query, key, value, full_mask, bias, scale, dropout_rng, dropout_rate,
                     use_dropout, dropout_fn)
  else:
    if use_dropout:
      raise ValueError(f'attention implementation {requested!r} has no attention '
                       f'dropout (rate {dropout_rate}); set model.attention_impl=\'reference\' '
                       '(implementation=\'reference\' in a direct call) or '
                       'model.attention_dropout_rate=0')
    if bias is not None:
      bias = bias.astype(query.dtype)
    # cuDNN skips the blocks above the diagonal when told the mask is causal; XLA's path
    # materializes the same mask, so it gets the full one.
    cudnn = implementation == 'cudnn' and query.shape[1] == key.shape[1]
    out = jax.nn.dot_product_attention(query, key, value, bias=bias,
                                       mask=mask if cudnn else full_mask,
                                       is_causal=causal and cudnn, scale=scale,
                                       implementation=implementation)
  if full_mask is not None:  # rows that see nothing: zeros, not a uniform average or NaN
    sees_any = jnp.any(full_mask, axis=-1)             # (B|1, N|1, T); fused, never stored
    out = out * jnp.swapaxes(sees_any, -1, -2)[..., None].astype(out.dtype)  # (B|1, T, N|1, 1)
  return out


def runnable_implementation(implementation: str) -> str:
  """The implementation that runs here: 'cudnn' needs a GPU backend (NVIDIA's cuDNN); on CPU
  and TPU it runs as 'xla', the same computation with the same (absent) parameters, so a
  GPU config smoke-tests on a laptop and its checkpoints evaluate anywhere. The training loop
  says so when it happens (loop: a note line at start)."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f'attention implementation {implementation!r}; expected one of '
                     f'{IMPLEMENTATIONS}')
  if implementation == 'cudnn' and jax.default_backend() != 'gpu':
    return 'xla'
  return implementation


def _reference(query, key, value, mask, bias, scale, dropout_rng, dropout_rate, use_dropout,
               dropout_fn):
  logits = jnp.einsum('BTNH,BSNH->BNTS', query, key,
                      preferred_element_type=jnp.float32) * scale  # (B, N, T, S)
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1)
  if use_dropout:
    probs = dropout_fn(probs, dropout_rng, dropout_rate)
  return jnp.einsum('BNTS,BSNH->BTNH', probs.astype(value.dtype), value)
