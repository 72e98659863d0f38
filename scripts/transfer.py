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

from pretrain_jax import cli  # pylint: disable=g-bad-import-order  (first: quiets TF)
from absl import flags

from pretrain_jax.finetune import flags as ft_flags

_CONFIG, _INIT, _TASK = ft_flags.define_common()
_WORKDIR = flags.DEFINE_string('workdir', None, 'one subdirectory per run, and transfer.png')
_MODES = flags.DEFINE_list('modes', [], 'modes to run (default: scratch, linear_probe, full; '
                           'T5 has no head to probe: scratch, full)')
_SIZES = flags.DEFINE_list('sizes', ['0'], 'labelled training set sizes (0 = all)')


def main(argv):
  del argv
  from pretrain_jax.finetune import transfer  # pylint: disable=g-import-not-at-top
  config = _CONFIG.value
  config.unlock()
  config.init, config.task.name = _INIT.value, _TASK.value
  try:
    sizes = [int(s) for s in _SIZES.value]
  except ValueError:
    raise ValueError(f'--sizes={",".join(_SIZES.value)}; expected integers (0 = all '
                     'examples)') from None
  rows = transfer.run_transfer(config, _WORKDIR.value, _MODES.value, sizes)
  png = transfer.plot(rows, os.path.join(_WORKDIR.value, 'transfer.png'),
                      f'{rows[0]["family"]} from {_INIT.value} on {_TASK.value}')
  print(transfer.table(rows), file=sys.stderr, flush=True)
  print(json.dumps({'init': _INIT.value, 'task': _TASK.value, 'png': png, 'runs': rows}),
        flush=True)


if __name__ == '__main__':
  flags.mark_flags_as_required(['init', 'task', 'workdir'])
  cli.run(main)
