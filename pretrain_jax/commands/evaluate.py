"""Evaluate a checkpoint on a split with the train loop's evaluator (training/evaluate.py).

Metric names are the train loop's: loss (the training objective: LM + z-loss + NSP), lm_loss,
lm_perplexity, lm_accuracy, lm_top5_accuracy, z_loss, nsp_loss, nsp_accuracy.

  pretrain-jax evaluate --workdir runs/tiny/gpt [--files 'my/*.jsonl'] [--split validation]
                             [--random_init] [--batches N] [--step 300]

--batches defaults to the run's train.eval_batches: the numbers of its last validation
(metrics.jsonl) for that checkpoint; with --files, --split or --batch_size, to 20. The JSON
line says how many batches were read.

The masking / span noise uses the config's fixed data seed, so two runs print the same numbers.
Prints what it measured on what (stderr), then one JSON line of metrics.
"""

from absl import flags

from pretrain_jax import cli, data
from pretrain_jax.cli import terminal

_WORKDIR = flags.DEFINE_string('workdir', None, 'training workdir (or checkpoint dir)',
                               required=True)
_FILES = flags.DEFINE_string('files', '', 'evaluate on these C4-format files instead')
_SPLIT = flags.DEFINE_string('split', '', 'split to read (default: config.data.eval_split)')
_RANDOM = flags.DEFINE_bool('random_init', False, 'evaluate the untrained architecture (the '
                            "workdir's config and tokenizer, fresh parameters; step null)")
_BATCHES = flags.DEFINE_integer('batches', None, 'batches to evaluate (0 = the whole split; '
                                'default: the run\'s train.eval_batches, so the numbers of its '
                                'last validation; 20 with --files, --split or --batch_size)',
                                lower_bound=0)
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 0, 'rows per batch (default: train batch)',
                                   lower_bound=0)
_STEP = flags.DEFINE_integer('step', None, 'checkpoint step (default: latest)', lower_bound=0)


def _run(argv):
  del argv
  from pretrain_jax import hf  # noqa: PLC0415 (JAX: after the flag checks)
  from pretrain_jax.inference import load_pretrained  # noqa: PLC0415 (as above)
  from pretrain_jax.run import metrics as metrics_lib  # noqa: PLC0415 (as above)
  from pretrain_jax.training import evaluate as eval_lib  # noqa: PLC0415 (as above)
  if _RANDOM.value and _STEP.value is not None:
    raise ValueError(f'--random_init with --step {_STEP.value}: a random init has no step; '
                     'expected one of them')
  if hf.is_hf_dir(_WORKDIR.value):   # no data or training settings to evaluate with
    raise ValueError(f'{_WORKDIR.value} is a Hugging Face model directory, which names no '
                     'data to evaluate on; expected a training workdir (import it first: '
                     f'pretrain-jax convert_hf import --hf_dir {_WORKDIR.value} --workdir DIR, '
                     'then pretrain-jax evaluate --workdir DIR [--files ...])')
  model = load_pretrained(_WORKDIR.value, _STEP.value)
  if model.task:   # a fine-tuning workdir: its task's metrics are in metrics.jsonl
    raise ValueError(f'{_WORKDIR.value} holds a model fine-tuned on task '
                     f'{model.task.name!r}; expected a pre-training workdir (a '
                     'fine-tune is evaluated on its task by pretrain-jax finetune: the workdir\'s '
                     'metrics.jsonl, or load_pretrained(WORKDIR).predict)')
  d, t = model.data_config, model.train_config
  if _FILES.value:
    from pretrain_jax.data import local_builder  # noqa: PLC0415 (TensorFlow)
    local_builder.expand_files(_FILES.value, name='--files')   # errors name the flag
    d = d.replace(files=_FILES.value, tfds_name='')
  split = _SPLIT.value or d.eval_split
  batches = data.make_dataset(d, model.tokenizer, split=split,
                              batch_size=_BATCH_SIZE.value or t.batch_size,
                              repeat=False, model_max_len=model.model_config.max_len)
  params = (eval_lib.random_init_params(model.model_config, t.seed)
            if _RANDOM.value else model.params)
  count = _BATCHES.value
  if count is None:   # the run's own validation, unless other data or batch size are asked for
    same = not (_FILES.value or _SPLIT.value or _BATCH_SIZE.value)
    count = t.eval_batches if same else 20
  metrics = model.evaluate(batches, count, params=params, progress=metrics_lib.Progress(count))
  step = None if _RANDOM.value else model.step   # the baseline is no checkpoint's step
  what = 'its architecture, random init' if _RANDOM.value else f'step {step}'
  data_name = d.tfds_name or d.files or 'the embedded corpus'
  count = metrics['batches']
  terminal.finish({'family': model.family, 'workdir': _WORKDIR.value, 'step': step,
                   'split': split, 'random_init': _RANDOM.value, **metrics},
                  summary=[f'{model.family} {_WORKDIR.value} ({what}) on {data_name}, split '
                           f'{split!r}: {count} batch{"es" if count != 1 else ""}, '
                           f'{metrics["target_tokens"]:,} target tokens',
                           '  ' + summary(metrics)])


def summary(metrics: dict) -> str:
  """The measured numbers in a line, e.g. `loss 3.412  perplexity 30.3  accuracy 0.351`."""
  shown = [('loss', 'loss', '.4f'), ('lm_perplexity', 'perplexity', '.2f'),
           ('lm_accuracy', 'accuracy', '.3f'), ('lm_top5_accuracy', 'top-5 accuracy', '.3f'),
           ('nsp_accuracy', 'NSP accuracy', '.3f')]
  return '  '.join(f'{label} {metrics[k]:{spec}}' for k, label, spec in shown
                   if metrics.get(k) is not None)


def main(argv=None) -> None:
  cli.run(_run, argv)


if __name__ == '__main__':
  main()
