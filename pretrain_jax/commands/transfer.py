r"""Does pre-training help? scratch vs linear_probe vs full vs LoRA fine-tuning of checkpoints on a
task.

  pretrain-jax transfer --init runs/tiny/gpt --task word_order --workdir runs/transfer/gpt \
      [--modes scratch,linear_probe,full,lora] [--sizes 200,0] [--seeds 0,1,2]
      [--formats head,generation] [--config.train.steps=300 ...]
  pretrain-jax transfer --init runs/tiny/bert,runs/tiny/gpt,runs/tiny/t5 --task word_order \
      --workdir runs/compare --modes scratch,full --sizes 100,300,0

Each run is `pretrain-jax finetune` in <workdir>/<mode>[_gen][_n<size>][_s<seed>] (rerunning
resumes or reuses a finished run; pick a new --workdir to start over); with several --init
checkpoints (comma-separated) each has <workdir>/<its directory's name>/. --sizes limits the
labelled training set to the first N examples (0 = all). --seeds repeats each run with
train.seed = each value (the head's and scratch's init, LoRA's factors, dropout) and adds a
line per mode: mean +- standard error [min, max]; on a small validation set one seed's margin
can be noise. --formats: 'head' (a classifier; T5: text to text) and, for the GPT family,
'generation' (the label written after a prompt, config.task.format); a checkpoint whose family
lacks one runs the others. Prints a table (final and best validation metric, steps, wall time,
step time, trainable parameters) to stderr, one JSON line to stdout, and writes (gs:// too)
<workdir>/transfer.png for one checkpoint (training loss and the validation metric against
step) and <workdir>/comparison.png for several checkpoints or sizes (the metric against step
and against labelled-set size, a line per checkpoint and mode in a band of one standard error
over the seeds, scratch dashed, LoRA dash-dotted) with its numbers in comparison.json. A plot
that fails is reported after the JSON line (its path null), never instead.
"""
from absl import flags

from pretrain_jax import cli
from pretrain_jax.cli import finetune_flags as ft_flags

_CONFIG, _INIT, _TASK = cli.define(ft_flags.define_common)
flags.adopt_module_key_flags(ft_flags)   # --help lists --config, --init and --task
_WORKDIR = flags.DEFINE_string('workdir', None, 'one subdirectory per run, and transfer.png')
_MODES = flags.DEFINE_list('modes', [], 'modes to run (default: scratch, linear_probe, full, '
                           'lora; T5 has no head to probe: scratch, full, lora)')
_SIZES = flags.DEFINE_list('sizes', ['0'], 'labelled training set sizes (0 = all)')
_SEEDS = flags.DEFINE_list('seeds', [], 'train.seed of each repeat of every run (default: '
                           "the config's, once)")
_FORMATS = flags.DEFINE_list('formats', [], "task formats: head, generation (GPT family; "
                             "default: the config's task.format)")


def _run(argv):
  del argv
  from pretrain_jax.finetune import transfer  # noqa: PLC0415 (after the flag checks)
  config = cli.config_of(_CONFIG, 'fine-tuning')
  config.unlock()
  config.init, config.task.name = _INIT.value, _TASK.value
  sizes = _integers('sizes', _SIZES.value, 'integers (0 = all examples)')
  if any(size < 0 for size in sizes) or len(set(sizes)) != len(sizes):
    raise ValueError(f'--sizes={",".join(_SIZES.value)}; expected distinct integers >= 0 (0 = '
                     'all examples)')
  if len(set(_MODES.value)) != len(_MODES.value):   # one run would count as two seeds
    raise ValueError(f'--modes={",".join(_MODES.value)}; expected distinct modes')
  seeds = _integers('seeds', _SEEDS.value, 'distinct integers')
  if len(set(seeds)) != len(seeds):
    raise ValueError(f'--seeds={",".join(_SEEDS.value)}; expected distinct integers')
  inits = [p for p in _INIT.value.split(',') if p]
  if len(inits) > 1:
    rows = transfer.run_comparison(config, _WORKDIR.value, inits, _MODES.value, sizes, seeds,
                                   _FORMATS.value)
    title = f'{", ".join(transfer.checkpoint_names(inits))} on {_TASK.value}'
  else:
    rows = transfer.run_transfer(config, _WORKDIR.value, _MODES.value, sizes, seeds,
                                 _FORMATS.value)
    title = f'{rows[0]["family"]} from {_INIT.value} on {_TASK.value}'
  transfer.report(rows, _WORKDIR.value, title, init=_INIT.value, task=_TASK.value)


def _integers(name, values, expected):
  try:
    return [int(v) for v in values]
  except ValueError:
    raise ValueError(f'--{name}={",".join(values)}; expected {expected}') from None


def main(argv=None) -> None:
  flags.mark_flags_as_required(['init', 'task', 'workdir'])
  cli.run(_run, argv)


if __name__ == '__main__':
  main()
