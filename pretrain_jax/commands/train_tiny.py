"""The main job: a tiny BERT, GPT and T5 on the embedded corpus (CPU, a few minutes), then proof
that they learned: trained vs random-init metrics on held-out text, and outputs that use context.

  pretrain-jax train_tiny [--workdir runs/tiny] [--models tiny_gpt,...] [--steps 300]

Each model trains in <workdir>/<family> (bert, gpt, t5) with checkpoints, TensorBoard and
metrics.jsonl, exactly as `pretrain-jax train --config <name> --workdir
<workdir>/<family>` would (rerunning resumes; pick a new --workdir to start over). Then each
checkpoint is loaded as a user would (`pretrain_jax.load_pretrained`) and probed on sentences of
the held-out split (pretrain_jax.inference.demo): BERT fills one masked word per sentence, GPT
continues the first words of sentences, T5 fills a masked span. Progress and the tables go to
stderr; stdout gets one compact JSON line (each model's headline numbers and paths), and
<workdir>/train_tiny_results.json every number (the line names it: `details`).
"""
import importlib
import sys
import time

from absl import flags
from etils import epath

import configs
import pretrain_jax
from pretrain_jax import cli, data
from pretrain_jax.cli import terminal
from pretrain_jax.data.config import DataConfig

DEFAULT_MODELS = ['tiny_bert', 'tiny_gpt', 'tiny_t5']
EXPECTED = 'about 2.5-4.5 minutes on 2 idle cores (docs/performance.md)'

_WORKDIR = flags.DEFINE_string('workdir', 'runs/tiny', 'one subdirectory per model')
_MODELS = flags.DEFINE_list('models', DEFAULT_MODELS, 'config names (configs/<name>.py)')
_STEPS = flags.DEFINE_integer('steps', 0, 'train steps per model (0 = the config\'s)',
                              lower_bound=0)
_PROBES = flags.DEFINE_integer('probe_sentences', 40, 'held-out sentences per probe (0 = none)',
                               lower_bound=0)
_EVAL_BATCHES = flags.DEFINE_integer('eval_batches', 8, 'held-out batches for the metrics table',
                                     lower_bound=0)


def _fmt(value, spec):
  return '-' if value is None else format(value, spec)


# What to try on a trained model, as the README's Use section does, by family.
NEXT = {'gpt': "generate --workdir {}/gpt --prompt 'The return statement'",
        't5': "generate --workdir {}/t5 --prompt 'The <extra_id_0> statement is used to leave a "
              "loop.'",
        'bert': "fill_mask --workdir {}/bert --text 'The [MASK] statement is used to leave a "
                "loop.'"}


def next_command(workdir: str, families: list) -> str:
  """The hint for the first of gpt, t5, bert that this run trained."""
  family = next((f for f in NEXT if f in families), 'gpt')
  return 'pretrain-jax ' + NEXT[family].format(workdir)


def say(text: str = '') -> None:
  print(text, file=sys.stderr, flush=True)


def probe(workdir: str, texts: list, eval_batches: int) -> dict:
  """Held-out metrics of the checkpoint and of a random init, plus the family's text probe."""
  from pretrain_jax.inference import demo  # noqa: PLC0415 (after the flag checks)
  from pretrain_jax.models import family_of  # noqa: PLC0415 (after the flag checks)
  from pretrain_jax.training import evaluate as eval_lib  # noqa: PLC0415 (after the flag checks)
  model = pretrain_jax.load_pretrained(workdir)
  d = model.data_config

  def held_out():
    return data.make_dataset(d, model.tokenizer, split=d.eval_split,
                             batch_size=model.train_config.batch_size, repeat=False,
                             model_max_len=model.model_config.max_len)
  out = {'trained': model.evaluate(held_out(), eval_batches),
         'random_init': model.evaluate(held_out(), eval_batches,
                                       params=eval_lib.random_init_params(model.model_config))}
  record = family_of(model.model_config)
  if texts and record.fills_masks:
    out['masked_word'] = demo.masked_word_probe(model, texts)
    baseline = model.replace_params(eval_lib.random_init_params(model.model_config))
    out['masked_word_random_init'] = {
        k: v for k, v in demo.masked_word_probe(baseline, texts).items() if k != 'examples'}
  elif texts and record.generation == 'continue':
    out['continuations'] = demo.continuations(model, texts[:4])
  elif texts and record.generation == 'fill_spans':
    out['span_fills'] = demo.span_fills(model, texts[:4])
  return out


