"""A BERT (MLM only, packed rows) that trains on the embedded corpus on a 2-core CPU."""
from configs import bert_base


def get_config():
  c = bert_base.get_config()
  c.model.update(vocab_size=2048, num_layers=2, emb_dim=128, num_heads=4, head_dim=32,
                 mlp_dim=512, max_len=128, nsp=False)
  c.data.update(seq_len=128, nsp=False)
  c.train.update(batch_size=16, steps=300, learning_rate=2e-3, warmup_steps=30,
                 schedule='cosine', eval_every=100, checkpoint_every=100, log_every=20)
  return c
