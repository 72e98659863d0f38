"""Print a config's parameter tree (path, shape, logical axes) without allocating weights.

  pretrain-jax describe --config gpt2_small [--config.model.num_layers=24]

Ends with one JSON line: {"params": N, "family": ..., "layers": ..., "emb_dim": ...,
"vocab_size": ...}.
"""
import json
import sys

from pretrain_jax import cli  # pylint: disable=g-bad-import-order  (first: quiets TF)
from absl import flags
from ml_collections import config_flags

from pretrain_jax.models import ModelConfig, describe

_CONFIG = config_flags.DEFINE_config_file('config', None, cli.CONFIG_HELP, lock_config=True)


def _run(argv):
  del argv
  cfg = ModelConfig.from_config(cli.config_of(_CONFIG, 'pre-training').model)
  rows, total = describe.parameter_table(cfg)
  width = max(len(r[0]) for r in rows)
  for path, shape, axes, count in rows:
    print(f'{path:<{width}}  {str(shape):<20} {str(axes):<32} {count:>12,}', file=sys.stderr)
  print(f'total parameters: {total:,}', file=sys.stderr)
  print(json.dumps({'params': total, 'family': cfg.family, 'layers': cfg.num_layers,
                    'emb_dim': cfg.emb_dim, 'vocab_size': cfg.vocab_size}))


def main(argv=None) -> None:
  flags.mark_flags_as_required(['config'])
  cli.run(_run, argv)


if __name__ == '__main__':
  main()
