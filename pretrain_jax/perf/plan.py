"""A config's train and eval steps compiled by the TPU compiler for a Cloud TPU accelerator
type, on any machine, and what the compiled program needs per chip.

libtpu (the `tpu` extra, or the test requirements) holds the compiler; libtpu's topology
description gives the devices of a slice without its chips (jax.experimental.topologies), and
`jit(...).lower(...).compile()` on a mesh of them runs the real TPU compiler: the same
`training.step.make_steps` the trainer runs, with the config's mesh, attention path, remat,
microbatches and loss chunking. Per chip it reads:

  memory      compiled.memory_analysis(): the compiler's peak per chip, and arguments
              (parameters, optimizer state, the batch), outputs not aliased to the donated
              state, temporaries, generated code; the compiler refuses (RESOURCE_EXHAUSTED) a
              program that does not fit, which is `fits: False` with its message, not an error
  kernels     the Mosaic custom calls in the compiled program (`tpu_custom_call`): the
              attention kernels (splash) that lowered for the chip
  FLOPs       compiled.cost_analysis()'s `flops` and `bytes accessed` of one device's program,
              which count a loop's body once: where the program loops (a scanned layer stack,
              microbatches, a chunked loss) the bodies' further runs are added from the
              program's text (perf/hlo.py); `flops_source` says which count it is ('compiler',
              'compiler+loops', or 'analytic' where a loop's trip count is unreadable). A
              Mosaic kernel counts 0; `model_flops_per_chip` is the analytic count
  floor       max(FLOPs / datasheet peak, bytes accessed / datasheet HBM bandwidth): no step
              is faster (pretrain_jax/chips.py has the numbers)

perf/fit.py finds the largest batch that fits and the remat policy to use from a few plans.
"""
import contextlib
import copy
import importlib.util
import os
import tempfile
import time

import numpy as np

from pretrain_jax import chips as chips_lib
from pretrain_jax import ops
from pretrain_jax.models import cost
from pretrain_jax.models.layers import attention_path
from pretrain_jax.ops import backends
from pretrain_jax.perf import benchmark, hlo
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training.config import RunConfig

INSTALL = "pip install 'pretrain_jax[tpu]' (or libtpu==0.0.42.1, the TPU compiler)"
MOSAIC_CALL = 'custom_call_target="tpu_custom_call"'
BIASED_POSITIONS = ('relative', 'alibi')   # position embeddings that are a logit bias


def _require_libtpu() -> None:
  if importlib.util.find_spec('libtpu') is None:
    raise ValueError(f'the TPU compiler (libtpu) is not installed; expected {INSTALL}')


@contextlib.contextmanager
def _quiet_stderr(keep: bool = False):
  """File descriptor 2 into a scratch file: libtpu's C++ start-up warns about the TPU runtime
  it does not start here (no accelerator type, no worker hostnames)."""
  if keep:
    yield
    return
  saved = os.dup(2)
  with tempfile.TemporaryFile() as scratch:
    os.dup2(scratch.fileno(), 2)
    try:
      yield
    finally:
      os.dup2(saved, 2)
      os.close(saved)


def topology_devices(tpu_type: str, slices: int = 1, verbose: bool = False) -> list:
  """The devices of `slices` slices of accelerator type `tpu_type` (no chips needed)."""
  topo = chips_lib.topology(tpu_type)
  if not topo.chip.plans:
    planned = ', '.join(c.family for c in chips_lib.CHIPS if c.plans)
    raise ValueError(f'accelerator type {tpu_type!r}: plan compiles for {planned} (one JAX '
                     f'device per chip); expected one of those')
  if slices < 1:
    raise ValueError(f'slices={slices}; expected 1 or more')
  _require_libtpu()
  # Compiling starts no TPU runtime: several planning processes may share the machine, and a
  # TPU VM's own chips stay with its trainer.
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')
  from jax.experimental import topologies  # noqa: PLC0415  (loads libtpu)
  with _quiet_stderr(verbose):
    desc = topologies.get_topology_desc(
        platform='tpu', topology_name=topo.name, chip_config_name=topo.chip.chip_config,
        chips_per_host_bounds=topo.host_bounds, num_slices=slices)
  return list(desc.devices)


