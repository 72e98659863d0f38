"""Print a config's parameter tree (path, shape, logical axes) without allocating weights.

  pretrain-jax describe --config gpt2_small [--config.model.num_layers=24]

The table (stderr) lists the parameters as a person counts layers (h_0, h_1, ..., h_10), under a
header row, with the total. Ends with one JSON line: {"params": N, "family": ..., "layers": ...,
"emb_dim": ..., "vocab_size": ...}.
"""

from absl import flags
from ml_collections import config_flags

from pretrain_jax import cli
from pretrain_jax.cli import terminal

_CONFIG = config_flags.DEFINE_config_file('config', None, cli.CONFIG_HELP, lock_config=True)


def _run(argv):
  del argv
  from pretrain_jax.models import ModelConfig, describe  # noqa: PLC0415 (JAX: after the flag checks)
  cfg = ModelConfig.from_config(cli.config_of(_CONFIG, 'pre-training').model)
  rows, total = describe.parameter_table(cfg)
  last = f'total ({len(rows)} arrays)'
  width = max(len(r[0]) for r in [*rows, (last,)])

  def row(path, shape, axes, count):
    return f'{path:<{width}}  {shape:<20} {axes:<32} {count:>12}'
  header = row('parameter', 'shape', 'logical axes', 'count')
  table = [header, '-' * len(header)]
  table += [row(p, str(s), str(a), f'{c:,}') for p, s, a, c in rows]
  table += ['-' * len(header), row(last, '', '', f'{total:,}')]
  terminal.finish({'params': total, 'family': cfg.family, 'layers': cfg.num_layers,
                   'emb_dim': cfg.emb_dim, 'vocab_size': cfg.vocab_size}, summary=table)


def main(argv=None) -> None:
  flags.mark_flags_as_required(['config'])
  cli.run(_run, argv)


if __name__ == '__main__':
  main()
