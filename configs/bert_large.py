"""BERT-large (335M)."""
from configs import bert_base


def get_config():
  c = bert_base.get_config()
  c.model.update(num_layers=24, emb_dim=1024, num_heads=16, mlp_dim=4096)
  return c
