"""The CPU benchmark shape for GPT (pretrain-jax benchmark): 4 layers, 512 wide, 32128 vocab,
batch 8 x 256 tokens, fp32."""
from configs import gpt2_small
from configs.bench_common import bench_section


def get_config():
  c = gpt2_small.get_config()
  c.model.update(vocab_size=32128, num_layers=4, emb_dim=512, num_heads=8, head_dim=64,
                 mlp_dim=2048, max_len=256)
  c.data.seq_len = 256
  c.train.update(batch_size=8, steps=20, warmup_steps=1,
                 prng_impl='philox4x32')  # single-process CPU: cheaper dropout masks
  c.benchmark = bench_section()
  return c
