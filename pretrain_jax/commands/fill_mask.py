"""BERT fill-mask: top-k tokens with probabilities for each [MASK] in a sentence.

  pretrain-jax fill_mask --workdir runs/tiny/bert --text 'The [MASK] of a list.' [--top_k 5]

Ends with one JSON line.
"""
import sys

from absl import app, flags

from pretrain_jax import cli
from pretrain_jax.cli import terminal

_WORKDIR = flags.DEFINE_string('workdir', None, 'BERT workdir, checkpoint or HF directory',
                               required=True)
_TEXT = flags.DEFINE_string('text', None, 'sentence with one or more [MASK]', required=True)
_TOP_K = flags.DEFINE_integer('top_k', 5, 'candidates per mask')


def _run(argv):
  del argv
  from pretrain_jax import inference  # noqa: PLC0415 (JAX: after the flag checks)
  if _TOP_K.value < 1:
    raise app.UsageError(f'--top_k={_TOP_K.value}; expected >= 1')
  model = inference.load_pretrained(_WORKDIR.value)
  masks = inference.fill_mask(model, _TEXT.value, _TOP_K.value)
  for m in masks:
    print(f"[MASK]@{m['position']}: " + ', '.join(
        f"{c['word']!r} {c['probability']:.3f}" for c in m['candidates']), file=sys.stderr)
  terminal.finish({'text': _TEXT.value, 'step': model.step, 'masks': masks})


def main(argv=None) -> None:
  cli.run(_run, argv)


if __name__ == '__main__':
  main()
