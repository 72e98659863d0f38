"""Does pre-training help? scratch vs linear_probe vs full fine-tuning of one checkpoint on a task.

  python scripts/transfer.py --init runs/tiny/gpt --task word_order --workdir runs/transfer/gpt \
      [--modes scratch,linear_probe,full] [--sizes 200,0] [--config.train.steps=300 ...]

Each run is `scripts/finetune.py` in <workdir>/<mode>[_n<size>] (rerunning resumes or reuses a
finished run; pick a new --workdir to start over). --sizes limits the labelled training set to
the first N examples (0 = all). Prints a table (final and best validation metric, steps, wall
time) to stderr, one JSON line to stdout, and writes <workdir>/transfer.png: training loss and
the validation metric against step, side by side.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # pylint: disable=g-import-not-at-top
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    'config', os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           'configs', 'finetune.py'), 'fine-tuning config', lock_config=True)
_INIT = flags.DEFINE_string('init', None, 'checkpoint: workdir, checkpoints/<step> or HF dir')
_TASK = flags.DEFINE_string('task', None, 'task name, tfds name, or directory')
_WORKDIR = flags.DEFINE_string('workdir', None, 'one subdirectory per run, and transfer.png')
_MODES = flags.DEFINE_list('modes', ['scratch', 'linear_probe', 'full'], 'modes to run')
_SIZES = flags.DEFINE_list('sizes', ['0'], 'labelled training set sizes (0 = all)')


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from pretrain_jax.finetune import transfer  # pylint: disable=g-import-not-at-top
  config = _CONFIG.value
  config.unlock()
  config.init, config.task.name = _INIT.value, _TASK.value
  try:
    sizes = [int(s) for s in _SIZES.value]
  except ValueError:
    sys.exit(f'error: --sizes={",".join(_SIZES.value)}; expected integers (0 = all examples)')
  try:
    rows = transfer.run_transfer(config, _WORKDIR.value, _MODES.value, sizes)
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'error: {e}')
  png = transfer.plot(rows, os.path.join(_WORKDIR.value, 'transfer.png'),
                      f'{rows[0]["family"]} from {_INIT.value} on {_TASK.value}')
  print(transfer.table(rows), file=sys.stderr, flush=True)
  print(json.dumps({'init': _INIT.value, 'task': _TASK.value, 'png': png, 'runs': rows}),
        flush=True)


if __name__ == '__main__':
  flags.mark_flags_as_required(['init', 'task', 'workdir'])
  app.run(main)
