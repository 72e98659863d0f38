"""The CPU benchmark shape for BERT (pretrain-jax benchmark): 4 layers, 512 wide, 32128 vocab,
batch 8 x 256 tokens, fp32, MLM only."""
from configs import bert_base
from configs.bench_common import bench_section


def get_config():
  c = bert_base.get_config()
  c.model.update(vocab_size=32128, num_layers=4, emb_dim=512, num_heads=8, head_dim=64,
                 mlp_dim=2048, max_len=256, nsp=False)
  c.data.update(seq_len=256, nsp=False)
  c.train.update(batch_size=8, steps=20, warmup_steps=1,
                 prng_impl='philox4x32')  # single-process CPU: cheaper dropout masks
  # The MLM head on all 256 positions, as the Hugging Face Flax reference computes it (the MFU
  # target's terms); the default (-1: 80 positions) trains faster.
  c.train.max_predictions_per_seq = 0
  c.benchmark = bench_section()
  return c
