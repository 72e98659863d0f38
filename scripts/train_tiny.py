"""Train tiny_bert, tiny_gpt and tiny_t5 on the embedded corpus (CPU, minutes) and compare.

  python scripts/train_tiny.py [--workdir /tmp/pretrain_jax_tiny] [--models tiny_gpt,...]
                               [--steps 300]

Each model trains in <workdir>/<family> (bert, gpt, t5) with checkpoints, TensorBoard and
metrics.jsonl, exactly as `scripts/train.py --config configs/<name>.py --workdir
<workdir>/<family>` would (rerunning resumes; pick a new --workdir to start over). Prints a
summary table to stderr and one JSON line of results to stdout. Use a result with
`scripts/evaluate.py --workdir <workdir>/<family>` or `pretrain_jax.load_pretrained(...)`.
"""
import importlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # pylint: disable=g-import-not-at-top

_WORKDIR = flags.DEFINE_string('workdir', '/tmp/pretrain_jax_tiny', 'one subdirectory per model')
_MODELS = flags.DEFINE_list('models', ['tiny_bert', 'tiny_gpt', 'tiny_t5'], 'configs/<name>.py')
_STEPS = flags.DEFINE_integer('steps', 0, 'train steps per model (0 = the config\'s)')


def _fmt(value, spec):
  return '-' if value is None else format(value, spec)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from pretrain_jax.training import loop  # pylint: disable=g-import-not-at-top
  results = []
  for name in _MODELS.value:
    config = importlib.import_module(f'configs.{name}').get_config()
    if _STEPS.value:
      config.train.steps = _STEPS.value
      config.train.warmup_steps = min(config.train.warmup_steps, max(_STEPS.value // 10, 1))
    start = time.perf_counter()
    result = loop.train_and_evaluate(config, os.path.join(_WORKDIR.value, config.model.family))
    result.update(name=name, wall_sec=time.perf_counter() - start)
    results.append(result)

  header = (f'{"model":<10} {"params":>9} {"steps":>7} {"train loss":>10} {"val loss":>9} '
            f'{"val acc":>8} {"tokens/s":>9} {"step ms":>8} {"wall s":>7}')
  lines = [header, '-' * len(header)]
  for r in results:
    lines.append(f'{r["name"]:<10} {r["params"]:>9,} {r["start_step"]:>3}-{r["step"]:<3} '
                 f'{_fmt(r["train_loss"], ".3f"):>10} {_fmt(r["eval_loss"], ".3f"):>9} '
                 f'{_fmt(r["eval_accuracy"], ".3f"):>8} {_fmt(r["tokens_per_sec"], ",.0f"):>9} '
                 f'{_fmt(r["step_time_sec"] and 1000 * r["step_time_sec"], ".1f"):>8} '
                 f'{r["wall_sec"]:>7.1f}')
  print('\n'.join(lines), file=sys.stderr, flush=True)
  print(json.dumps({'workdir': _WORKDIR.value, 'models': results}), flush=True)


if __name__ == '__main__':
  app.run(main)
