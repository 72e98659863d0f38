"""Attention memory of the compiled train step: the dense path against the kernel path.

    python scripts/attention_memory.py                       # all models, 512 / 1024 / 2048
    python scripts/attention_memory.py --models gpt2_small --lengths 1024 --impls reference
    JAX_PLATFORMS=cpu python scripts/attention_memory.py --topology v5e:2x4 --impls auto

For each config (bf16 compute unless `--dtype`, fp32 parameters and Adam state, attention
dropout 0 so a kernel may run; the rest of the config as published) and sequence length, it
compiles the real train step (training/step.py) on this machine's first device at batch 1 and
batch 2 (`--rows`) and reads XLA's `memory_analysis()`: the step's peak is arguments + outputs
- donated + temporaries, the per-row cost is the slope of the peak between the two batches,
and the fixed cost (parameters, Adam state, gradients) what is left at the first.
`--impls reference,splash` compiles both attention paths; splash off TPU compiles Pallas's
interpreter, whose kernel keeps across the step what the TPU kernel keeps (q, k, v, output,
log-sum-exp) and whose block temporaries are transient. The largest batch that fits a chip of
`--hbm_gib` is floor((HBM - fixed) / row).
One JSON line per (model, length, impl) on stdout.

`--topology` (needs libtpu) compiles for a TPU slice instead, ahead of time, with the TPU
compiler (`jax.experimental.topologies`; no TPU attached): the mesh's data axis spans its chips,
`--rows` rows per chip, and the numbers are per chip. At small batches the step's peak can be
the optimizer update's rather than the activations' (GPT-2 small at 512 tokens), so a row is
measured where the activations set it. It also counts the step's Mosaic
kernel calls (`tpu_custom_call`s: the attentions that run as a Pallas kernel).
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import numpy as np

from configs import bert_base, gpt2_small, t5_base, t5_small
from pretrain_jax.data.config import DataConfig
from pretrain_jax.models import ModelConfig, family_of
from pretrain_jax.objectives import span_corruption
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training.config import MeshConfig, TrainConfig

CONFIGS = {'gpt2_small': gpt2_small, 'bert_base': bert_base, 't5_base': t5_base,
           't5_small': t5_small}
GIB = 2 ** 30


def topology_devices(topology: str) -> list:
  """The devices of a TPU slice named like 'v5e:2x4' (TPU compiler only), or this machine's
  first device for ''."""
  if not topology:
    return jax.devices()[:1]
  from jax.experimental import topologies  # noqa: PLC0415 (needs libtpu: --topology only)
  return topologies.get_topology_desc(platform='tpu', topology_name=topology,
                                      chip_config_name='default',
                                      chips_per_host_bounds=(2, 2, 1), num_slices=1).devices


def step_bytes(config, batch_size: int, devices=None) -> dict:
  """XLA's memory analysis (per device) of the compiled train step of `config` at
  `batch_size` rows over `devices` (default: this machine's first), and its Mosaic calls."""
  config.train.batch_size = batch_size
  cfg = ModelConfig.from_config(config.model)
  train, data = TrainConfig.from_config(config.train), DataConfig.from_config(config.data)
  mesh = mesh_lib.make_mesh(MeshConfig.from_config(config.mesh), devices or jax.devices()[:1])
  steps = step_lib.make_steps(cfg, train, mesh,
                              max_predictions=step_lib.max_predictions(train, data))
  family, t = family_of(cfg), config.data.seq_len
  target_len = span_corruption.target_length(t)[1] if cfg.family == 't5' else None
  batch = family.example_batch(np.ones((batch_size, t + 1), np.int32), None, nsp=cfg.nsp,
                               target_len=target_len)
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), batch)
  compiled = steps.train_step.lower(steps.abstract_state, shapes).compile()
  mem = compiled.memory_analysis()
  peak = (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
          + mem.temp_size_in_bytes)
  return {'peak': int(peak), 'temp': int(mem.temp_size_in_bytes),
          'mosaic_calls': compiled.as_text().count('custom_call_target="tpu_custom_call"')}


def attention_tensor_bytes(cfg: ModelConfig, q_len: int, kv_len: int) -> int:
  """One (N, T, S) float32 tensor per row: the logits or probabilities of one layer."""
  return cfg.num_heads * q_len * kv_len * 4


def measure(name: str, length: int, impl: str, hbm_gib, topology: str = '',
            dtype: str = 'bfloat16', rows=(1, 2), scan_layers: bool = False) -> dict:
  config = CONFIGS[name].get_config()
  config.model.update(dtype=dtype, param_dtype='float32', attention_impl=impl,
                      scan_layers=scan_layers,
                      attention_dropout_rate=0.0, max_len=max(config.model.max_len, length))
  config.data.seq_len = length
  devices = topology_devices(topology)
  one, two = (step_bytes(config, r * len(devices), devices) for r in rows)
  row = (two['peak'] - one['peak']) / (rows[1] - rows[0])
  fixed = one['peak'] - rows[0] * row
  cfg = ModelConfig.from_config(config.model)
  out = {'model': name, 'seq_len': length, 'impl': impl, 'dtype': dtype,
         'scan_layers': scan_layers,
         'device': devices[0].device_kind if topology else jax.default_backend(),
         'topology': topology or None, 'mosaic_calls': one['mosaic_calls'],
         'rows': list(rows), 'peak_first_gib': one['peak'] / GIB, 'row_gib': row / GIB,
         'fixed_gib': fixed / GIB,
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
  parser.add_argument('--dtype', default='bfloat16', help='compute dtype')
  parser.add_argument('--scan_layers', action='store_true',
                      help='one nn.scan over the layers (compiles in a fraction of the time and '
                      'host memory)')
  parser.add_argument('--rows', default='1,2',
                      help='the two batch sizes (rows per device) whose peaks give a row')
  parser.add_argument('--topology', default='',
                      help="compile for this TPU slice ('v5e:2x4'; needs libtpu), per chip")
  args = parser.parse_args(argv)
  hbm = [float(x) for x in args.hbm_gib.split(',')]
  for name in args.models.split(','):
    for length in (int(x) for x in args.lengths.split(',')):
      for impl in args.impls.split(','):
        rows = tuple(int(x) for x in args.rows.split(','))
        print(json.dumps(measure(name, length, impl, hbm, args.topology, args.dtype, rows,
                                 args.scan_layers)), flush=True)


if __name__ == '__main__':
  main()
