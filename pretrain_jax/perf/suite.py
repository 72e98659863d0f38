"""A benchmark suite: several configs' train steps timed in one process, each under named
variants, as one compact JSON record per (model, variant) and a short table.

A variant is a technique measured against the suite's own settings (`baseline`): config
overrides and the batch feed change per step build, so they run in the same process as the
baseline, right after it for each model (interleaved, so the ratio `vs_baseline` compares
steps timed minutes apart); XLA flags are read once, when JAX starts its backend, so each set
of them needs a process of its own (pretrain_jax/commands/benchmark.py starts them).
"""
import copy
import dataclasses
import math
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import ml_collections
from etils import epath

from pretrain_jax.perf import benchmark


@dataclasses.dataclass(frozen=True)
class Variant:
  """One technique to measure: what it is, and what it changes."""
  about: str
  xla_flags: str = ''               # flags of its own process (merged over the suite's)
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)   # 'section.key':
                                    # a value, or a function of the config (a size that
                                    # follows its shapes)
  feed: str = 'device'              # benchmark.FEEDS


VARIANTS = types.MappingProxyType({
    'baseline': Variant('the config as written: its batch, attention path and XLA flags'),
    'latency_hiding': Variant("XLA's latency-hiding scheduler on",
                              xla_flags='--xla_gpu_enable_latency_hiding_scheduler=true'),
    'no_latency_hiding': Variant("XLA's latency-hiding scheduler off",
                                 xla_flags='--xla_gpu_enable_latency_hiding_scheduler=false'),
    'no_command_buffers': Variant('command buffers (CUDA graphs) off',
                                  xla_flags='--xla_gpu_enable_command_buffer='),
    'triton_gemm': Variant("XLA's Triton GEMMs on (the GPU configs use cuBLAS for every GEMM)",
                           xla_flags='--xla_gpu_enable_triton_gemm=true'),
    'xla_attention': Variant("jax.nn.dot_product_attention's XLA path instead of cuDNN's",
                             overrides={'model.attention_impl': 'xla'}),
    'chunked_ce': Variant('autodiff LM head + cross-entropy a quarter of the positions at a '
                          'time, recomputed backward (the (B, T, V) logits never kept)',
                          overrides={'train.fused_loss': False, 'train.loss_chunk_len':
                                     lambda c: max(c.data.seq_len // 4, 1)}),
    'autodiff_loss': Variant('the LM head + cross-entropy by autodiff, whole (train.fused_loss='
                             'False: the (B, T, V) float32 logits kept for the backward pass)',
                             overrides={'train.fused_loss': False}),
    'remat': Variant('per-block rematerialisation (minimal policy)',
                     overrides={'model.remat': 'minimal'}),
    'fp8': Variant('dense layers in fp8 (train.fp8: e4m3, gradients e5m2; GPUs of compute '
                   'capability >= 8.9)', overrides={'train.fp8': True}),
    'host_feed': Variant('the batch copied from the host inside every step (no prefetch)',
                         feed='host'),
    'prefetch': Variant("the next step's batch copied while this one runs", feed='prefetch'),
})


def variant(name: str) -> Variant:
  if name not in VARIANTS:
    raise ValueError(f'--variants names {name!r}; expected names from {", ".join(VARIANTS)}')
  return VARIANTS[name]


def merge_xla_flags(*layers: str) -> str:
  """XLA_FLAGS strings merged flag by flag; a later layer's value of a flag wins."""
  merged = {}
  for layer in layers:
    for flag in (layer or '').split():
      merged[flag.split('=', 1)[0]] = flag
  return ' '.join(merged.values())


def with_variant(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  """A copy of `config` with the variant's overrides applied."""
  out = copy.deepcopy(config)
  for key, value in variant(name).overrides.items():
    section, field = key.split('.')
    out[section][field] = value(out) if callable(value) else value
  return out


def run(entries: Iterable[tuple], variants: Iterable[str], *, steps: int | None = None,
        warmup: int | None = None, peak_flops: float | None = None,
        xla_flags: str = '', on_error: Callable = None, profile_dir: str | None = None):
  """Yield one record per (model, variant): each entry (name, config) is timed under each
  in-process variant in turn (benchmark.benchmark_train_step). A failure (out of memory, a
  path the backend lacks) is a record with `error` (its one line, from `on_error(exc)` or
  str) and the suite goes on. `xla_flags` is what this process started with (recorded).
  `profile_dir`: each record's steps are also traced, into profile_dir/<model>-<variant>."""
  variants = list(variants)
  for name, config in entries:
    for v in variants:
      record = {'model': name, 'variant': v}
      try:
        cfg = with_variant(config, v)
        bench = benchmark.benchmark_section(cfg)
        record.update(benchmark.benchmark_train_step(
            cfg, steps=steps or bench.steps, warmup=bench.warmup if warmup is None else warmup,
            peak_flops=peak_flops, feed=variant(v).feed, probe_size=bench.probe_size,
            profile_dir=profile_dir and str(epath.Path(profile_dir) / f'{name}-{v}')))
      except Exception as e:  # one model's failure, not all
        record['error'] = on_error(e) if on_error else f'{type(e).__name__}: {e}'
      record['xla_flags'] = xla_flags
      yield record


RECORD_KEYS = ('model', 'variant', 'family', 'params', 'batch_size', 'seq_len', 'target_len',
               'tokens_per_s', 'step_ms', 'step_ms_min', 'mfu', 'mfu_datasheet', 'peak_flops',
               'datasheet_peak_flops', 'model_flops_per_step', 'peak_bytes_in_use',
               'step_bytes', 'compile_s', 'loss', 'steps', 'feed', 'dtype', 'attention_impl',
               'remat', 'loss_chunk_len', 'fused_loss', 'device', 'num_devices', 'xla_flags',
               'vs_baseline', 'profile', 'error')


def _round(value):
  if isinstance(value, float) and math.isfinite(value) and value:
    return float(f'{value:.4g}')
  return value


def compact(record: Mapping) -> dict:
  """The suite's line: RECORD_KEYS in order (those present), floats to 4 digits, step times
  in ms."""
  full = dict(record)
  for key in ('step_s', 'step_s_min'):
    if key in full:
      full[key.replace('_s', '_ms')] = full.pop(key) * 1e3
  return {k: _round(full[k]) for k in RECORD_KEYS if k in full}


def add_ratios(records: list) -> list:
  """Each record's `vs_baseline`: its tokens/s over its model's baseline's (when both ran)."""
  base = {r['model']: r['tokens_per_s'] for r in records
          if r.get('variant') == 'baseline' and r.get('tokens_per_s')}
  for r in records:
    if r.get('tokens_per_s') and r['model'] in base:
      r['vs_baseline'] = _round(r['tokens_per_s'] / base[r['model']])
  return records


def table(records: Iterable[Mapping]) -> str:
  """The records as a short fixed-width table (one row each)."""
  rows = [('model', 'variant', 'tokens/s', 'step ms', 'MFU', 'MFU(sheet)', 'step GiB',
           'compile s', 'vs base')]
  def fmt(value, spec):
    return '-' if value is None else format(value, spec)
  for r in records:
    if 'error' in r:
      rows.append((r['model'], r['variant'], 'error: ' + r['error'][:60], '', '', '', '', '',
                   ''))
      continue
    mem = r.get('step_bytes')
    rows.append((r['model'], r['variant'], fmt(r.get('tokens_per_s'), ',.0f'),
                 fmt(r.get('step_ms'), '.1f'), fmt(r.get('mfu'), '.3f'),
                 fmt(r.get('mfu_datasheet'), '.3f'), fmt(mem and mem / 2 ** 30, '.2f'),
                 fmt(r.get('compile_s'), '.1f'), fmt(r.get('vs_baseline'), '.3f')))
  widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
  return '\n'.join('  '.join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                   for row in rows)
