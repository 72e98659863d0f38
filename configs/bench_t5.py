"""The CPU benchmark shape for T5 (pretrain-jax benchmark): 4 + 4 layers, 512 wide, 32128 vocab,
batch 8, 256 encoder and 64 decoder tokens, fp32."""
from configs import t5_small
from configs.bench_common import bench_section


def get_config():
  c = t5_small.get_config()
  c.model.update(num_layers=4, num_decoder_layers=4, emb_dim=512, num_heads=8, head_dim=64,
                 mlp_dim=2048, max_len=256)
  c.data.seq_len = 256
  c.train.update(batch_size=8, steps=20, warmup_steps=1,
                 prng_impl='philox4x32')  # single-process CPU: cheaper dropout masks
  c.benchmark = bench_section(target_len=64)
  return c
