"""The command-line commands: `pretrain-jax COMMAND [flags]` runs COMMAND's `main`.

Each command is a module here with a `main(argv=None)`, so `python -m
pretrain_jax.commands.COMMAND [flags]` is the same command. `COMMAND --help` lists its flags.
"""
import os
import runpy
import sys

# Before any command module: cli sets up the process (malloc, TensorFlow's log settings) at
# import, which must happen before a thread starts or TensorFlow loads.
from pretrain_jax import cli  # noqa: F401 (imported for the set-up above)

COMMANDS = {   # name: what it does (one line of `pretrain-jax --help`)
    'train_tiny': 'the main job: a tiny BERT, GPT and T5 on the embedded corpus, then probes',
    'train': 'pre-train a config (resumes from the workdir; one host to a TPU pod slice)',
    'evaluate': "a checkpoint's held-out loss, perplexity and accuracies",
    'generate': 'continue text (GPT) or fill spans (T5) with the KV cache',
    'fill_mask': "BERT's top-k tokens for each [MASK]",
    'describe': "a config's parameter tree, without allocating weights",
    'finetune': 'fine-tune, linear-probe or train from scratch on a labelled task',
    'transfer': 'scratch vs linear probe vs full fine-tuning of checkpoints, with curves',
    'fewshot': 'zero- and few-shot classification by a GPT: the labels ranked by likelihood',
    'convert_hf': 'Hugging Face model directory <-> training workdir',
    'train_tokenizer': 'train a sentencepiece tokenizer (T5 sentinels, BERT specials)',
    'plan': "will a config fit a TPU slice, at what batch, how fast at best (the TPU compiler)",
    'tpu': 'Cloud TPU VM slices: create, set up, run, watch, recover, delete',
    'benchmark': "time a config's real train step (tokens/s, MFU)",
    'benchmark_data': 'time the input pipeline alone',
    'shakespeare': 'the chapter experiment: character-level BERT vs GPT on tiny Shakespeare',
}


READS_WORKDIR = ('evaluate', 'generate', 'fill_mask')   # commands whose --workdir must exist


def missing_workdir(argv: list):
  """The local `--workdir` of argv that does not exist, else None: refused before the command
  imports JAX and the rest (seconds), where every other mistake is refused at once."""
  for i, arg in enumerate(argv):
    value = arg.removeprefix('--workdir=') if arg.startswith('--workdir=') else (
        argv[i + 1] if arg == '--workdir' and i + 1 < len(argv) else None)
    if value and '://' not in value and not os.path.exists(value):  # noqa: TID251 (local only)
      return value
  return None


def usage() -> str:
  width = max(map(len, COMMANDS))
  lines = [f'  {name:<{width}}  {what}' for name, what in COMMANDS.items()]
  return ('usage: pretrain-jax COMMAND [flags]   (pretrain-jax COMMAND --help for its flags)\n'
          'commands:\n' + '\n'.join(lines))


def main(argv=None) -> None:
  argv = sys.argv if argv is None else argv
  if len(argv) < 2 or argv[1] in ('-h', '--help'):
    print(usage(), file=sys.stderr if len(argv) < 2 else sys.stdout)
    sys.exit(0 if len(argv) >= 2 else 2)
  name = argv[1].replace('-', '_')
  if name not in COMMANDS:
    print(f'error: unknown command {argv[1]!r}; expected one of {", ".join(COMMANDS)}',
          file=sys.stderr)
    sys.exit(2)
  missing = missing_workdir(argv[2:]) if name in READS_WORKDIR else None
  if missing:
    print(f'error: {missing!r} is not a directory; expected a training workdir, a checkpoint '
          'directory or a Hugging Face model directory', file=sys.stderr)
    sys.exit(2)
  # Run as `python -m` would: the module is __main__, so absl's --help shows its docstring and
  # flags (absl files a flag under the module that defines it and shows __main__'s).
  sys.argv = [argv[0]] + list(argv[2:])
  runpy.run_module(f'pretrain_jax.commands.{name}', run_name='__main__', alter_sys=True)
