"""GPT-2 small on one H100 (pretrain-jax benchmark --suite gpu): 1024 tokens, the vocabulary
padded to 50304 (a multiple of 128), batch 96 (the largest that fits 80 GB), bf16, cuDNN
attention (attention dropout 0: no kernel has it), cuBLAS for every GEMM; the best known
settings in docs/performance.md."""
from configs import gpt2_small
from configs.bench_common import GPU_MEM_FRACTION, GPU_XLA_FLAGS, bench_section


def get_config():
  c = gpt2_small.get_config()
  c.model.update(vocab_size=50304, dtype='bfloat16', attention_impl='cudnn',
                 attention_dropout_rate=0.0)
  c.train.batch_size = 96
  c.benchmark = bench_section(xla_flags=GPU_XLA_FLAGS, mem_fraction=GPU_MEM_FRACTION)
  return c
