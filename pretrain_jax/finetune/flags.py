"""The flags scripts/finetune.py and scripts/transfer.py share (absl; defined on call)."""
import os
import sys

from absl import flags
from ml_collections import config_flags

from pretrain_jax import cli

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'configs', 'finetune.py')


def define_common():
  """(--config, --init, --task) flag holders. A default config file is read, with the command
  line's overrides, when its flag is defined: an override of a missing field is one error line
  here (exit 2), as cli's flag parsing makes it for the other scripts."""
  try:
    config = config_flags.DEFINE_config_file('config', DEFAULT_CONFIG, 'fine-tuning config',
                                             lock_config=True)
  except (AttributeError, KeyError) as e:
    print(cli.unknown_override(sys.argv, e), file=sys.stderr)
    sys.exit(2)
  return (config,
          flags.DEFINE_string('init', None, 'checkpoint: workdir, checkpoints/<step> or HF dir'),
          flags.DEFINE_string('task', None, 'task name, tfds name, or directory'))
