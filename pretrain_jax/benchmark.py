"""Train-step benchmark: measured matmul peak, compile time, median step time and analytic MFU.

`measure_peak_flops` times a large jitted square matmul on the same device and dtype as the
model, so MFU is "share of what this machine's matmul achieves", not of a datasheet number.
`benchmark_train_step` compiles the real train step (pretrain_jax.training.step, donated state)
and times it on a device-resident synthetic batch of the configured shapes; the input pipeline
is benchmarked separately (scripts/benchmark_data.py).
"""
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from pretrain_jax import flops
from pretrain_jax.models import ModelConfig, build
from pretrain_jax.objectives import span_corruption
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import metrics as metrics_lib
from pretrain_jax.training import optimizer as opt_lib
from pretrain_jax.training import state as state_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training.synthetic import SyntheticDataset


def _median_seconds(fn, repeats: int) -> list:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return times


def measure_peak_flops(dtype=jnp.float32, size: int = 4096, repeats: int = 7) -> float:
  """FLOP/s of a jitted (size, size) x (size, size) matmul in `dtype`: median of `repeats`."""
  a = jax.random.normal(jax.random.key(0), (size, size), dtype)
  b = jax.random.normal(jax.random.key(1), (size, size), dtype)
  matmul = jax.jit(lambda x, y: x @ y)
  jax.block_until_ready(matmul(a, b))                   # compile + warm caches
  seconds = statistics.median(_median_seconds(lambda: matmul(a, b), repeats))
  return 2.0 * size ** 3 / seconds


def datasheet_peak_flops() -> float:
  """The table peak (TPU/GPU bf16) from training.metrics; None where none is known (CPU)."""
  if jax.devices()[0].platform == 'cpu':
    return None
  peak = metrics_lib.peak_flops_per_device() * jax.device_count()
  return peak if np.isfinite(peak) else None


def target_length(config) -> int:
  """T5 decoder length: config.benchmark.target_len if set, else what span corruption makes."""
  bench = config.get('benchmark') or {}
  if bench.get('target_len'):
    return int(bench['target_len'])
  return span_corruption.target_length(config.data.seq_len, config.data.noise_density,
                                       config.data.mean_noise_span_length)[1]


def synthetic_batch(config) -> dict:
  """One global batch of the configured shapes (numpy), as the data pipeline lays it out."""
  m, d = config.model, config.data
  batch = SyntheticDataset(m.family, vocab_size=m.vocab_size, seq_len=d.seq_len,
                           batch_size=config.train.batch_size,
                           nsp=bool(m.get('nsp', False))).batch(0)
  if m.family == 't5':
    t = target_length(config)
    if t > d.seq_len // 2:
      rng = np.random.default_rng(1)
      tokens = rng.integers(3, m.vocab_size, (config.train.batch_size, t), dtype=np.int32)
      ones = np.ones_like(tokens)
      batch.update(decoder_input_tokens=np.pad(tokens[:, :-1], [(0, 0), (1, 0)]),
                   decoder_target_tokens=tokens, decoder_segment_ids=ones,
                   decoder_positions=np.broadcast_to(np.arange(t, dtype=np.int32), ones.shape),
                   decoder_loss_weights=ones.astype(np.float32))
    for key in [k for k in batch if k.startswith('decoder_')]:
      batch[key] = np.ascontiguousarray(batch[key][:, :t])
  return batch


def peak_memory(compiled) -> dict:
  """Peak device bytes where the backend reports them, plus XLA's static buffer sizes."""
  out = {}
  stats = jax.devices()[0].memory_stats()
  if stats and 'peak_bytes_in_use' in stats:
    out['peak_bytes_in_use'] = int(stats['peak_bytes_in_use'])
  try:
    mem = compiled.memory_analysis()
    out.update(compiled_temp_bytes=int(mem.temp_size_in_bytes),
               compiled_argument_bytes=int(mem.argument_size_in_bytes),
               compiled_output_bytes=int(mem.output_size_in_bytes))
  except Exception:  # pylint: disable=broad-except  # not every backend implements it
    pass
  return out


def benchmark_train_step(config, *, steps: int = 10, warmup: int = 2,
                         peak_flops: float = None) -> dict:
  """Compile and time the real train step on `config`; returns the benchmark record."""
  t = config.train
  mesh = mesh_lib.make_mesh(config.mesh)
  model_cfg = ModelConfig.from_config(config.model)
  train_model = build(model_cfg.replace(deterministic=False))
  schedule, tx = opt_lib.make_schedule(t), opt_lib.make_optimizer(t)
  batch_np = synthetic_batch(config)
  state, abstract = state_lib.create_state(
      build(model_cfg), tx, mesh, state_lib.init_batch(model_cfg.family, config.data.seq_len),
      t.seed)
  params = state_lib.count_params(state.params)
  train_step = step_lib.jit_train_step(
      step_lib.make_train_step(train_model, tx, schedule, seed=t.seed,
                               microbatches=t.microbatches, z_loss=t.z_loss, mesh=mesh),
      state_lib.shardings_of(abstract), mesh, batch_np)
  shardings = step_lib.batch_shardings(mesh, batch_np)
  batch = {k: jax.device_put(v, shardings[k]) for k, v in batch_np.items()}

  start = time.perf_counter()
  compiled = train_step.lower(state, batch).compile()
  compile_s = time.perf_counter() - start
  for _ in range(warmup):
    state, metrics = compiled(state, batch)
  jax.block_until_ready(state)
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)

  tokens, model_flops = metrics_lib.batch_cost(model_cfg, batch_np)
  step_s = statistics.median(times)
  if peak_flops is None:
    peak_flops = measure_peak_flops(model_cfg.dtype) * jax.device_count()
  record = {'family': model_cfg.family, 'params': params,
            'batch_size': int(t.batch_size), 'seq_len': int(config.data.seq_len),
            'step_s': step_s, 'step_s_min': min(times), 'steps': steps,
            'tokens_per_s': tokens / step_s, 'model_flops_per_step': model_flops,
            'peak_flops': peak_flops, 'datasheet_peak_flops': datasheet_peak_flops(),
            'mfu': model_flops / step_s / peak_flops, 'compile_s': compile_s,
            'loss': float(metrics['loss']), 'device': jax.devices()[0].device_kind,
            'num_devices': jax.device_count(), 'dtype': jnp.dtype(model_cfg.dtype).name,
            'attention_impl': model_cfg.attention_impl, 'scan_layers': model_cfg.scan_layers,
            'remat': model_cfg.remat}
  if model_cfg.family == 't5':
    record['target_len'] = int(batch_np['decoder_input_tokens'].shape[1])
  record.update(peak_memory(compiled))
  return record
