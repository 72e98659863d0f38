"""T5 v1.1-base (248M): gated GELU, untied LM head, no dropout in pre-training."""
from configs import t5_small


def get_config():
  c = t5_small.get_config()
  c.model.update(num_layers=12, num_decoder_layers=12, emb_dim=768, num_heads=12, mlp_dim=2048,
                 activation='gated-gelu', tie_embeddings=False, dropout_rate=0.0)
  return c
