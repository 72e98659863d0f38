"""T5 v1.1-XL (2.85B: 2,849,757,184 parameters, Hugging Face's google/t5-v1_1-xl) on a v5p-32
(16 chips, 128 rows each): 24 + 24 layers, d_model 2048, 32 heads of 64, d_ff 5120; the rest as
t5_v1_1_large."""
from configs import t5_v1_1_large


def get_config():
  c = t5_v1_1_large.get_config()
  c.train.microbatches = 1    # a v5p chip's 95 GiB hold its 128 rows at once
  c.model.update(emb_dim=2048, num_heads=32, mlp_dim=5120)
  return c
