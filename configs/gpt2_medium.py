"""GPT-2 medium (355M)."""
from configs import gpt2_small


def get_config():
  c = gpt2_small.get_config()
  c.model.update(num_layers=24, emb_dim=1024, num_heads=16, mlp_dim=4096)
  c.train.learning_rate = 3e-4
  return c
