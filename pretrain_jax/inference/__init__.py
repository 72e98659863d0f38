"""Using a checkpoint: one object (`Pretrained`) that loads, scores, evaluates, generates and
fills masks.

  from pretrain_jax import inference
  model = inference.load_pretrained('runs/tiny/gpt')
  model.generate(['The list'], max_new_tokens=20, temperature=0.8, top_p=0.95)

load.py (load_pretrained, Pretrained), sampling.py (jitted KV-cache decoding loops),
text.py (text in / text out: generate_text, fill_mask).
"""
from pretrain_jax.inference.load import BertOutput, Pretrained, load_pretrained
from pretrain_jax.inference.text import fill_mask, generate_text

__all__ = ['BertOutput', 'Pretrained', 'fill_mask', 'generate_text', 'load_pretrained']
