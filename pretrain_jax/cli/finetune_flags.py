"""The flags `pretrain-jax finetune` and `pretrain-jax transfer` share (absl; defined on call)."""
from absl import flags
from ml_collections import config_flags

import configs


def define_common():
  """(--config, --init, --task) flag holders; --config defaults to the packaged `finetune`."""
  return (config_flags.DEFINE_config_file('config', configs.config_path('finetune'),
                                          'fine-tuning config: a name (finetune) or a file',
                                          lock_config=True),
          flags.DEFINE_string('init', None, 'checkpoint: workdir, checkpoints/<step> or HF dir'),
          flags.DEFINE_string('task', None, 'task name, tfds name, or directory'))