def batch_shapes(config, batch_size: int, sharding) -> dict:
  """ShapeDtypeStructs of one global batch of `batch_size` rows, as the data pipeline lays it
  out for `config` (benchmark.synthetic_batch's keys and dtypes)."""
  one = copy.deepcopy(config)
  one.train.batch_size = 1
  import jax  # noqa: PLC0415  (after topology_devices set libtpu's environment)
  return {k: jax.ShapeDtypeStruct((batch_size,) + v.shape[1:], v.dtype, sharding=sharding)
          for k, v in benchmark.synthetic_batch(one).items()}


def compiler_message(error: Exception) -> str:
  """The compiler's refusal in one line (its first lines, without the buffer listing)."""
  text = ' '.join(str(error).split('\n')[:3]).split('Largest program allocations')[0]
  return ' '.join(text.split())[:400]


def _compile(fn, *args):
  """(compiled or None, seconds, the compiler's message when memory ran out)."""
  start = time.perf_counter()
  try:
    compiled = fn.lower(*args).compile()
  except Exception as e:   # jax.errors.JaxRuntimeError; the type moved between releases
    if 'RESOURCE_EXHAUSTED' not in str(e):
      raise
    return None, time.perf_counter() - start, compiler_message(e)
  return compiled, time.perf_counter() - start, ''


def memory(compiled) -> dict:
  """Bytes per chip of a compiled program (memory_analysis is of one device's program).

  `hbm_bytes_per_chip` is the compiler's own peak (its heap simulation: what it checks against
  the chip's HBM); `buffer_bytes` adds up the buffer sizes (arguments + outputs not aliased +
  the temporaries' allocation + code), which near the limit exceeds the peak: the temporaries'
  allocation is larger than what is live at once.
  """
  m = compiled.memory_analysis()
  out = dict(argument_bytes=int(m.argument_size_in_bytes), output_bytes=int(m.output_size_in_bytes),
             alias_bytes=int(m.alias_size_in_bytes), temp_bytes=int(m.temp_size_in_bytes),
             code_bytes=int(m.generated_code_size_in_bytes))
  out['buffer_bytes'] = (out['argument_bytes'] + out['output_bytes'] - out['alias_bytes']
                         + out['temp_bytes'] + out['code_bytes'])
  peak = int(getattr(m, 'peak_memory_in_bytes', 0) or 0)
  out['hbm_bytes_per_chip'] = peak or out['buffer_bytes']
  return out


def bytes_per_row(planner: 'Planner', rows=(2, 4)) -> float:
  """The train step's peak per chip, per row: (peak at rows[1] - peak at rows[0]) / their
  difference (bytes grow linearly in rows past the first; docs/performance.md's slope)."""
  peaks = []
  for n in rows:
    compiled, _, message = planner.train(n)
    if compiled is None:
      raise ValueError(f'the train step at batch {n} does not compile: {message}')
    peaks.append(memory(compiled)['hbm_bytes_per_chip'])
  return (peaks[1] - peaks[0]) / (rows[1] - rows[0])


def costs(compiled, analytic_flops: float, text: str = '') -> dict:
  """FLOPs and bytes accessed of one chip's program per step.

  XLA's cost analysis counts each loop body once. Where the program loops, the bodies' further
  runs (hlo.count: each body's matmul FLOPs and bytes times its trip count, less once) are
  added to it: 'compiler+loops'. Where a loop's trip count cannot be read, the FLOPs are the
  analytic count ('analytic') and the bytes stay the compiler's (each body once).
  """
  analysis = compiled.cost_analysis()
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  flops = float(analysis.get('flops', 0.0))
  moved = float(analysis.get('bytes accessed', 0.0))
  out = {'compiler_flops_per_chip': flops, 'flops_source': 'compiler'}
  text = text or compiled.as_text()
  if ' while(' in text:
    counted = hlo.count(text)
    if counted.unknown_loops:
      flops, out['flops_source'] = analytic_flops, 'analytic'
    else:
      flops += counted.flops - counted.flops_once
      moved += counted.bytes - counted.bytes_once
      out['flops_source'] = 'compiler+loops'
  out.update(flops_per_chip=flops, bytes_accessed_per_chip=moved)
  return out


def mosaic_kernels(compiled, text: str = '') -> int:
  """The Mosaic (Pallas TPU) custom calls in the compiled program."""
  return (text or compiled.as_text()).count(MOSAIC_CALL)


