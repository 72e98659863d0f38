"""Bytes per row the TPU compiler gives a config's train step, split into what each layer
keeps per row and what the embeddings and the loss keep per row (docs/performance.md).

    JAX_PLATFORMS=cpu python scripts/activation_bytes.py --config gpt2_small [--set k=v ...]

It compiles the train step (plan.Planner: the trainer's make_steps) on one v5e chip
(v5litepod-1: no parallelism, so nothing per row is a collective's buffer) at ROWS rows and
LAYERS layers, with the config's widths and sequence length. From the compiler's peaks:
  per_layer   (peak(L2, R2) - peak(L1, R2) - peak(L2, R1) + peak(L1, R1)) / (dL * dR)
  outside     (peak(L1, R2) - peak(L1, R1)) / dR - L1 * per_layer: embeddings, final norm,
              head and loss, per row
and both against Korthikanti et al.'s 34 h T bytes per layer per row (16-bit activations,
1-byte dropout masks, no (T, T) tensor). Prints one JSON line.
"""
import argparse
import ast
import importlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pretrain_jax.perf import plan  # noqa: E402

GIB = 2 ** 30


def compile_peak(config, layers: int, rows: int, topology: str):
  config = config.copy_and_resolve_references()
  config.model.num_layers = layers
  if 'num_decoder_layers' in config.model:
    config.model.num_decoder_layers = layers
  config.train.batch_size = rows
  config.train.microbatches = 1
  for axis in ('data', 'fsdp', 'tensor'):
    if axis in config.mesh:
      config.mesh[axis] = 1 if axis != 'data' else -1
  planner = plan.Planner(config, topology)
  compiled, _, message = planner.train(rows)
  if compiled is None:
    raise SystemExit(f'error: {layers} layers x {rows} rows does not compile: {message}')
  return plan.memory(compiled)['hbm_bytes_per_chip']


def apply(config, item: str) -> None:
  """`section.key=value` into config (value a Python literal, else a string)."""
  key, _, text = item.partition('=')
  *path, last = key.split('.')
  node = config
  for part in path:
    node = node[part]
  try:
    node[last] = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    node[last] = text


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--config', required=True)
  p.add_argument('--set', action='append', default=[], metavar='KEY=VALUE')
  p.add_argument('--layers', default='1,2')
  p.add_argument('--rows', default='1,2')
  p.add_argument('--topology', default='v5litepod-1')
  args = p.parse_args(argv)
  config = importlib.import_module(f'configs.{args.config}').get_config()
  for item in args.set:
    apply(config, item)
  l1, l2 = (int(x) for x in args.layers.split(','))
  r1, r2 = (int(x) for x in args.rows.split(','))
  peaks = {(n, r): compile_peak(config, n, r, args.topology)
           for n in sorted({l1, l2}) for r in (r1, r2)}
  # --layers N,N: the layers' share is not measured (taken as 0): `outside` is then all of it
  per_layer = ((peaks[l2, r2] - peaks[l1, r2] - peaks[l2, r1] + peaks[l1, r1])
               / ((l2 - l1) * (r2 - r1))) if l2 != l1 else 0.0
  per_row_l1 = (peaks[l1, r2] - peaks[l1, r1]) / (r2 - r1)
  outside = per_row_l1 - l1 * per_layer
  m = config.model
  seq = config.data.seq_len
  bound = 34 * m.emb_dim * seq
  full = m.num_layers * per_layer + outside
  out = {'config': args.config, 'set': args.set, 'topology': args.topology, 'seq_len': seq,
         'published_layers': m.num_layers,
         'peaks': {f'L{n}_R{r}': v for (n, r), v in peaks.items()},
         'per_layer_bytes': per_layer, 'per_layer_over_bound': per_layer / bound,
         'bytes_per_h_token_layer': per_layer / (m.emb_dim * seq),
         'outside_bytes': outside, 'outside_gib': outside / GIB,
         'published_gib_per_row': full / GIB,
         'bound_gib_per_row': m.num_layers * bound / GIB}
  print(f"{args.config} {' '.join(args.set)}: {per_layer / 2**20:.1f} MiB per layer per row "
        f"({per_layer / (m.emb_dim * seq):.1f} h bytes per token, bound 34), outside the "
        f"layers {outside / 2**20:.1f} MiB per row; at {m.num_layers} layers "
        f"{full / GIB:.3f} GiB per row (bound {m.num_layers * bound / GIB:.3f})", file=sys.stderr)
  print(json.dumps(out))
  return 0


if __name__ == '__main__':
  sys.exit(main())
