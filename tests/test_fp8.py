"""fp8 dense layers (train.fp8, ops/fp8.py): what a CPU can check. The matmul's values and
gradients against a NumPy reference of the same rounding (ml_dtypes' float8 casts), its error
against float32 within fp8's precision, the model running on it, and the refusal off GPUs
with fp8 tensor cores. Whether XLA:GPU fuses it into cuBLASLt fp8 GEMMs, and its speed, need
an H100 (pretrain-jax benchmark --suite gpu --variants baseline,fp8)."""
import dataclasses

import commands
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from modeling import init, tiny, tokens

from configs import tiny_gpt
from pretrain_jax import ops
from pretrain_jax.models import build, family_of
from pretrain_jax.ops import backends, fp8
from pretrain_jax.run import workdir


def _q(a, dtype):
  """NumPy reference: a rounded to the fp8 `dtype` at scale max|a| / its largest value."""
  a = np.asarray(a, np.float32)
  scale = np.float32(np.abs(a).max() / float(jnp.finfo(dtype).max))
  return (a / scale).astype(dtype).astype(np.float32) * scale


def _operands():
  x = np.asarray(jax.random.normal(jax.random.key(0), (48, 96)), np.float32)
  w = np.asarray(jax.random.normal(jax.random.key(1), (96, 40)), np.float32) * 0.05
  dy = np.asarray(jax.random.normal(jax.random.key(2), (48, 40)), np.float32) * 1e-3
  return x, w, dy


def _rel(a, b):
  return float(np.linalg.norm(np.asarray(a) - b) / np.linalg.norm(b))


def test_fp8_matmul_is_the_dot_of_fp8_rounded_operands():
  x, w, _ = _operands()
  y = np.asarray(fp8.matmul(jnp.asarray(x), jnp.asarray(w)))
  e4m3 = jnp.float8_e4m3fn
  np.testing.assert_allclose(y, _q(x, e4m3) @ _q(w, e4m3), rtol=1e-5, atol=1e-6)
  assert 0.005 < _rel(y, x @ w) < 0.08      # e4m3 keeps 3 mantissa bits: ~2**-5 per element


def test_fp8_gradients_use_e5m2_output_gradients_and_the_forward_operands():
  x, w, dy = _operands()
  _, vjp = jax.vjp(fp8.matmul, jnp.asarray(x), jnp.asarray(w))
  dx, dw = (np.asarray(g) for g in vjp(jnp.asarray(dy)))
  qx, qw, qdy = _q(x, jnp.float8_e4m3fn), _q(w, jnp.float8_e4m3fn), _q(dy, jnp.float8_e5m2)
  np.testing.assert_allclose(dx, qdy @ qw.T, rtol=1e-5, atol=1e-9)
  np.testing.assert_allclose(dw, qx.T @ qdy, rtol=1e-5, atol=1e-9)
  assert 0.005 < _rel(dx, dy @ w.T) < 0.15  # e5m2 keeps 2 mantissa bits
  assert 0.005 < _rel(dw, x.T @ dy) < 0.15


def test_fp8_matmul_of_zeros_is_zeros_and_keeps_bf16():
  y = fp8.matmul(jnp.zeros((4, 8), jnp.bfloat16), jnp.ones((8, 2), jnp.bfloat16))
  assert y.dtype == jnp.bfloat16 and not np.any(np.asarray(y, np.float32))


def test_a_model_on_fp8_dense_layers_is_within_fp8_precision_of_plain():
  cfg = tiny('gpt')
  params = init(cfg, length=8)
  family = family_of(cfg)
  args, kwargs = family.model_inputs(family.example_batch(np.asarray(tokens((2, 9)))))
  on_fp8 = dataclasses.replace(backends.PLAIN, name='fp8', matmul=fp8.matmul)
  def apply(params):
    return build(cfg).apply({'params': params}, *args, **kwargs)
  logits = {t.name: np.asarray(jax.jit(ops.bind(t, apply))(params))
            for t in (backends.PLAIN, on_fp8)}
  assert 0.001 < _rel(logits['fp8'], logits['plain']) < 0.1


class _Device:
  def __init__(self, platform, capability=None):
    self.platform, self.device_kind = platform, f'test {platform}'
    if capability is not None:
      self.compute_capability = capability


def test_fp8_is_chosen_only_for_gpus_with_fp8_tensor_cores():
  hopper = backends.for_device(_Device('gpu', '9.0'), fp8_dense=True)
  assert hopper.matmul is fp8.matmul and hopper.platform == 'gpu'
  assert hopper is backends.for_device(_Device('gpu', '8.9'), fp8_dense=True)  # one record
  assert backends.for_device(_Device('gpu', '9.0')) is backends.for_platform('gpu')
  assert backends.for_device(_Device('cpu')) is backends.CPU
  for device, named in ((_Device('gpu', '8.0'), 'compute capability 8.0'),
                        (_Device('cpu'), 'platform cpu'), (_Device('tpu'), 'platform tpu'),
                        (_Device('gpu'), 'platform gpu')):
    with pytest.raises(ValueError, match=f'^train.fp8=True on test .*{named}'):
      backends.for_device(device, fp8_dense=True)


def test_fp8_on_this_cpu_is_one_error_line():
  out = commands.run('benchmark', '--config', 'tiny_gpt', '--config.train.fp8=true', '--steps',
                     '1', '--warmup', '0', timeout=300)
  assert out.returncode == 2 and out.stdout == ''
  assert out.stderr.startswith('error: train.fp8=True on cpu') and len(
      out.stderr.strip().splitlines()) == 1


def test_a_resume_switches_fp8_only_when_allowed():
  """fp8 changes how the step computes, not what the state is: an allowable change."""
  saved = tiny_gpt.get_config().to_dict()
  on = tiny_gpt.get_config()
  on.train.fp8 = True
  assert workdir.config_differences(saved, on.to_dict()) == ['train.fp8: False -> True']
  assert workdir.config_differences(saved, on.to_dict(), 'train.fp8') == []
