r"""Fine-tune or probe a checkpoint on a labelled task, on the pre-training loop.

  pretrain-jax finetune --init runs/tiny/gpt --task word_order --workdir runs/ft/gpt_full \
      --mode full [--config.train.steps=300 --config.train.learning_rate=1e-3 ...]
  pretrain-jax finetune --init bert-base-uncased/ --task glue/sst2 \
      --config.task.tfds_data_dir=gs://my-bucket/tfds --workdir runs/sst2 --mode linear_probe
  pretrain-jax finetune --init runs/tiny/bert --task word_order --workdir runs/lora/bert \
      --mode lora [--config.lora.rank=8 --config.lora.targets=q,k,v,o,mlp ...]

--init: a training workdir, one of its checkpoints/<step> directories, or a Hugging Face model
directory. --task: 'word_order' (embedded, no download), a tfds name (glue/sst2, glue/cola,
glue/mrpc, glue/qnli, glue/rte, glue/qqp, super_glue/boolq), a directory with train.* and
validation.* (.jsonl/.json/.csv/.tsv with text [, text_pair], label or inputs, targets), or
'train=FILE,validation=FILE'. --mode: {modes} (pretrain_jax/finetune; lora saves the
adapter alone, docs/finetuning.md).
Checkpoints, SIGTERM and resuming work as in pretrain-jax train (rerun the command to resume).
Progress and a summary go to stderr, metrics.jsonl and TensorBoard; stdout gets one JSON line
(a run refused before it trained leaves no new workdir behind). Predict
with `pretrain_jax.load_pretrained(WORKDIR).predict(['a sentence', ...])`.
"""
from absl import flags

from pretrain_jax import cli
from pretrain_jax.cli import finetune_flags as ft_flags
from pretrain_jax.cli import terminal
from pretrain_jax.finetune import MODES  # (no JAX: the flags are checked first)

__doc__ = __doc__.format(modes=' | '.join(MODES))   # --help lists every mode

_CONFIG, _INIT, _TASK = cli.define(ft_flags.define_common)
flags.adopt_module_key_flags(ft_flags)   # --help lists --config, --init and --task
_WORKDIR = flags.DEFINE_string('workdir', None, 'checkpoints, logs and config.json go here')
_MODE = flags.DEFINE_enum('mode', 'full', MODES, 'what trains (docs/finetuning.md)')


def _run(argv):
  del argv
  from pretrain_jax import finetune  # noqa: PLC0415 (after the flag checks)
  config = cli.config_of(_CONFIG, 'fine-tuning')
  config.unlock()
  config.init, config.task.name, config.mode = _INIT.value, _TASK.value, _MODE.value
  with terminal.removed_if_refused(_WORKDIR.value):
    result = finetune.finetune(config, _WORKDIR.value)
  best = '-' if result['best'] is None else f"{result['best']:.4f}"
  terminal.finish(result, summary=[
      terminal.run_summary(result),
      f"{result['mode']} on {result['task']} from {result['init']}: {result['metric']} "
      f"{'-' if result['final'] is None else format(result['final'], '.4f')} (best {best})"])


def main(argv=None) -> None:
  flags.mark_flags_as_required(['init', 'task', 'workdir'])
  cli.run(_run, argv)


if __name__ == '__main__':
  main()
