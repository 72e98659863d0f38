"""The flags scripts/finetune.py and scripts/transfer.py share (absl; defined on call)."""
import os

from absl import flags
from ml_collections import config_flags

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'configs', 'finetune.py')


def define_common():
  """(--config, --init, --task) flag holders."""
  return (config_flags.DEFINE_config_file('config', DEFAULT_CONFIG, 'fine-tuning config',
                                          lock_config=True),
          flags.DEFINE_string('init', None, 'checkpoint: workdir, checkpoints/<step> or HF dir'),
          flags.DEFINE_string('task', None, 'task name, tfds name, or directory'))
