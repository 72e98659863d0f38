"""T5 v1.1-large (783M: 783,150,080 parameters, Hugging Face's google/t5-v1_1-large) on a v5e-8:
24 + 24 layers, d_model 1024, 16 heads of 64, d_ff 2816, T5's 32128-row vocabulary. T5's
pre-training batch of 2048 rows of 512 input and 114 target tokens (span corruption), in 4
microbatches of 64 rows per chip; Adafactor; fp32 weights sharded over the whole slice (fsdp),
bf16 compute (the base's model.dtype='auto' on TPU), the layers as one scan (compile time flat in
depth) with full rematerialisation. The base of t5_v1_1_xl and t5_v1_1_xxl; docs/scaling.md has
what the TPU compiler plans for each on its slice."""
from configs import t5_v1_1_base


def get_config():
  c = t5_v1_1_base.get_config()
  c.model.update(num_layers=24, num_decoder_layers=24, emb_dim=1024, num_heads=16, mlp_dim=2816,
                 scan_layers=True, remat='full')
  c.train.update(batch_size=2048, microbatches=4)
  c.mesh.update(data=1, fsdp=-1)    # ZeRO-3 over every chip of the slice
  return c
