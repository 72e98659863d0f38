"""BERT-base with MLM + NSP on one H100 (pretrain-jax benchmark --suite gpu): 512 tokens, the
vocabulary padded to 30592 (a multiple of 128), batch 128, bf16, cuDNN attention (attention
dropout 0: no kernel has it), cuBLAS for every GEMM; the best known settings in
docs/performance.md."""
from configs import bert_base
from configs.bench_common import GPU_MEM_FRACTION, GPU_XLA_FLAGS, bench_section


def get_config():
  c = bert_base.get_config()
  c.model.update(vocab_size=30592, dtype='bfloat16', attention_impl='cudnn',
                 attention_dropout_rate=0.0)
  c.train.batch_size = 128
  c.benchmark = bench_section(xla_flags=GPU_XLA_FLAGS, mem_fraction=GPU_MEM_FRACTION)
  return c
