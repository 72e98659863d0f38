"""T5-base on one H100 (pretrain-jax benchmark --suite gpu): 512 encoder and 114 decoder tokens
(what span corruption makes of 512: benchmark.target_len 0), batch 128, bf16, layers under
nn.scan, cuDNN attention, cuBLAS for every GEMM; the best known settings in
docs/performance.md."""
from configs import t5_base
from configs.bench_common import on_h100


def get_config():
  return on_h100(t5_base.get_config(), 128, scan_layers=True)
