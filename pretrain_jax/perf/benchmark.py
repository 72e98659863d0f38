"""Train-step benchmark: measured matmul peak, compile time, median step time and analytic MFU.

`peak_probe` times large jitted square matmuls on the same device and dtype as the model, so
MFU is "share of what this machine's matmul achieves", not of a datasheet number (printed
beside it on TPU/GPU); the probe runs after every timed step and MFU is the median of the
per-step ratios.
`benchmark_train_step` compiles the real train step (pretrain_jax.training.step, donated state)
and times it on a synthetic batch of the configured shapes: device-resident (`feed='device'`),
copied from the host inside every timed step (`'host'`: what an input pipeline without
prefetch pays) or copied for the next step while this one runs (`'prefetch'`). The input
pipeline itself is benchmarked separately (pretrain-jax benchmark_data).
"""
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pretrain_jax.data.config import DataConfig
from pretrain_jax.models import ModelConfig, cost, family_of
from pretrain_jax.models.layers import attention_path
from pretrain_jax.objectives import prefix_lm, span_corruption
from pretrain_jax.perf.config import BenchmarkConfig
from pretrain_jax.run import metrics as metrics_lib
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training.config import MeshConfig, TrainConfig
from pretrain_jax.training.synthetic import SyntheticDataset


def peak_probe(dtype=jnp.float32, size: int = None, chain: int = None):
  """A compiled matmul probe: calling it runs one timed probe and returns its FLOP/s.

  One probe is `chain` dependent (size, size) x (size, size) matmuls inside one jit, so dispatch
  and the host clock cost nothing next to the arithmetic: a single large bf16 matmul is so short
  on an accelerator that timing it alone understates the chip's rate and inflates every MFU.
  Defaults: 4096 x 1 on CPU (about a second of work), 8192 x 20 on accelerators.
  """
  on_cpu = jax.devices()[0].platform == 'cpu'
  size = size or (4096 if on_cpu else 8192)
  chain = chain or (1 if on_cpu else 20)
  a = jax.random.normal(jax.random.key(0), (size, size), dtype)
  b = (jax.random.normal(jax.random.key(1), (size, size), jnp.float32) * size ** -0.5
       ).astype(dtype)                                  # keeps x @ b @ b ... at unit scale

  @jax.jit
  def matmuls(x, y):
    return jax.lax.fori_loop(0, chain, lambda _, acc: acc @ y, x)

  jax.block_until_ready(matmuls(a, b))                  # compile + warm caches

  def probe() -> float:
    start = time.perf_counter()
    jax.block_until_ready(matmuls(a, b))
    return 2.0 * size ** 3 * chain / (time.perf_counter() - start)
  return probe


def measure_peak_flops(dtype=jnp.float32, size: int = None, repeats: int = 7,
                       chain: int = None) -> float:
  """Median FLOP/s of `repeats` matmul probes (see peak_probe) on one device."""
  probe = peak_probe(dtype, size, chain)
  return statistics.median(probe() for _ in range(repeats))


def datasheet_peak_flops() -> float:
  """The table peak (TPU/GPU bf16) from run.metrics; None where none is known (CPU)."""
  if jax.devices()[0].platform == 'cpu':
    return None
  peak = metrics_lib.peak_flops_per_device() * jax.device_count()
  return peak if np.isfinite(peak) else None


def benchmark_section(config) -> BenchmarkConfig:
  """config.benchmark (the configs/bench_*.py shapes); other configs time with its defaults."""
  return (BenchmarkConfig.from_config(config.benchmark) if 'benchmark' in config
          else BenchmarkConfig())


def target_length(data: DataConfig, bench: BenchmarkConfig) -> int:
  """T5 decoder length: config.benchmark.target_len if set, else what span corruption makes."""
  if bench.target_len:
    return bench.target_len
  return span_corruption.target_length(data.seq_len, data.noise_density,
                                       data.mean_noise_span_length)[1]


def synthetic_batch(config) -> dict:
  """One global batch of the shapes a whole config names (numpy), as the data pipeline lays
  it out (a prefix LM's with its prefix).

  Token ids follow Zipf(1.1) as natural text's do: uniform ids never repeat enough to show what
  a repeated id costs (e.g. a bf16 embedding-gradient scatter-add on a GPU).
  """
  m, d = ModelConfig.from_config(config.model), DataConfig.from_config(config.data)
  t = TrainConfig.from_config(config.train)
  target_len = (target_length(d, benchmark_section(config)) if d.objective == 'span_corruption'
                else 0)
  data = SyntheticDataset(m.family, vocab_size=m.vocab_size, seq_len=d.seq_len,
                          batch_size=t.batch_size, nsp=m.nsp, zipf=1.1, target_len=target_len)
  batch = data.batch(0)
  if d.objective == 'prefix_lm':   # the objective's prefix and loss weights over the CLM rows
    batch.update(prefix_lm.features(batch['segment_ids'], batch['positions'],
                                    np.random.default_rng(0)))
  return batch


FEEDS = ('device', 'host', 'prefetch')