class Planner:
  """One config on one topology: compiles its steps at any global batch size."""

  def __init__(self, config, tpu_type: str, slices: int = 1, verbose: bool = False,
               devices: list | None = None):
    self.config, self.topology = config, chips_lib.topology(tpu_type)
    self.slices, self.verbose = slices, verbose
    self.devices = devices or topology_devices(tpu_type, slices, verbose)
    self.compiles = 0   # train-step compiles made
    self.run = RunConfig.from_config(config)
    self.mesh = mesh_lib.make_mesh(self.run.mesh, self.devices)
    self.hosts = len({d.process_index for d in self.devices})
    mesh_lib.check_config(self.run.train, self.run.model, self.mesh, self.hosts)
    t, data = self.run.train, self.run.data
    self.max_predictions = step_lib.max_predictions(t, data)
    self.steps = step_lib.make_steps(self.run.model, t, self.mesh,
                                     max_predictions=self.max_predictions,
                                     init_length=data.seq_len)

  def with_remat(self, policy: str) -> 'Planner':
    """The same run with model.remat = `policy` (the same devices)."""
    config = copy.deepcopy(self.config)
    config.model.remat = policy
    return Planner(config, self.topology.tpu_type, self.slices, self.verbose, self.devices)

  @property
  def unit(self) -> int:
    """Global batches are multiples of this: data-parallel shards x microbatches."""
    shards = int(np.prod([self.mesh.shape[a] for a in mesh_lib.BATCH_AXES]))
    return shards * self.run.train.microbatches

  def check_batch(self, batch_size: int) -> None:
    t = self.run.train.replace(batch_size=batch_size)
    mesh_lib.check_config(t, self.run.model, self.mesh, self.hosts)

  def train(self, batch_size: int):
    """(compiled train step or None, seconds, the compiler's message if it ran out)."""
    self.check_batch(batch_size)
    shapes = batch_shapes(self.config, batch_size, self.steps.batch_sharding)
    self.compiles += 1
    return _compile(self.steps.train_step, self.steps.abstract_state, shapes)

  def eval(self, batch_size: int):
    shapes = batch_shapes(self.config, batch_size, self.steps.batch_sharding)
    return _compile(self.steps.eval_step, self.steps.abstract_state.params, shapes)

  def describe(self, batch_size: int) -> dict:
    """The numbers of a plan that do not need a compile."""
    chip, m = self.topology.chip, self.steps.model_config   # its dtype resolved for the chips
    one = batch_shapes(self.config, 1, None)
    rows = {k: np.broadcast_to(np.zeros((1,) + s.shape[1:], s.dtype),
                               (batch_size,) + s.shape[1:]) for k, s in one.items()}
    tokens, model_flops = cost.batch_cost(m, rows, self.max_predictions)
    chips = self.topology.chips * self.slices
    trained = m.replace(deterministic=False)
    # the paths in the ops form make_steps binds for the topology's chips
    with ops.using(backends.for_device(self.devices[0], self.run.train.fp8)):
      paths = {'attention_impl': attention_path(trained)}
      if m.position_embedding in BIASED_POSITIONS:   # T5's self-attentions, ALiBi
        paths['biased_attention_impl'] = attention_path(trained, bias=True)
    return {'topology': self.topology.tpu_type, 'topology_name': self.topology.name,
            'chips': chips, 'slices': self.slices, 'hosts': self.hosts,
            'mesh': {k: int(v) for k, v in self.mesh.shape.items()},
            'batch_size': batch_size, 'dtype': np.dtype(m.dtype).name, 'remat': m.remat,
            'tokens_per_step': int(tokens),
            'model_flops_per_chip': model_flops / chips, **paths,
            'hbm_capacity_bytes': chip.hbm_bytes, 'peak_flops_per_chip': chip.peak_flops,
            'hbm_bytes_per_s': chip.hbm_bytes_per_s}


def floor_s(flops: float, bytes_accessed: float, chip) -> float:
  """No step is faster than its FLOPs at peak or its bytes at full HBM bandwidth."""
  return max(flops / chip.peak_flops, bytes_accessed / chip.hbm_bytes_per_s)


