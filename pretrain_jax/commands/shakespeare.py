"""The classic BERT-vs-GPT pre-training experiment on character-level tiny Shakespeare.

  pretrain-jax shakespeare --corpus tinyshakespeare.txt [--config.gpt.train.steps=600]

Prints GPT validation perplexity, BERT held-out MLM top-1/top-5 against a random-init encoder,
and the training wall time of each; ends with one JSON line. `--config.masking=span` pre-trains
BERT with SpanBERT's spans; `--config.models=bert` trains one of the two;
`--config.finetune.steps=300` fine-tunes each on word order with one shared head (the
chapter's exercises 41.3 and 41.4: docs/chapter41.md), and `--config.finetune.scratch=true`
fine-tunes their random inits instead (the baseline).
"""
import os
import sys
import time

import numpy as np
from absl import app, flags
from ml_collections import config_flags

import configs
from pretrain_jax import cli
from pretrain_jax.cli import process, terminal

# (cli.define: the default config reads the --config.* overrides here, at definition)
_CONFIG = cli.define(lambda: config_flags.DEFINE_config_file(
    'config', configs.config_path('shakespeare_char'), 'experiment config: a name or a file'))
_CORPUS = flags.DEFINE_string('corpus', None, 'path of tinyshakespeare.txt', required=True)


def progress(name: str, steps: int, chars_per_step: int):
  """A train() callback printing step, loss, characters/s and ETA on stderr after every jitted
  call; the pace counts from the end of the first call (which compiles)."""
  from pretrain_jax.run import metrics as metrics_lib  # noqa: PLC0415 (JAX: after the flags)
  first = []

  def report(done, metrics):
    loss = float(np.ravel(metrics['loss'])[-1])
    now = time.perf_counter()
    line = f'{name} step {done}/{steps} | loss {loss:.4f}'
    if first and done > first[1]:
      seconds_per_step = (now - first[0]) / (done - first[1])
      line += (f' | {chars_per_step / seconds_per_step:,.0f} chars/s | eta '
               f'{metrics_lib.format_eta((steps - done) * seconds_per_step)}')
    else:
      first.extend([now, done])
    print(line, file=sys.stderr, flush=True)
  return report


def _run(argv):
  del argv
  from pretrain_jax.experiments import char_lm  # noqa: PLC0415 (JAX: after the flag checks)
  config = cli.config_of(_CONFIG, 'chapter experiment')
  config.corpus = _CORPUS.value
  if not os.path.isfile(config.corpus):  # noqa: TID251 (the experiment's local corpus file)
    raise app.UsageError(f'--corpus={config.corpus!r} is not a file')
  process.use_cpu_devices(config.cpu_devices)
  result = char_lm.run(config, progress)
  g, b = result.get('gpt'), result.get('bert')
  if g and 'steps' in g:
    print(f"GPT  {g['steps']} steps in {g['train_seconds']:.1f}s: validation perplexity "
          f"{g['valid_perplexity']:.2f} (published 5.69)", file=sys.stderr)
  if b and 'steps' in b:
    print(f"BERT {b['steps']} steps in {b['train_seconds']:.1f}s ({b['masking']} masking): "
          f"held-out MLM top-1 {b['heldout_top1']:.3f} top-5 {b['heldout_top5']:.3f} loss "
          f"{b['heldout_loss']:.3f} (published 0.569 / 0.857; random init "
          f"{b['random_init_top1']:.3f} / {b['random_init_top5']:.3f})", file=sys.stderr)
    print(char_lm.draws_line(b), file=sys.stderr)
  for name, r in (('GPT', g), ('BERT', b)):
    if r and 'finetune' in r:
      f = r['finetune']
      print(f"{name:<4} {'from random init, ' if result.get('scratch') else ''}fine-tuned "
            f"{f['steps']} steps on word order (mean-pooled linear head): accuracy "
            f"{f['accuracy']:.3f} on {f['eval_examples']} held-out windows", file=sys.stderr)
  terminal.finish(result)


def main(argv=None) -> None:
  cli.run(_run, argv)


if __name__ == '__main__':
  main()
