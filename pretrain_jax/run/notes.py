"""What a run tells its user at start about how its model config runs on this backend: one
line per attention path other than `model.attention_impl` says (models/attention.py's
runnable_implementation chooses; this words it)."""
import jax

from pretrain_jax.models.attention import runnable_implementation


def implementation_notes(cfg, backend: str = '') -> list:
  """One line per way a ModelConfig's `attention_impl` runs other than it says, on this
  backend (or `backend`; the training loop prints them at start)."""
  impl, backend = cfg.attention_impl, backend or jax.default_backend()
  cfg = cfg.resolved(backend)     # (model.dtype='auto': the paths of that backend's dtype)
  biased = {'t5': "T5's relative position bias", 'alibi': 'the ALiBi bias'}.get(
      'alibi' if cfg.position_embedding == 'alibi' else cfg.family)
  notes = []
  if impl == 'cudnn' and backend != 'gpu':
    notes.append(f"note: model.attention_impl='cudnn' needs a GPU with cuDNN; on {backend} "
                 "attention runs as 'xla' (the same computation)")
  if impl in ('splash', 'flash') and backend == 'gpu':
    runs = runnable_implementation('auto', dtype=cfg.dtype, backend=backend)
    notes.append(f"note: model.attention_impl={impl!r} is a TPU kernel; on gpu attention runs "
                 f'as {runs!r} (the same computation)')
  elif impl in ('splash', 'flash'):
    if backend != 'tpu':
      notes.append(f"note: model.attention_impl={impl!r} is a TPU kernel; on {backend} it runs "
                   "in Pallas's interpreter (exact, slow: for tests)")
    if biased and impl == 'splash':
      notes.append(f"note: splash attention takes no additive bias: the attentions with "
                   f"{biased} run on the 'flash' kernel")
  if impl == 'auto' and cfg.attention_dropout_rate > 0 and backend != 'cpu':
    notes.append(f"note: model.attention_dropout_rate={cfg.attention_dropout_rate}: training "
                 "attention runs as 'reference' (no kernel has attention dropout); set it to 0 "
                 f"for {runnable_implementation('auto', dtype=cfg.dtype, backend=backend)!r}")
  return notes
