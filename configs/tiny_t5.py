"""A T5 (v1.1 style) that trains on the embedded corpus on a 2-core CPU in about a minute and a
half (the main job, pretrain-jax train_tiny): a 1,024-piece vocabulary and no dropout (see
tiny_bert.py); its step costs more than a BERT step, so it takes fewer."""
from configs import t5_small


def get_config():
  c = t5_small.get_config()
  c.model.update(vocab_size=1024, num_layers=2, num_decoder_layers=2, emb_dim=128, num_heads=4,
                 head_dim=32, mlp_dim=512, max_len=128, activation='gated-gelu',
                 tie_embeddings=False, dropout_rate=0.0)
  c.data.update(seq_len=128, tokenizer_vocab_size=1024, validation_fraction=0.05)
  c.train.update(batch_size=16, steps=250, learning_rate=1e-2, warmup_steps=30,
                 schedule='rsqrt', eval_every=250, checkpoint_every=125, log_every=50)
  return c
