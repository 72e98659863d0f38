"""BERT-base with MLM + NSP on one H100 (pretrain-jax benchmark --suite gpu): 512 tokens, the
vocabulary padded to 30592 (a multiple of 128), batch 128, bf16, cuDNN attention (attention
dropout 0: no kernel has it), cuBLAS for every GEMM; the best known settings in
docs/performance.md."""
from configs import bert_base
from configs.bench_common import on_h100


def get_config():
  return on_h100(bert_base.get_config(), 128, vocab_size=30592, attention_dropout_rate=0.0)
