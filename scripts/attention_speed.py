"""The train step's time on each attention path, interleaved in one process.

    python scripts/attention_speed.py --config bench_gpt [--impls reference,xla] [--rounds 8]

Compiles the real train step (training/step.py) of a config once per `--impls` path (attention
dropout 0, so every path may run; the rest of the config as it is) and times the paths in
turn, one step each per round, on the same device-resident synthetic batch, so a machine whose
speed drifts slows every path alike. Prints one JSON line: each path's median step time and
its ratio to the first path's, per round and overall. It is how `attention.CPU_AUTO` was
chosen (docs/performance.md, "Attention paths").
"""
import argparse
import importlib
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax

from pretrain_jax.data.config import DataConfig
from pretrain_jax.models import ModelConfig
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training.config import MeshConfig, TrainConfig
from pretrain_jax.training.synthetic import SyntheticDataset


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--config', default='bench_gpt', help='a name in configs/')
  parser.add_argument('--impls', default='reference,xla')
  parser.add_argument('--rounds', type=int, default=8)
  args = parser.parse_args(argv)
  config = importlib.import_module(f'configs.{args.config}').get_config()
  config.model.attention_dropout_rate = 0.0
  t, data = TrainConfig.from_config(config.train), DataConfig.from_config(config.data)
  mesh = mesh_lib.make_mesh(MeshConfig.from_config(config.mesh), jax.devices()[:1])
  steps, states = {}, {}
  for impl in args.impls.split(','):
    config.model.attention_impl = impl
    cfg = ModelConfig.from_config(config.model)
    made = step_lib.make_steps(cfg, t, mesh,
                               max_predictions=step_lib.max_predictions(t, data))
    steps[impl], states[impl] = made.train_step, made.create_state(0)
  data = SyntheticDataset(config.model.family, vocab_size=config.model.vocab_size,
                          seq_len=config.data.seq_len, batch_size=config.train.batch_size,
                          nsp=bool(config.model.get('nsp', False)), zipf=1.1)
  batch = jax.device_put(next(data))
  for impl in steps:                                  # compile and warm up
    for _ in range(2):
      states[impl], metrics = steps[impl](states[impl], batch)
    jax.block_until_ready(metrics)
  times = {impl: [] for impl in steps}
  for _ in range(args.rounds):
    for impl in steps:
      start = time.perf_counter()
      states[impl], metrics = steps[impl](states[impl], batch)
      jax.block_until_ready(metrics)
      times[impl].append(time.perf_counter() - start)
  first = next(iter(steps))
  print(json.dumps({
      'config': args.config, 'device': jax.devices()[0].device_kind, 'rounds': args.rounds,
      'step_s': {k: statistics.median(v) for k, v in times.items()},
      'ratio_to_' + first: {
          k: statistics.median(a / b for a, b in zip(v, times[first], strict=True))
          for k, v in times.items()}}))


if __name__ == '__main__':
  main()
