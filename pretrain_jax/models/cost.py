"""A model's FLOPs by its family's record: one forward pass, one training step, one batch.

The per-architecture counts are in flops.py, which the family modules use; this module looks
the family up, so it sits above them (models/__init__.py does not import it).
"""
from pretrain_jax.models import family_of, flops
from pretrain_jax.models.config import ModelConfig


def forward_flops(cfg: ModelConfig, batch: int, seq_len: int, target_len: int = 0,
                  head_positions: int = 0) -> float:
  """Matmul FLOPs of one forward pass over (batch, seq_len) [T5: plus (batch, target_len)];
  the LM head over min(head_positions, length) positions per row when head_positions > 0.
  Each family's record (pretrain_jax.models.family_of) supplies its own count."""
  return family_of(cfg).forward_flops(cfg, batch, seq_len, target_len, head_positions)


def train_flops(cfg: ModelConfig, batch: int, seq_len: int, target_len: int = 0,
                head_positions: int = 0, *, lm_head: bool = True,
                frozen_backbone: bool = False) -> float:
  """Model FLOPs of one training step: 3 x forward (rematerialisation is NOT counted).
  `lm_head=False`: a classification step of GPT / BERT, which never runs the unembedding.
  `frozen_backbone`: a linear probe, whose backbone runs forward only (1 x; its small head's
  backward is not counted)."""
  forward = forward_flops(cfg, batch, seq_len, target_len,
                          head_positions if lm_head else flops.NO_LM_HEAD)
  return (1.0 if frozen_backbone else 3.0) * forward


def batch_cost(cfg: ModelConfig, batch: dict, max_predictions: int = 0,
               frozen_backbone: bool = False) -> tuple:
  """(tokens, train_flops) of one train step on `batch`: its input positions (T5: encoder +
  decoder); the LM head on `max_predictions` positions per row when set, and none for a batch
  without LM targets (classification); a frozen backbone (a linear probe) forward only."""
  family = family_of(cfg)
  batch_size, length, target_len = family.lengths(batch)
  return (batch_size * (length + target_len),
          train_flops(cfg, batch_size, length, target_len, max_predictions,
                      lm_head=family.target_key in batch, frozen_backbone=frozen_backbone))
