"""A T5 (v1.1 style) that trains on the embedded corpus on a 2-core CPU."""
from configs import t5_small


def get_config():
  c = t5_small.get_config()
  c.model.update(vocab_size=2048, num_layers=2, num_decoder_layers=2, emb_dim=128, num_heads=4,
                 head_dim=32, mlp_dim=512, max_len=128, activation='gated-gelu',
                 tie_embeddings=False, dropout_rate=0.0)
  c.data.seq_len = 128
  c.train.update(batch_size=16, steps=300, learning_rate=1e-2, warmup_steps=30,
                 schedule='rsqrt', eval_every=100, checkpoint_every=100, log_every=20)
  return c
