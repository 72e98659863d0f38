"""Cloud TPU VM launcher: pure `gcloud` argv builders (gcloud.py) and their orchestration
(launcher.py) behind scripts/tpu.py. Standard library only: it never imports the trainer.
"""
