"""A GPT that trains on the embedded corpus on a 2-core CPU in about a minute."""
from configs import gpt2_small


def get_config():
  c = gpt2_small.get_config()
  c.model.update(vocab_size=2048, num_layers=2, emb_dim=128, num_heads=4, head_dim=32,
                 mlp_dim=512, max_len=128)
  c.data.seq_len = 128
  c.train.update(batch_size=16, steps=300, learning_rate=3e-3, warmup_steps=30,
                 eval_every=100, checkpoint_every=100, log_every=20, weight_decay=0.01)
  return c
