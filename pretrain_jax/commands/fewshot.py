r"""Zero- and few-shot classification by a GPT-family checkpoint: no training, the labels ranked.

  pretrain-jax fewshot --init runs/tiny/gpt --task word_order [--shots 0,4,16]
      [--split validation] [--max_examples N] [--question 'Word order'] [--seed 0]

Each example of the split becomes a prompt, `<text>\n<question>:`, after k examples of the
training split with their labels (drawn per example from --seed), and every label ' <label>'
is scored by its log-likelihood as the continuation (pretrain_jax/inference/scoring.py;
data/prompts.py has the format). acc picks the likeliest label; acc_norm divides each label's
log-likelihood by its length in characters first (lm-evaluation-harness's acc_norm). A prompt
longer than the model loses its first tokens (the earliest shots; counted as `truncated`).
--task: 'word_order' (embedded), a tfds name (glue/sst2, ...; --tfds_data_dir), a directory
with train.* and validation.* holding text [, text_pair], label. A table goes to stderr, one
JSON line to stdout.
"""
import sys
import time

from absl import flags

from pretrain_jax import cli
from pretrain_jax.cli import terminal
from pretrain_jax.data import tasks

_INIT = flags.DEFINE_string('init', None, 'checkpoint: a GPT-family training workdir, '
                            'checkpoints/<step> or a Hugging Face GPT-2 directory')
_TASK = flags.DEFINE_string('task', None, 'word_order, a tfds name, or a directory')
_SHOTS = flags.DEFINE_list('shots', ['0'], 'in-context examples per prompt, one run each')
_SPLIT = flags.DEFINE_string('split', 'validation', 'the split scored')
_MAX = flags.DEFINE_integer('max_examples', 0, 'score the first N examples (0 = all)',
                            lower_bound=0)
_QUESTION = flags.DEFINE_string('question', '', "what the prompt asks before the label (default: "
                                "the task's, e.g. 'Sentiment' for glue/sst2; 'Label')")
_SEED = flags.DEFINE_integer('seed', 0, 'which training examples become the shots')
_TFDS_DIR = flags.DEFINE_string('tfds_data_dir', '', 'where a tfds task is prepared')
_BATCH = flags.DEFINE_integer('batch_size', 32, 'rows (prompt + one label) per forward pass',
                              lower_bound=1)


def shot_counts(values) -> list:
  try:
    shots = [int(v) for v in values]
  except ValueError:
    shots = [-1]
  if not shots or min(shots) < 0 or len(set(shots)) != len(shots):
    raise ValueError(f'--shots={",".join(values)}; expected distinct integers >= 0')
  return shots


def table(results: list) -> str:
  header = f'{"shots":>5} {"acc":>6} {"acc_norm":>8} {"mcc":>6} {"f1":>6} {"truncated":>9} ' \
           f'{"sec":>6}'
  lines = [header, '-' * len(header)]
  for r in results:
    lines.append(f'{r["shots"]:>5} {r["acc"]:>6.3f} {r["acc_norm"]:>8.3f} {r["mcc"]:>6.3f} '
                 f'{r["f1"]:>6.3f} {r["truncated"]:>9} {r["wall_sec"]:>6.1f}')
  return '\n'.join(lines)


def _run(argv):
  del argv
  from pretrain_jax.data import prompts  # noqa: PLC0415 (after the flag checks)
  from pretrain_jax.inference import load, scoring  # noqa: PLC0415 (after the flag checks)
  shots = shot_counts(_SHOTS.value)
  model = load.load_pretrained(_INIT.value)
  scoring.check_scores(model.model_config, '--shots', _INIT.value)
  task = tasks.load_task(_TASK.value, tfds_data_dir=_TFDS_DIR.value)
  question = _QUESTION.value or task.question
  results = []
  for k in shots:
    start = time.perf_counter()
    out = scoring.fewshot(model.params, model.model_config, model.tokenizer, task, shots=k,
                          question=question, split=_SPLIT.value, max_examples=_MAX.value,
                          seed=_SEED.value, batch_size=_BATCH.value)
    results.append(dict(out, wall_sec=time.perf_counter() - start))
  example = prompts.context({'text': '<text>'}, question)
  print(f'{model.family} from {_INIT.value} on {task.name} ({_SPLIT.value}, '
        f'{results[0]["examples"]} examples): {example!r} -> '
        f'{" | ".join(repr(prompts.continuation(label)) for label in task.labels)}\n'
        f'{table(results)}',
        file=sys.stderr, flush=True)
  terminal.finish({'init': _INIT.value, 'task': task.name, 'family': model.family,
                   'split': _SPLIT.value, 'question': question, 'results': results})


def main(argv=None) -> None:
  flags.mark_flags_as_required(['init', 'task'])
  cli.run(_run, argv)


if __name__ == '__main__':
  main()