def report(family: str, result: dict) -> None:
  t, r = result['trained'], result['random_init']
  say(f'\n{family}: held-out {t["target_tokens"]:,} target tokens | trained vs random init: '
      f'loss {t["lm_loss"]:.3f} vs {r["lm_loss"]:.3f}, accuracy {t["lm_accuracy"]:.3f} vs '
      f'{r["lm_accuracy"]:.3f}, top-5 {t["lm_top5_accuracy"]:.3f} vs '
      f'{r["lm_top5_accuracy"]:.3f}')
  if 'masked_word' in result:
    p = result['masked_word']
    say(f'  one masked word per held-out sentence: the word is in the top 5 for '
        f'{p["top5_hit_rate"]:.0%} of {p["sentences"]} sentences (the other words shuffled: '
        f'{p["top5_hit_rate_context_shuffled"]:.0%}; random init: '
        f'{result["masked_word_random_init"]["top5_hit_rate"]:.0%})')
    for e in p['examples'][:4]:
      say(f'  {e["text"]!r}: {e["answer"]!r} -> {", ".join(map(repr, e["top"]))}'
          f'{"  (hit)" if e["hit"] else ""}')
  for e in result.get('continuations', []):
    say(f'  {e["prompt"]!r} -> {e["continuation"]!r}')
  for e in result.get('span_fills', []):
    say(f'  {e["input"]!r}: <extra_id_0> = {e["filled"]!r} (was {e["answer"]!r})')


HEADLINE = ('name', 'family', 'workdir', 'step', 'checkpoint_steps', 'train_loss', 'eval_loss',
            'eval_accuracy')   # a model's keys in the stdout line


def headline(result: dict) -> dict:
  """A model's entry in the stdout line: HEADLINE and its held-out loss, trained vs random
  init (rounded: the details file has every number whole)."""
  out = {k: round(result[k], 4) if isinstance(result[k], float) else result[k]
         for k in HEADLINE}
  held_out = result['held_out']
  for kind in ('trained', 'random_init'):
    out[f'held_out_loss_{kind}'] = round(held_out[kind]['lm_loss'], 4)
  return out


def _run(argv):
  del argv
  from pretrain_jax.data import sources  # noqa: PLC0415 (after the flag checks)
  from pretrain_jax.inference import demo  # noqa: PLC0415 (after the flag checks)
  from pretrain_jax.run import loop  # noqa: PLC0415 (after the flag checks)
  results, start_all = [], time.perf_counter()
  if _MODELS.value == DEFAULT_MODELS and not _STEPS.value:
    say(f'the main job: tiny BERT, GPT and T5, then held-out probes; {EXPECTED}')
  known = configs.config_names()
  unknown = [name for name in _MODELS.value if name not in known]
  if unknown:
    raise ValueError(f'--models names {unknown}; expected configs/<name>.py names such as '
                     f'{DEFAULT_MODELS} (configs/ has {known})')
  with terminal.removed_if_refused(_WORKDIR.value):
    for name in _MODELS.value:
      config = importlib.import_module(f'configs.{name}').get_config()
      if _STEPS.value:
        config.train.steps = _STEPS.value
        config.train.warmup_steps = min(config.train.warmup_steps, max(_STEPS.value // 10, 1))
        config.train.checkpoint_every = min(config.train.checkpoint_every, _STEPS.value)
      say(f'== {name}: {config.train.steps} steps of {config.train.batch_size} x '
          f'{config.data.seq_len} tokens')
      start = time.perf_counter()
      workdir = str(epath.Path(_WORKDIR.value) / config.model.family)
      result = loop.train_and_evaluate(config, workdir)
      result.update(name=name, wall_sec=time.perf_counter() - start)
      texts = []
      if _PROBES.value:
        d = DataConfig.from_config(config.data)
        texts = demo.sentences(sources.iter_texts(d, d.eval_split), count=_PROBES.value)
      result['held_out'] = probe(workdir, texts, _EVAL_BATCHES.value)
      results.append(result)

  header = (f'{"model":<10} {"params":>9} {"steps":>7} {"train loss":>10} {"val loss":>9} '
            f'{"val acc":>8} {"tokens/s":>9} {"step ms":>8} {"wall s":>7}')
  lines = ['', header, '-' * len(header)]
  for r in results:
    lines.append(f'{r["name"]:<10} {r["params"]:>9,} {r["start_step"]:>3}-{r["step"]:<3} '
                 f'{_fmt(r["train_loss"], ".3f"):>10} {_fmt(r["eval_loss"], ".3f"):>9} '
                 f'{_fmt(r["eval_accuracy"], ".3f"):>8} {_fmt(r["tokens_per_sec"], ",.0f"):>9} '
                 f'{_fmt(r["step_time_sec"] and 1000 * r["step_time_sec"], ".1f"):>8} '
                 f'{r["wall_sec"]:>7.1f}')
  say('\n'.join(lines))
  for r in results:
    report(r['family'], r['held_out'])
  total = time.perf_counter() - start_all
  hint = next_command(_WORKDIR.value, [r['family'] for r in results])
  say(f'\ndone in {total:.0f} s; every number in '
      f'{epath.Path(_WORKDIR.value) / "train_tiny_results.json"}\nnext: {hint}')
  terminal.finish({'workdir': _WORKDIR.value, 'wall_sec': round(total, 1),
                   'models': [headline(r) for r in results]},
                  details={'workdir': _WORKDIR.value, 'wall_sec': total, 'models': results},
                  where=_WORKDIR.value, name='train_tiny')


def main(argv=None) -> None:
  cli.run(_run, argv)


if __name__ == '__main__':
  main()
