"""T5-base on one H100 (pretrain-jax benchmark --suite gpu): 512 encoder and 114 decoder tokens
(what span corruption makes of 512: benchmark.target_len 0), batch 128, bf16, layers under
nn.scan, cuDNN attention, cuBLAS for every GEMM; the best known settings in
docs/performance.md."""
from configs import t5_base
from configs.bench_common import GPU_MEM_FRACTION, GPU_XLA_FLAGS, bench_section


def get_config():
  c = t5_base.get_config()
  c.model.update(dtype='bfloat16', attention_impl='cudnn', scan_layers=True)
  c.train.batch_size = 128
  c.benchmark = bench_section(xla_flags=GPU_XLA_FLAGS, mem_fraction=GPU_MEM_FRACTION)
  return c
