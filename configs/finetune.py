"""Fine-tuning a checkpoint on a labelled task (pretrain-jax finetune, pretrain-jax transfer).

The model section comes from the checkpoint (`init`), plus `num_classes` for BERT/GPT and any
`model.dropout_rate` / `model.attention_dropout_rate` given here; the rest is here. Every key
and its default is documented in pretrain_jax/finetune/config.py (`FinetuneConfig`) and the
sections it holds; this file sets the fine-tuning recipe. Override from the command line:
`--config.train.steps=500`.
"""
import ml_collections

from configs import common
from pretrain_jax.finetune.config import FinetuneConfig
from pretrain_jax.training.config import TrainConfig


def get_config() -> ml_collections.ConfigDict:
  train = TrainConfig(batch_size=32, steps=300, learning_rate=1e-4, warmup_steps=30,
                      schedule='linear', final_lr_fraction=0.0, max_predictions_per_seq=0,
                      eval_every=50, eval_batches=0, checkpoint_every=100, log_every=10,
                      keep_checkpoints=1)
  return common.section(FinetuneConfig(init='', train=train))
