"""A GPT that trains on the embedded corpus on a 2-core CPU in about a minute and a half (the
main job, pretrain-jax train_tiny): a 1,024-piece vocabulary and no dropout, chosen for a 400-step
budget (see tiny_bert.py)."""
from configs import gpt2_small


def get_config():
  c = gpt2_small.get_config()
  c.model.update(vocab_size=1024, num_layers=2, emb_dim=128, num_heads=4, head_dim=32,
                 mlp_dim=512, max_len=128, dropout_rate=0.0, attention_dropout_rate=0.0)
  c.data.update(seq_len=128, tokenizer_vocab_size=1024, validation_fraction=0.05)
  c.train.update(batch_size=16, steps=400, learning_rate=3e-3, warmup_steps=30,
                 eval_every=400, checkpoint_every=200, log_every=50, weight_decay=0.01)
  return c
