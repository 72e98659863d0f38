"""Attention memory of the compiled train step: the dense path against the kernel path.

    python scripts/attention_memory.py                       # all models, 512 / 1024 / 2048
    python scripts/attention_memory.py --models gpt2_small --lengths 1024 --impls reference

For each config (bf16 compute, fp32 parameters and Adam state, attention dropout 0 so a kernel
may run; the rest of the config as published) and sequence length, it compiles the real train
step (training/step.py) on this machine's first device at batch 1 and batch 2 and reads XLA's
`memory_analysis()`: the step's peak is arguments + outputs - donated + temporaries, the
per-row cost is the batch-2 peak minus the batch-1 peak, and the fixed cost (parameters,
Adam state, gradients) what is left at batch 1. `--impls reference,splash` compiles both
attention paths; splash off TPU compiles Pallas's interpreter, whose kernel keeps across the
step what the TPU kernel keeps (q, k, v, output, log-sum-exp) and whose block temporaries are
transient. The largest batch that fits a chip of `--hbm_gib` is floor((HBM - fixed) / row).
One JSON line per (model, length, impl) on stdout.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import numpy as np

from configs import bert_base, gpt2_small, t5_base
from pretrain_jax.data.config import DataConfig
from pretrain_jax.models import ModelConfig, family_of
from pretrain_jax.objectives import span_corruption
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training.config import MeshConfig, TrainConfig

CONFIGS = {'gpt2_small': gpt2_small, 'bert_base': bert_base, 't5_base': t5_base}
GIB = 2 ** 30


def step_bytes(config, batch_size: int) -> dict:
  """XLA's memory analysis of the compiled train step of `config` at `batch_size` rows."""
  config.train.batch_size = batch_size
  cfg = ModelConfig.from_config(config.model)
  train, data = TrainConfig.from_config(config.train), DataConfig.from_config(config.data)
  mesh = mesh_lib.make_mesh(MeshConfig.from_config(config.mesh), jax.devices()[:1])
  steps = step_lib.make_steps(cfg, train, mesh,
                              max_predictions=step_lib.max_predictions(train, data))
  family, t = family_of(cfg), config.data.seq_len
  target_len = span_corruption.target_length(t)[1] if cfg.family == 't5' else None
  batch = family.example_batch(np.ones((batch_size, t + 1), np.int32), None, nsp=cfg.nsp,
                               target_len=target_len)
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), batch)
  mem = steps.train_step.lower(steps.abstract_state, shapes).compile().memory_analysis()
  peak = (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
          + mem.temp_size_in_bytes)
  return {'peak': int(peak), 'temp': int(mem.temp_size_in_bytes)}


def attention_tensor_bytes(cfg: ModelConfig, q_len: int, kv_len: int) -> int:
  """One (N, T, S) float32 tensor per row: the logits or probabilities of one layer."""
  return cfg.num_heads * q_len * kv_len * 4


def measure(name: str, length: int, impl: str, hbm_gib) -> dict:
  config = CONFIGS[name].get_config()
  config.model.update(dtype='bfloat16', param_dtype='float32', attention_impl=impl,
                      attention_dropout_rate=0.0, max_len=max(config.model.max_len, length))
  config.data.seq_len = length
  one, two = step_bytes(config, 1), step_bytes(config, 2)
  row = two['peak'] - one['peak']
  fixed = one['peak'] - row
  cfg = ModelConfig.from_config(config.model)
  out = {'model': name, 'seq_len': length, 'impl': impl, 'device': jax.default_backend(),
         'peak_batch1_gib': one['peak'] / GIB, 'row_gib': row / GIB, 'fixed_gib': fixed / GIB,
         'attention_tensor_mib_per_row_layer': attention_tensor_bytes(cfg, length, length) / 2**20}
  for hbm in hbm_gib:
    out[f'max_batch_{hbm:g}gib'] = max(math.floor((hbm * GIB - fixed) / row), 0)
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--models', default='gpt2_small,bert_base,t5_base')
  parser.add_argument('--lengths', default='512,1024,2048')
  parser.add_argument('--impls', default='reference,splash')
  parser.add_argument('--hbm_gib', default='16,32', help='chip memory sizes (v5e: 16, v4: 32)')
  args = parser.parse_args(argv)
  hbm = [float(x) for x in args.hbm_gib.split(',')]
  for name in args.models.split(','):
    for length in (int(x) for x in args.lengths.split(',')):
      for impl in args.impls.split(','):
        print(json.dumps(measure(name, length, impl, hbm)), flush=True)


if __name__ == '__main__':
  main()