def plan(planner: Planner, batch_size: int = 0, with_eval: bool = True) -> dict:
  """The plan of one global batch (default the config's): the train step's memory, kernels,
  FLOPs and floor, and whether it and the eval step fit."""
  batch_size = batch_size or planner.run.train.batch_size
  out = planner.describe(batch_size)
  compiled, seconds, message = planner.train(batch_size)
  out.update(fits=compiled is not None, compile_s=round(seconds, 1))
  if compiled is None:
    out['compiler_message'] = message
    return out
  text = compiled.as_text()
  out.update(**memory(compiled), **costs(compiled, out['model_flops_per_chip'], text),
             attention_kernels=mosaic_kernels(compiled, text))
  floor = floor_s(out['flops_per_chip'], out['bytes_accessed_per_chip'], planner.topology.chip)
  out.update(step_time_floor_s=floor, tokens_per_s_ceiling=out['tokens_per_step'] / floor
             if floor else None)
  if with_eval:
    add_eval(planner, batch_size, out)
  return out


def add_eval(planner: Planner, batch_size: int, out: dict) -> None:
  """The eval step's compile at `batch_size` into the plan `out`."""
  evaluated, seconds, message = planner.eval(batch_size)
  out.update(eval_fits=evaluated is not None, eval_compile_s=round(seconds, 1))
  if evaluated is None:
    out.update(fits=False, compiler_message=message)
  else:
    out['eval_hbm_bytes_per_chip'] = memory(evaluated)['hbm_bytes_per_chip']


def gib(n) -> str:
  return '-' if n is None else f'{n / chips_lib.GIB:.2f} GiB'


def summary(out: dict) -> list:
  """A few lines for a person (stderr)."""
  where = (f"{out['topology']} ({out['topology_name']}, {out['chips']} chips"
           f"{', ' + str(out['slices']) + ' slices' if out['slices'] > 1 else ''}), mesh "
           + ' x '.join(f'{k} {v}' for k, v in out['mesh'].items() if v > 1 or k != 'dcn'))
  lines = [where + f", computing in {out['dtype']}"]
  verdict = 'fits' if out['fits'] else 'does NOT fit'
  lines.append(f"batch {out['batch_size']}: {verdict}"
               + (f"; the compiler: {out['compiler_message']}" if out.get('compiler_message')
                  else ''))
  if 'max_batch_size' in out:
    why = ('refused by the compiler' if out['fit_checked'] else
           f"not tried: the search stops at {out['max_batch_size'] // out['batch_size']} times "
           'the configured batch' if out['fit_capped']
           else 'not compiled: over the HBM on the line through the compiles')
    lines.append(f"largest batch that fits: {out['max_batch_size']} (the next multiple, "
                 f"{out['next_batch_size']}: {why}); {out['fit_compiles']} train-step compiles, "
                 f"{out['fit_compile_s']:.0f} s")
  if 'remat_choice' in out:
    each = ', '.join(f'{name} ' + ('fits' if flops is None and name == out['remat_choice'] else
                                   'does not fit' if flops is None else f'{flops / 1e12:.3g} TFLOP')
                     for name, flops in out['remat_flops_per_chip'].items())
    choice = out['remat_choice'] or 'none of them'
    lines.append(f"remat at batch {out['batch_size']}: {each}; the cheapest that fits: {choice} "
                 f"(configured: {out['remat']}; {out['remat_compiles']} compiles; 'none' "
                 "recomputes nothing, so where it fits no other is compiled)")
  if 'hbm_bytes_per_chip' in out:
    lines.append(
        f"per chip at batch {out.get('planned_batch_size', out['batch_size'])}: "
        f"{gib(out['hbm_bytes_per_chip'])} at peak of {gib(out['hbm_capacity_bytes'])} (buffers: "
        f"arguments {gib(out['argument_bytes'])}, temporaries {gib(out['temp_bytes'])}, code "
        f"{gib(out['code_bytes'])}); eval step {gib(out.get('eval_hbm_bytes_per_chip'))}")
    biased = (f" ({out['biased_attention_impl']} where a position bias is added)"
              if 'biased_attention_impl' in out else '')
    lines.append(
        f"attention: {out['attention_impl']}{biased}, {out['attention_kernels']} Mosaic kernels; "
        f"{out['flops_per_chip'] / 1e12:.3f} TFLOP per chip per step ({out['flops_source']}; "
        f"analytic {out['model_flops_per_chip'] / 1e12:.3f}); floor "
        f"{out['step_time_floor_s'] * 1e3:.1f} ms/step, at most "
        f"{out['tokens_per_s_ceiling']:,.0f} tokens/s")
  lines.append(f"compile: {out['compile_s']:.1f} s (train)"
               + (f", {out['eval_compile_s']:.1f} s (eval)" if 'eval_compile_s' in out else ''))
  return lines
