"""pretrain_jax: BERT, GPT and T5 pre-training on one attention core (JAX / Flax).

  import pretrain_jax
  model = pretrain_jax.load_pretrained(workdir_or_hf_dir)
"""


def load_pretrained(path, step=None, **model_overrides):
  """See pretrain_jax.inference.load_pretrained (imported lazily: no TensorFlow at import)."""
  from pretrain_jax.inference import load  # noqa: PLC0415 (the whole stack)
  return load.load_pretrained(path, step, **model_overrides)


__all__ = ['load_pretrained']
