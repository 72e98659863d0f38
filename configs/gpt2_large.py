"""GPT-2 large (774M: 774,030,080 parameters, Hugging Face's gpt2-large) on a v5e-8: 36 layers,
d_model 1280, 20 heads of 64, 1024 positions, GPT-2's 50257-row vocabulary (unpadded, so Hugging
Face conversion keeps working). GPT-2's batch of 512 x 1024 tokens in 4 microbatches (16 rows per
chip each) and the LM head and loss 128 positions at a time (the eval step takes a whole batch,
whose float32 logits alone would take 13 GiB of a chip's 16), fp32 weights and AdamW state
sharded over the whole slice (fsdp), bf16 compute (the base's model.dtype='auto' on TPU), the
layers as one scan (compile time flat in depth) with full rematerialisation. The base of the big
GPT configs (gpt2_xl, gpt3_6_7b); docs/scaling.md has what the TPU compiler plans for each on its
slice."""
from configs import gpt2_small


def get_config():
  c = gpt2_small.get_config()
  c.model.update(num_layers=36, emb_dim=1280, num_heads=20, mlp_dim=5120,
                 attention_dropout_rate=0.0,  # lets the attention kernel (splash) run
                 scan_layers=True, remat='full')
  c.train.update(learning_rate=2.5e-4,   # GPT-3's rate for its 760M model (GPT-2 gives none)
                 microbatches=4,
                 loss_chunk_len=128)
  c.mesh.update(data=1, fsdp=-1)    # ZeRO-3 over every chip of the slice
  return c
