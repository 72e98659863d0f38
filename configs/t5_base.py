"""T5-base v1.0 (223M)."""
from configs import t5_small


def get_config():
  c = t5_small.get_config()
  c.model.update(num_layers=12, num_decoder_layers=12, emb_dim=768, num_heads=12, mlp_dim=3072)
  return c
