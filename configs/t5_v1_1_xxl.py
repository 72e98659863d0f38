"""T5 v1.1-XXL (11.1B: 11,135,332,352 parameters, Hugging Face's google/t5-v1_1-xxl) on a
v5p-128 (64 chips, 32 rows each): 24 + 24 layers, d_model 4096, 64 heads of 64, d_ff 10240; the
rest as t5_v1_1_large."""
from configs import t5_v1_1_large


def get_config():
  c = t5_v1_1_large.get_config()
  c.train.microbatches = 1    # a v5p chip's 95 GiB hold its 32 rows at once
  c.model.update(emb_dim=4096, num_heads=64, mlp_dim=10240)
  return c
