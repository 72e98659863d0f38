"""GPT-2's architecture at the GPT-3 paper's 6.7B shape (6.66B parameters: 6,658,404,352 with
GPT-2's 50257-row vocabulary) on a v5e-256: 32 layers, d_model 4096, 32 heads of 128, 2048
learned positions, dense attention in every layer (GPT-3 alternates dense and banded sparse
layers; this config does not). The paper's batch of 1024 x 2048 tokens (2M: 4 rows per chip),
its AdamW (b2 0.95, weight decay 0.1, clip 1.0) at 1.2e-4, 375M tokens of warmup and 300B
tokens in all; no dropout. Convertible to and from Hugging Face as a GPT2LMHeadModel."""
from configs import gpt2_large


def get_config():
  c = gpt2_large.get_config()
  c.model.update(num_layers=32, emb_dim=4096, num_heads=32, head_dim=128, mlp_dim=16384,
                 max_len=2048, dropout_rate=0.0)
  c.data.seq_len = 2048
  c.train.update(batch_size=1024, steps=143_051, warmup_steps=179, learning_rate=1.2e-4,
                 adam_b2=0.95, microbatches=1,
                 loss_chunk_len=0)   # 4 rows per chip: the logits fit whole
  return c
