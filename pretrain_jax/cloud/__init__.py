"""Cloud TPU VM launcher: pure `gcloud` argv builders (gcloud.py) and their orchestration
(launcher.py) behind `pretrain-jax tpu` (commands/tpu.py). Standard library only: it never
imports the trainer.
"""
