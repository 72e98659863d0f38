"""Fine-tuning a checkpoint on a labelled task (pretrain-jax finetune, pretrain-jax transfer).

The model section comes from the checkpoint (`init`), plus `num_classes` for BERT/GPT and any
`model.dropout_rate` / `model.attention_dropout_rate` given here; the rest is here. Override
from the command line: `--config.train.steps=500`.
"""
import ml_collections
from ml_collections import config_dict

from configs import common


def get_config():
  c = ml_collections.ConfigDict()
  c.init = ''                       # training workdir, checkpoints/<step> dir, or HF directory
  c.mode = 'full'                   # 'full', 'linear_probe' (frozen backbone) or 'scratch'
  c.probe_learning_rate = 1e-3      # linear_probe's peak learning rate (a head alone takes a
                                    # larger one); 0 = train.learning_rate
  c.task = ml_collections.ConfigDict()
  c.task.name = 'word_order'        # 'word_order' (embedded), a tfds name ('glue/sst2', ...),
                                    # a directory with train.* + validation.*, or
                                    # 'train=FILE,validation=FILE'
  c.task.tfds_data_dir = ''         # tfds data_dir for named datasets (may be gs://)
  c.task.max_train_examples = 0     # use the first N training examples (0 = all): the
                                    # labelled-set size of pretrain-jax transfer --sizes
  c.task.max_eval_examples = 0      # the first N validation examples (0 = all)
  c.task.labels = []                # filled in: the label set collected from train
  c.task.metric = ''                # filled in: the headline metric (accuracy, mcc, f1)
  c.task.prefix = ''                # filled in: T5's input prefix
  c.data = ml_collections.ConfigDict()
  c.data.seq_len = 128              # input length (pairs truncated longest-first, counted)
  c.data.target_len = 16            # T5 target length (longer targets are refused); a small
                                    # vocabulary splits labels: 'shuffled' is 9 pieces with EOS
                                    # for the main job's 1,024-piece tokenizer
  c.data.train_split = 'train'
  c.data.eval_split = 'validation'
  c.data.tokenizer = ''             # filled in: the checkpoint's tokenizer
  c.data.seed = 0                   # example order
  # Filled in from the checkpoint (the architecture). Of the model's fields, only these may be
  # set for the fine-tune, as t5x and HF fine-tunes set dropout; None keeps the checkpoint's.
  c.model = ml_collections.ConfigDict({
      'dropout_rate': config_dict.placeholder(float),
      'attention_dropout_rate': config_dict.placeholder(float)})
  c.train = common.train_config(batch_size=32, steps=300, learning_rate=1e-4)
  c.train.update(warmup_steps=30, schedule='linear', final_lr_fraction=0.0,
                 max_predictions_per_seq=0, eval_every=50, eval_batches=0,
                 checkpoint_every=100, log_every=10, keep_checkpoints=1)
  c.train.freeze_backbone = False   # filled in from mode (linear_probe)
  c.mesh = common.mesh_config()
  return c
