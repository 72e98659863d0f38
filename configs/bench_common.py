"""The `benchmark` section of the configs/bench_*.py shapes (read by pretrain_jax.perf.benchmark;
its fields are documented in pretrain_jax/perf/config.py), and the suites of
`pretrain-jax benchmark --suite NAME`."""
import importlib

import ml_collections

from configs import common
from pretrain_jax.perf.config import BenchmarkConfig

# One H100's best known settings (docs/performance.md): cuBLAS for every GEMM, 95% of the
# memory for JAX's allocator (GPT-2 small's batch 96 needs it).
GPU_XLA_FLAGS = '--xla_gpu_enable_triton_gemm=false'
GPU_MEM_FRACTION = 0.95

# Suite name -> the configs it times, in order (the largest step first, so a later model
# cannot run short of memory that an earlier one fragmented). cpu_smoke is the gpu suite's
# configs at tiny shapes (smoke()), so a CPU test runs the same code.
SUITES = {
    'gpu': ('bench_gpu_gpt', 'bench_gpu_bert', 'bench_gpu_t5'),
    'cpu_smoke': ('bench_gpu_gpt', 'bench_gpu_bert', 'bench_gpu_t5'),
    'cpu': ('bench_gpt', 'bench_bert', 'bench_t5'),
}


def bench_section(target_len: int = 0, **kw) -> ml_collections.ConfigDict:
  return common.section(BenchmarkConfig(target_len=target_len, **kw))


def on_h100(c: ml_collections.ConfigDict, batch_size: int, **model) -> ml_collections.ConfigDict:
  """`c` with the gpu suite's common settings (bf16, cuDNN attention, the GPU XLA flags and
  memory fraction), `batch_size` and the model fields `model`; returns c."""
  c.model.update(dtype='bfloat16', attention_impl='cudnn', **model)
  c.train.batch_size = batch_size
  c.benchmark = bench_section(xla_flags=GPU_XLA_FLAGS, mem_fraction=GPU_MEM_FRACTION)
  return c


def smoke(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A config's benchmark at tiny shapes (1 layer, 64 wide, 64 tokens, batch 2, 2 steps);
  everything else (dtype, attention path, heads, flags) as the config has it."""
  c.model.update(num_layers=1, emb_dim=64, num_heads=2, head_dim=32, mlp_dim=128, max_len=64,
                 vocab_size=512)
  if c.model.family == 't5':
    c.model.num_decoder_layers = 1
  c.data.seq_len = 64
  c.train.batch_size = 2
  c.benchmark.update(steps=2, warmup=1, probe_size=256)
  return c


def suite(name: str) -> list:
  """[(config name, ConfigDict)] of a suite in SUITES, or of a comma-separated list of
  configs/ names."""
  names = SUITES.get(name) or tuple(n for n in name.split(',') if n)
  out = []
  for config_name in names:
    try:
      module = importlib.import_module(f'configs.{config_name}')
    except ModuleNotFoundError:
      module = None
    if module is None or not hasattr(module, 'get_config') or config_name == 'bench_common':
      raise ValueError(f'--suite={name}: {config_name!r} is no config in configs/; expected '
                       f'one of {", ".join(SUITES)} or a comma-separated list of config names '
                       '(bench_gpt,bench_t5)')
    config = module.get_config()
    out.append((config_name, smoke(config) if name == 'cpu_smoke' else config))
  return out