def peak_memory(compiled) -> dict:
  """Peak device bytes where the backend reports them (the process's peak so far), plus XLA's
  static buffer sizes and `step_bytes`, what one step holds live by XLA's count: arguments,
  outputs that do not reuse a donated argument, and temporaries."""
  out = {}
  stats = jax.devices()[0].memory_stats()
  if stats and 'peak_bytes_in_use' in stats:
    out['peak_bytes_in_use'] = int(stats['peak_bytes_in_use'])
  try:
    mem = compiled.memory_analysis()
    out.update(compiled_temp_bytes=int(mem.temp_size_in_bytes),
               compiled_argument_bytes=int(mem.argument_size_in_bytes),
               compiled_output_bytes=int(mem.output_size_in_bytes),
               step_bytes=int(mem.argument_size_in_bytes + mem.output_size_in_bytes
                              - mem.alias_size_in_bytes + mem.temp_size_in_bytes))
  except Exception:  # not every backend implements it
    pass
  return out


def benchmark_train_step(config, *, steps: int = 10, warmup: int = 2,
                         peak_flops: float = None, feed: str = 'device',
                         probe_size: int = None, profile_dir: str = None,
                         profile_steps: int = 3) -> dict:
  """Compile and time the real train step on `config`; returns the benchmark record.

  `peak_flops` given: MFU = model_flops / median step_s / peak_flops. Otherwise a matmul probe
  (of side `probe_size`, default peak_probe's) is timed after each step, `peak_flops` is their
  median and `mfu` the median of the pairs. `mfu_datasheet` divides by the datasheet peak
  (None on CPU). `feed` is where each step's batch comes from (module docstring: FEEDS).
  `profile_dir`: after the timed steps, `profile_steps` more run under a jax.profiler trace
  written there (TensorBoard's profile plugin, and perfetto_trace.json.gz), untimed.
  """
  if feed not in FEEDS:
    raise ValueError(f'feed={feed!r}; expected one of {FEEDS}')
  t, data = TrainConfig.from_config(config.train), DataConfig.from_config(config.data)
  mesh = mesh_lib.make_mesh(MeshConfig.from_config(config.mesh))
  model_cfg = ModelConfig.from_config(config.model)
  trainer = step_lib.make_steps(model_cfg, t, mesh,
                                max_predictions=step_lib.max_predictions(t, data),
                                init_length=data.seq_len)
  model_cfg, max_predictions = trainer.model_config, trainer.max_predictions   # dtype resolved
  batch_np = synthetic_batch(config)
  state = trainer.create_state(t.seed)
  params = optax.tree_utils.tree_size(state.params)
  train_step = trainer.train_step

  def put():
    return {k: jax.device_put(v, trainer.batch_sharding) for k, v in batch_np.items()}
  batch = put()

  start = time.perf_counter()
  compiled = train_step.lower(state, batch).compile()
  compile_s = time.perf_counter() - start
  for _ in range(warmup):
    state, metrics = compiled(state, batch)
  jax.block_until_ready(state)
  # With no peak given, a matmul probe runs after every timed step and each step's MFU is taken
  # against the probe beside it, so a shared machine whose speed drifts between runs (step and
  # matmul slowing down together) still reads the same MFU.
  probe = None if peak_flops else peak_probe(model_cfg.dtype, probe_size or None)
  tokens, model_flops = cost.batch_cost(model_cfg, batch_np, max_predictions)
  times, peaks = [], []
  for _ in range(steps):
    start = time.perf_counter()
    if feed == 'host':
      batch = put()
    state, metrics = compiled(state, batch)
    if feed == 'prefetch':
      batch = put()         # the next step's copy, issued while this step runs
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
    peaks.append(probe() * jax.device_count() if probe else peak_flops)
  if profile_dir:
    with jax.profiler.trace(profile_dir, create_perfetto_trace=True):
      for _ in range(profile_steps):
        state, metrics = compiled(state, batch)
      jax.block_until_ready(metrics)
  step_s = statistics.median(times)
  if probe:
    mfu = statistics.median(model_flops / s / p for s, p in zip(times, peaks, strict=True))
  else:
    mfu = model_flops / step_s / peak_flops
  datasheet = datasheet_peak_flops()
  record = {'family': model_cfg.family, 'params': params,
            'batch_size': t.batch_size, 'seq_len': data.seq_len,
            'step_s': step_s, 'step_s_min': min(times), 'steps': steps,
            'tokens_per_s': tokens / step_s, 'model_flops_per_step': model_flops,
            'peak_flops': statistics.median(peaks),
            'datasheet_peak_flops': datasheet, 'mfu': mfu,
            'mfu_datasheet': model_flops / step_s / datasheet if datasheet else None,
            'compile_s': compile_s, 'feed': feed,
            'loss': float(metrics['loss']), 'device': jax.devices()[0].device_kind,
            'num_devices': jax.device_count(), 'dtype': jnp.dtype(model_cfg.dtype).name,
            'attention_impl': attention_path(model_cfg.replace(deterministic=False)),
            'scan_layers': model_cfg.scan_layers,
            'remat': model_cfg.remat, 'prng_impl': t.prng_impl,
            'loss_chunk_len': t.loss_chunk_len, 'fused_loss': t.fused_loss,
            'max_predictions_per_seq': max_predictions}
  target_len = family_of(model_cfg).lengths(batch_np)[2]
  if target_len:
    record['target_len'] = int(target_len)
  record.update(peak_memory(compiled))
  if profile_dir:
    record['profile'] = profile_dir
  return record
