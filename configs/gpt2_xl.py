"""GPT-2 XL (1.5B: 1,557,611,200 parameters, Hugging Face's gpt2-xl) on a v5e-8: 48 layers,
d_model 1600, 25 heads of 64 (25 splits over no tensor axis: fsdp only), GPT-2's batch of
512 x 1024 tokens in 4 microbatches; the rest as gpt2_large."""
from configs import gpt2_large


def get_config():
  c = gpt2_large.get_config()
  c.model.update(num_layers=48, emb_dim=1600, num_heads=25, mlp_dim=6400)
  c.train.learning_rate = 2e-4      # GPT-3's rate for its 1.3B model
  return c
