"""Fine-tuning and probing any checkpoint on a labelled task (run.py), and the transfer
comparison of scratch / linear_probe / full (transfer.py). Sits on top of inference/."""
from pretrain_jax.finetune.config import MODES
from pretrain_jax.finetune.run import finetune, read_curves

__all__ = ['MODES', 'finetune', 'read_curves']
