"""Generate from a GPT (continuation) or T5 (span filling) checkpoint, with the KV cache.

  pretrain-jax generate --workdir runs/tiny/gpt --prompt 'The list' --prompt 'A module'
  pretrain-jax generate --workdir runs/tiny/t5 --prompt 'The <extra_id_0> of a list.'
      [--max_new_tokens 32] [--temperature 0.8] [--top_k 40] [--top_p 0.95] [--seed 0]

Greedy by default (temperature 0); the seed makes sampling reproducible. Stops at EOS or
max_new_tokens. Ends with one JSON line.
"""
import sys

from absl import flags

from pretrain_jax import cli
from pretrain_jax.cli import terminal

_WORKDIR = flags.DEFINE_string('workdir', None, 'training workdir, checkpoint or HF directory',
                               required=True)
_PROMPT = flags.DEFINE_multi_string('prompt', None, 'prompt (repeat for a batch)', required=True)
_MAX = flags.DEFINE_integer('max_new_tokens', 32, 'tokens to generate at most')
_TEMPERATURE = flags.DEFINE_float('temperature', 0.0, '0 = greedy')
_TOP_K = flags.DEFINE_integer('top_k', 0, 'sample from the k most likely tokens (0 = all)')
_TOP_P = flags.DEFINE_float('top_p', 1.0, 'nucleus sampling mass (1 = all)')
_SEED = flags.DEFINE_integer('seed', 0, 'sampling seed')


def _run(argv):
  del argv
  from pretrain_jax import inference  # noqa: PLC0415 (JAX: after the flag checks)
  from pretrain_jax.inference import text  # noqa: PLC0415 (as above)
  text.check_sampling(_MAX.value, _TEMPERATURE.value, _TOP_K.value, _TOP_P.value)  # before load
  model = inference.load_pretrained(_WORKDIR.value)
  results = inference.generate_text(model, _PROMPT.value, max_new_tokens=_MAX.value,
                                    temperature=_TEMPERATURE.value, top_k=_TOP_K.value,
                                    top_p=_TOP_P.value, seed=_SEED.value)
  for r in results:
    print(f"{r['prompt']!r} -> {r['text']!r}{text.why_empty(r)}", file=sys.stderr)
  terminal.finish({'family': model.family, 'step': model.step, 'results': results})


def main(argv=None) -> None:
  cli.run(_run, argv)


if __name__ == '__main__':
  main()
