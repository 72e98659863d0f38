"""GPT-2 small on one H100 (pretrain-jax benchmark --suite gpu): 1024 tokens, the vocabulary
padded to 50304 (a multiple of 128), batch 96 (the largest that fits 80 GB), bf16, cuDNN
attention (attention dropout 0: no kernel has it), cuBLAS for every GEMM; the best known
settings in docs/performance.md."""
from configs import gpt2_small
from configs.bench_common import on_h100


def get_config():
  return on_h100(gpt2_small.get_config(), 96, vocab_size=50304, attention_dropout_rate=0.0)
