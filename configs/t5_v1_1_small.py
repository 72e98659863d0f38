"""T5 v1.1-small (77M): gated GELU, untied LM head, no dropout in pre-training."""
from configs import t5_small


def get_config():
  c = t5_small.get_config()
  c.model.update(num_layers=8, num_decoder_layers=8, emb_dim=512, num_heads=6, mlp_dim=1024,
                 activation='gated-gelu', tie_embeddings=False, dropout_rate=0.0)
  return c
