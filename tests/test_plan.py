"""pretrain-jax plan: the TPU compiler (libtpu) compiling the real train step for Cloud TPU
topologies on this CPU machine, the chip table and the batch search.

The compiles are tiny configs (seconds each), made once per module (`plans`); the published
sizes are in docs/performance.md. The test requirements pin libtpu, so the compiler is here.
"""
import json
import math
import re
import subprocess
import sys
import types

import commands
import jax
import pytest
from helpers import ROOT

import configs.tiny_bert
import configs.tiny_gpt
import configs.tiny_prefix_lm
import configs.tiny_t5
from pretrain_jax import chips
from pretrain_jax.perf import fit as fit_lib
from pretrain_jax.perf import plan

TINY = dict(num_layers=1, attention_impl='splash')


def tiny(module, **changes):
  """A tiny config, one layer (T5: one per stack), splash attention; its dtype the published
  'auto' (bf16 on a TPU)."""
  config = module.get_config()
  config.model.update(TINY, **({'num_decoder_layers': 1} if 'num_decoder_layers' in
                               config.model else {}))
  for section, values in changes.items():
    config[section].update(values)
  return config


# -- the chip table ------------------------------------------------------------------------


def test_accelerator_types_map_to_topologies():
  expected = {   # type: (libtpu topology, chips, chips per host along each axis, hosts)
      'v4-8': ('v4:2x2x1', 4, (2, 2, 1), 1), 'v4-32': ('v4:2x2x4', 16, (2, 2, 1), 4),
      'v4-128': ('v4:4x4x4', 64, (2, 2, 1), 16), 'v5litepod-1': ('v5e:1x1', 1, (1, 1, 1), 1),
      'v5e-8': ('v5e:2x4', 8, (2, 4, 1), 1), 'v5litepod-16': ('v5e:4x4', 16, (2, 2, 1), 4),
      'v5litepod-128': ('v5e:8x16', 128, (2, 2, 1), 32), 'v5p-8': ('v5:2x2x1', 4, (2, 2, 1), 1),
      'v5p-12288': ('v5:16x16x24', 6144, (2, 2, 1), 1536),
      'v6e-8': ('v6e:2x4', 8, (2, 4, 1), 1), 'v6e-256': ('v6e:16x16', 256, (2, 2, 1), 64)}
  for tpu_type, (name, count, bounds, hosts) in expected.items():
    topo = chips.topology(tpu_type)
    assert (topo.name, topo.chips, topo.host_bounds, topo.hosts) == (name, count, bounds, hosts)
  assert chips.canonical_type('v5e-16') == 'v5litepod-16'
  for bad in ('v5e-2', 'v7-8', 'v4-12', 'tpu', ''):
    with pytest.raises(ValueError, match=f"unknown accelerator type '{bad}'"):
      chips.topology(bad)


def test_peaks_per_device_come_from_the_chip_table():
  # v2 / v3: a JAX device is one of a chip's two TensorCores; v4 on: one megacore chip.
  assert chips.peak_flops_per_device('TPU v3') == 123e12 / 2
  assert chips.peak_flops_per_device('TPU v4') == 275e12
  assert chips.peak_flops_per_device('TPU v5') == 459e12          # v5p's device kind
  assert chips.peak_flops_per_device('TPU v5 lite') == 197e12
  assert chips.peak_flops_per_device('NVIDIA H100 80GB HBM3') == 989e12
  assert chips.peak_flops_per_device('cpu') is None


@pytest.mark.parametrize('tpu_type', ['v4-16', 'v5litepod-8', 'v5p-16', 'v6e-4'])
def test_libtpu_describes_each_family_s_topology(tpu_type):
  devices = plan.topology_devices(tpu_type)
  topo = chips.topology(tpu_type)
  assert len(devices) == topo.chips
  assert len({d.process_index for d in devices}) == topo.hosts
  assert chips.chip_of_device_kind(devices[0].device_kind) is topo.chip


# -- the batch search ---------------------------------------------------------------------


def linear_probe(unit, fixed, per_row, capacity, jump=0):
  """A compiler whose peak is fixed + per_row x units (+ `jump` from 2 units on), refusing
  above `capacity`, and the batches it was asked for."""
  asked = []

  def probe(batch):
    asked.append(batch)
    n = batch // unit
    peak = fixed + per_row * n + (jump if n >= 2 else 0)
    return peak if peak <= capacity else None
  return probe, asked


@pytest.mark.parametrize('fixed, per_row, jump, start', [
    (1000, 1000, 0, 1), (5000, 300, 2000, 1), (2000, 3000, 0, 4), (200, 10, 500, 2),
    (200, 1, 500, 7), (3000, 1000, 9000, 12), (15000, 1000, 0, 1), (15000, 1001, 0, 2)])
def test_a_linear_peak_finds_the_largest_batch_in_four_compiles(fixed, per_row, jump, start):
  """A peak linear in the units from 2 on (with a jump from 1 to 2) and a configured batch that
  fits or not: the largest batch that fits, in at most 4 compiles; where the configured batch
  fits, the last compile checks one unit more (refused). Bytes are whole numbers, as the
  compiler's are."""
  unit, capacity = 8, 16_000
  probe, asked = linear_probe(unit, fixed, per_row, capacity, jump)
  best, seen = fit_lib.largest_batch(probe, unit, capacity, start=start)
  limit = max((n for n in range(1, 100_000) if fixed + per_row * n + (jump if n >= 2 else 0)
               <= capacity), default=0)
  assert best == limit * unit and (limit == 0 or seen[limit] is not None)
  assert len(asked) == len(seen) <= fit_lib.FIT_COMPILES
  assert seen.get(limit + 1, 0) is None or limit < start


def test_a_refused_configured_batch_of_one_unit_ends_the_search():
  """The launcher's preflight: the configured batch (1 unit) was compiled and refused, so no
  batch fits and no more is compiled (the bytes only grow with the rows)."""
  probe, asked = linear_probe(8, 15000, 1001, 16000)
  best, seen = fit_lib.largest_batch(probe, 8, 16000, start=1, known={1: None})
  assert best == 0 and seen == {1: None} and asked == []


@pytest.mark.parametrize('start', [1, 2, 5])
def test_the_search_stops_at_its_cap_in_two_compiles(start):
  """A model far smaller than the HBM: the second point is the cap, which fits: 2 compiles."""
  unit, cap = 8, fit_lib.FIT_CAP * start
  probe, asked = linear_probe(unit, 100, 1, 16000)
  best, seen = fit_lib.largest_batch(probe, unit, 16000, start=start, cap=cap)
  assert best == cap * unit and len(asked) == 2 and seen[cap] is not None


@pytest.mark.parametrize('curve', [0.8, 1.3])
def test_a_curved_peak_answers_a_batch_that_fits_in_four_compiles(curve):
  """Off the line (the bytes grow slower or faster than the rows) the answer is a batch the
  compiler accepted, the budget holds, and the exactness flag says whether one more was
  refused."""
  unit, capacity = 4, 40.0

  def probe(batch):
    peak = 1.0 + (batch // unit) ** curve
    return peak if peak <= capacity else None
  best, seen = fit_lib.largest_batch(probe, unit, capacity, start=3)
  assert best and probe(best) is not None and len(seen) <= fit_lib.FIT_COMPILES
  limit = max(n for n in range(1, 1000) if probe(n * unit) is not None)
  assert best // unit <= limit
  assert (seen.get(best // unit + 1, 0) is None) == (best // unit == limit and
                                                      (limit + 1) in seen)


# -- the TPU compiler ----------------------------------------------------------------------


def _plan(config, tpu_type, slices=1, with_eval=False):
  planner = plan.Planner(config, tpu_type, slices)
  return planner, plan.plan(planner, with_eval=with_eval)


@pytest.fixture(scope='module')
def plans():
  """Each case compiled once: (planner, plan)."""
  mesh3 = {'data': 2, 'fsdp': 2, 'tensor': 2}
  return {
      'gpt_v5e_3d': _plan(tiny(configs.tiny_gpt, mesh=mesh3), 'v5litepod-8', with_eval=True),
      'bert_v4': _plan(tiny(configs.tiny_bert, model={'position_embedding': 'learned'}), 'v4-8'),
      'prefix_lm_v4': _plan(tiny(configs.tiny_prefix_lm), 'v4-8'),
      't5_v5e': _plan(tiny(configs.tiny_t5), 'v5litepod-4'),
  }


@pytest.mark.parametrize('case, kernels_per_layer', [
    ('gpt_v5e_3d', 3),      # causal with packed segment ids: forward, dq, dkv
    ('bert_v4', 3),         # full with padding (segment id 0)
    ('prefix_lm_v4', 6),    # two calls: causal, and full over the prefixes
    ('t5_v5e', 9),          # cross-attention on splash, both self-attentions on flash (bias)
])
def test_splash_lowers_through_mosaic_for_each_mask(plans, case, kernels_per_layer):
  planner, out = plans[case]
  assert out['fits'] and out['attention_impl'] == 'splash' and out['dtype'] == 'bfloat16'
  # one layer; Pallas's interpreter (the CPU's splash) would lower to no Mosaic call at all
  assert out['attention_kernels'] == kernels_per_layer
  assert planner.devices[0].platform == 'tpu'
  assert out['buffer_bytes'] == (out['argument_bytes'] + out['output_bytes'] - out['alias_bytes']
                                 + out['temp_bytes'] + out['code_bytes'])
  assert out['argument_bytes'] < out['hbm_bytes_per_chip'] < out['hbm_capacity_bytes']
  chip = chips.topology(out['topology']).chip
  assert out['step_time_floor_s'] == max(out['flops_per_chip'] / chip.peak_flops,
                                         out['bytes_accessed_per_chip'] / chip.hbm_bytes_per_s)
  # The compiler's FLOPs (Mosaic kernels count none) against the analytic matmul count.
  assert 0.5 < out['flops_per_chip'] / out['model_flops_per_chip'] < 2


STACK = dict(num_layers=4)


@pytest.fixture(scope='module')
def scanned():
  """A 4-layer tiny GPT on one v5e chip, its layers scanned, in 2 microbatches, with the loss
  in chunks of 64 positions: three loops, two of them nested."""
  return _plan(tiny(configs.tiny_gpt, model=dict(STACK, scan_layers=True),
                    train=dict(microbatches=2, loss_chunk_len=64)), 'v5litepod-1')[1]


def test_a_scanned_stack_counts_every_layer_s_flops(scanned):
  """XLA's cost analysis counts a loop body once (here 1 layer of 4 in 1 microbatch of 2): the
  plan adds the bodies' further runs, so its FLOPs match the analytic count, and the floor
  follows from them."""
  analytic = scanned['model_flops_per_chip']
  assert scanned['flops_source'] == 'compiler+loops'
  assert scanned['compiler_flops_per_chip'] < 0.4 * analytic
  assert abs(scanned['flops_per_chip'] / analytic - 1) < 0.1
  chip = chips.topology('v5litepod-1').chip
  assert scanned['step_time_floor_s'] == max(
      scanned['flops_per_chip'] / chip.peak_flops,
      scanned['bytes_accessed_per_chip'] / chip.hbm_bytes_per_s)


@pytest.mark.slow
def test_a_scanned_stack_counts_the_flops_of_the_same_stack_unrolled(scanned):
  """The same model with its layers unrolled, in one batch, the loss whole: no loop, so the
  compiler's own count, which the scanned program's matches within 10%."""
  _, unrolled = _plan(tiny(configs.tiny_gpt, model=STACK), 'v5litepod-1')
  assert unrolled['flops_source'] == 'compiler'
  assert unrolled['model_flops_per_chip'] == scanned['model_flops_per_chip']
  assert abs(scanned['flops_per_chip'] / unrolled['flops_per_chip'] - 1) < 0.1


def test_a_data_fsdp_tensor_mesh_compiles_sharded(plans):
  planner, out = plans['gpt_v5e_3d']
  assert out['mesh'] == {'dcn': 1, 'data': 2, 'fsdp': 2, 'tensor': 2}
  assert out['eval_fits'] and 0 < out['eval_hbm_bytes_per_chip'] < out['hbm_bytes_per_chip']
  wte = planner.steps.abstract_state.params['wte']['embedding']
  assert wte.sharding.shard_shape(wte.shape) == (wte.shape[0] // 2, wte.shape[1] // 2)
  # 8 chips hold one copy of the state between them 4 ways (fsdp x tensor), twice (data):
  # each chip's arguments are about a quarter of the state, not all of it.
  state = sum(math.prod(x.shape) * x.dtype.itemsize
              for x in jax.tree.leaves(planner.steps.abstract_state))
  assert out['argument_bytes'] < state / 2


def test_an_explicit_dtype_overrides_auto_on_a_tpu(plans):
  """The plans above are of model.dtype='auto': bf16 on a TPU, said in the summary. An
  explicit float32 stays float32 there (the planner's steps, before any compile)."""
  assert 'computing in bfloat16' in plan.summary(plans['t5_v5e'][1])[0]
  planner = plan.Planner(tiny(configs.tiny_gpt, model={'dtype': 'float32'}), 'v5litepod-1')
  assert planner.steps.model_config.dtype == jax.numpy.float32
  assert planner.describe(8)['dtype'] == 'float32'


def megascale_transfers(hlo: str) -> list:
  """(kind, elements) of each transfer between slices in a compiled TPU program: XLA sends
  them to the megascale runtime (the data-center network), the slices' own collectives stay
  in the program."""
  found = []
  for m in re.finditer(r'= \((\w+)\[([\d,]*)\][^\n]*? send\([^\n]*'
                       r'_xla_megascale_transfer_type="(\w+)"', hlo):
    dims = [int(d) for d in m.group(2).split(',') if d]
    found.append((m.group(3), math.prod(dims)))
  return found


def test_across_slices_only_gradients_and_scalars_are_reduced():
  """Two v5e-4 slices, fsdp 2 x data 2 in each: the batch splits over the slices (`dcn`), the
  parameters do not, so what crosses the data-center network is the gradients' all-reduce and
  the step's scalar metrics: all-reduces, of no more elements than the parameters (a
  parameter gather or an activation would be another kind, or more)."""
  config = tiny(configs.tiny_gpt, mesh={'data': 2, 'fsdp': 2, 'tensor': 1})
  planner = plan.Planner(config, 'v5litepod-4', slices=2)
  assert dict(planner.mesh.shape) == {'dcn': 2, 'data': 2, 'fsdp': 2, 'tensor': 1}
  assert {d.slice_index for d in planner.mesh.devices[0].flat} == {0}
  assert {d.slice_index for d in planner.mesh.devices[1].flat} == {1}
  compiled, _, message = planner.train(16)
  assert compiled is not None, message
  # the plan's bytes per chip are the compiler's own peak
  assert plan.memory(compiled)['hbm_bytes_per_chip'] == (
      compiled.memory_analysis().peak_memory_in_bytes)
  transfers = megascale_transfers(compiled.as_text())
  params = sum(math.prod(x.shape) for x in
               jax.tree.leaves(planner.steps.abstract_state.params))
  assert transfers and {kind for kind, _ in transfers} == {'ALL_REDUCE'}
  # each device reduces its fsdp half of the gradients (tiled, so padded) with its twin
  assert params / 2 <= sum(n for _, n in transfers) <= params


def test_plan_command_reports_a_config_too_large_as_a_result():
  """A batch the chip cannot hold (8 rows of 2048 tokens with a million-word vocabulary:
  4 GiB of float32 logits per row alone, which the autodiff loss keeps): `fits: false` on the
  JSON line and the compiler's own message in the summary, exit 0, no traceback."""
  done = commands.run('plan', '--config', 'tiny_gpt', '--topology', 'v5e-1',
                      '--config.model.num_layers=1', '--config.model.vocab_size=1000000',
                      '--config.data.seq_len=2048', '--config.model.max_len=2048',
                      '--config.train.batch_size=8', '--config.train.fused_loss=False',
                      timeout=600)
  assert done.returncode == 0, done.stderr
  line = json.loads(done.stdout.strip().splitlines()[-1])
  assert line['fits'] is False and line['batch_size'] == 8
  assert line['dtype'] == 'bfloat16'     # tiny_gpt's model.dtype='auto' on a TPU, no flag
  assert (line['topology'], line['chips'], line['slices']) == ('v5litepod-1', 1, 1)
  assert line['hbm_capacity_bytes'] == 16 * 2**30
  assert 'RESOURCE_EXHAUSTED' in done.stderr and 'HBM' in done.stderr
  assert 'Traceback' not in done.stderr


def test_without_libtpu_plan_is_one_error_line_naming_the_extra():
  hide = ('import importlib.util as u, runpy, sys; real = u.find_spec; '
          "u.find_spec = lambda name, *a: None if name == 'libtpu' else real(name, *a); "
          "sys.argv = ['plan', '--config', 'tiny_gpt', '--topology', 'v4-8']; "
          "runpy.run_module('pretrain_jax.commands.plan', run_name='__main__')")
  done = subprocess.run([sys.executable, '-c', hide], cwd=ROOT, capture_output=True, text=True,
                        timeout=300, check=False)
  assert done.returncode == 2 and done.stdout == ''
  assert done.stderr.strip().splitlines() == [
      f'error: the TPU compiler (libtpu) is not installed; expected {plan.INSTALL}']


@pytest.mark.parametrize('args, named', [
    (['--topology', 'v3-8'], "'v3-8': plan compiles for v4, v5litepod, v5p, v6e"),
    (['--topology', 'v5e-3'], "unknown accelerator type 'v5e-3'"),
    (['--topology', 'v5litepod-8', '--config.mesh.tensor=3'], 'config.mesh'),
])
def test_plan_refuses_bad_input_in_one_line(args, named):
  done = commands.run('plan', '--config', 'tiny_gpt', *args)
  assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
  assert done.stderr.startswith('error: ') and named in done.stderr


def test_bytes_per_row_is_the_slope_between_two_batches():
  def compiled(rows):
    m = types.SimpleNamespace(argument_size_in_bytes=100, output_size_in_bytes=0,
                              alias_size_in_bytes=0, temp_size_in_bytes=0,
                              generated_code_size_in_bytes=0,
                              peak_memory_in_bytes=1000 + 300 * rows)
    return types.SimpleNamespace(memory_analysis=lambda: m)
  fits = types.SimpleNamespace(train=lambda rows: (compiled(rows), None, ''))
  assert plan.bytes_per_row(fits) == 300 and plan.bytes_per_row(fits, (1, 8)) == 300
  refused = types.SimpleNamespace(train=lambda rows: (None, None, 'RESOURCE_EXHAUSTED'))
  with pytest.raises(ValueError, match='batch 2 does not compile: RESOURCE_EXHAUSTED'):
    plan.bytes_per_row(refused)


GUARD = dict(layers=2, length=512, width=256, vocab=1024)


def _bytes_per_row(**train):
  """The guard's GPT on one v5e chip (no collective's buffer is per row): the train step's
  peak at 4 rows less the peak at 2, per row; and Korthikanti et al.'s bound, 34 h bytes per
  token per layer (16-bit activations, 1-byte dropout masks, no (T, T) tensor)."""
  layers, length, width, vocab = (GUARD[k] for k in ('layers', 'length', 'width', 'vocab'))
  config = tiny(configs.tiny_gpt, model=dict(
      num_layers=layers, emb_dim=width, num_heads=2, head_dim=128, mlp_dim=4 * width,
      max_len=length, vocab_size=vocab, dropout_rate=0.1, attention_dropout_rate=0.0),
      data=dict(seq_len=length), train=train)
  return plan.bytes_per_row(plan.Planner(config, 'v5litepod-1')), 34 * width * layers * length


@pytest.mark.slow   # two TPU compiles of a 512-token model
def test_activation_bytes_per_row_stay_near_korthikantis_bound():
  """With the fused loss (the default) a row costs its layers and no float32 (T, V) logits:
  the compiler pinned here gives 0.96x the bound (8,538,112 bytes against 8,912,896). One f32
  (T, V) array back (2 MiB here, 0.24x), an f32 dropout mask or any 5 h bytes per token per
  layer more (an f32 copy of the residual stream and the MLP input) passes 1.15x. Heads of
  128 are whole TPU tiles, so padding neither hides nor adds bytes."""
  per_row, bound = _bytes_per_row()
  assert 0.8 * bound < per_row < 1.15 * bound, (per_row, bound)


@pytest.mark.slow
def test_the_autodiff_loss_fails_the_guard_by_its_logits():
  """train.fused_loss=False keeps the float32 (T, V) logits for the backward pass: 1.28x the
  bound (11,420,672 bytes), 1.04x of the bound plus one f32 (T, V) array."""
  per_row, bound = _bytes_per_row(fused_loss=False)
  logits = 4 * GUARD['vocab'] * GUARD['length']
  assert per_row > 1.15 * bound and per_row > bound + logits, (per_row, bound)


def test_fsdp_keeps_each_chip_s_activations_to_its_rows():
  """fsdp 4 on a v5e-4, 8 rows (2 per chip): no chip's program holds the logits or the MLP's
  hidden activations of all 8 rows. Left to XLA's propagation, the activations followed the
  fsdp-sharded weights (their features split, the whole batch gathered): 4x the bytes per row."""
  config = tiny(configs.tiny_gpt, mesh={'data': 1, 'fsdp': 4, 'tensor': 1})
  planner = plan.Planner(config, 'v5litepod-4')
  compiled, _, message = planner.train(8)
  assert compiled is not None, message
  m, length = planner.run.model, planner.run.data.seq_len
  text = compiled.as_text()
  shapes = set(re.findall(r'\w+\[(\d+),(\d+),(\d+)\]', text))
  assert (str(2), str(length), str(m.vocab_size)) in shapes          # each chip's own rows
  for features in (m.vocab_size, m.mlp_dim):
    assert (str(8), str(length), str(features)) not in shapes
  # The published config's model.dtype='auto', compiled for a TPU: every matmul (a TPU
  # `convolution`) multiplies bf16 operands, none float32 (the fused loss accumulates in
  # float32, so some results are).
  types = dict(re.findall(r'%([\w.-]+) = (\w+)\[', text))          # instruction: its dtype
  operands = re.findall(r' convolution\(%([\w.-]+), %([\w.-]+)\)', text)
  assert m.dtype == 'auto' and operands
  seen = {types[name] for pair in operands for name in pair}   # bf16 (and pred: one-hot rows)
  assert 'bf16' in seen and 'f32' not in seen, (seen, operands)


# -- --fit: the largest batch and the remat policy -----------------------------------------


class FakePlanner:
  """A planner whose policies fit up to `limits[policy]` rows at `flops[policy]` FLOPs."""

  def __init__(self, policy, limits, flops, batch=8, made=None):
    self.limits, self.flops, self.made = limits, flops, made if made is not None else []
    self.run = types.SimpleNamespace(train=types.SimpleNamespace(batch_size=batch),
                                     model=types.SimpleNamespace(remat=policy))

  def with_remat(self, policy):
    return FakePlanner(policy, self.limits, self.flops, self.run.train.batch_size, self.made)


def fake_plan(planner, batch_size, with_eval=True):
  del with_eval
  policy = planner.run.model.remat
  planner.made.append((policy, batch_size))
  return {'fits': batch_size <= planner.limits[policy], 'flops_per_chip': planner.flops[policy]}


@pytest.mark.parametrize('limits, flops, choice, compiled', [
    ({'none': 8, 'minimal': 16, 'full': 32}, (1.0, 1.1, 1.3), 'none', ['none']),
    ({'none': 4, 'minimal': 16, 'full': 32}, (1.0, 1.1, 1.3), 'minimal', ['none', 'minimal']),
    ({'none': 4, 'minimal': 16, 'full': 32}, (1.0, 1.3, 1.1), 'full', ['none', 'minimal']),
    ({'none': 4, 'minimal': 4, 'full': 8}, (1.0, 1.1, 1.3), 'full', ['none', 'minimal']),
    ({'none': 4, 'minimal': 4, 'full': 4}, (1.0, 1.1, 1.3), None, ['none', 'minimal'])])
def test_the_remat_choice_is_the_cheapest_that_fits_the_batch(monkeypatch, limits, flops, choice,
                                                              compiled):
  """Configured 'full' at batch 8 (its plan made): 'none' recomputes nothing, so where it fits
  it is the choice; else each other policy is compiled once at batch 8 and the cheapest in its
  compiled FLOPs (not by name or place) of those that fit is the choice."""
  monkeypatch.setattr(fit_lib.plan_lib, 'plan', fake_plan)
  flops = dict(zip(('none', 'minimal', 'full'), flops, strict=True))
  planner = FakePlanner('full', limits, flops)
  head = fake_plan(planner, 8)
  out = fit_lib.choose_remat(planner, {8: head}, head['fits'], ('full', 'minimal', 'none'))
  assert out['remat_choice'] == choice
  assert planner.made == [('full', 8)] + [(p, 8) for p in compiled]
  assert out['remat_compiles'] == len(compiled)
  known = ['none'] if compiled == ['none'] else ['none', 'minimal', 'full']
  assert out['remat_flops_per_chip'] == {p: flops[p] if limits[p] >= 8 else None for p in known}


def test_no_remat_that_fits_is_chosen_without_a_compile(monkeypatch):
  monkeypatch.setattr(fit_lib.plan_lib, 'plan', fake_plan)
  planner = FakePlanner('none', {'none': 64, 'full': 64}, {'none': 1.0, 'full': 1.3})
  out = fit_lib.choose_remat(planner, {}, True, ('none', 'full'))
  assert out['remat_choice'] == 'none' and out['remat_compiles'] == 0 and planner.made == []


@pytest.mark.slow
def test_fit_finds_the_largest_batch_in_four_compiles():
  """A tiny GPT with a 64k-word vocabulary at 512 tokens on one v5e chip (the autodiff loss's
  float32 logits: 128 MiB a row), configured at 4 rows: at most 4 train-step compiles find a
  batch that the compiler fits and the next that it refuses (here the line from 4 and 65 rows
  predicts 81, the check finds that 82 fits as well, and the test's own compile refuses 83).
  'none' fits the configured batch: it is the remat choice, without a compile."""
  config = tiny(configs.tiny_gpt, model=dict(vocab_size=65536, max_len=512),
                data=dict(seq_len=512, tokenizer_vocab_size=65536),
                train=dict(batch_size=4, fused_loss=False))
  planner = plan.Planner(config, 'v5litepod-1')
  out = fit_lib.fit(planner, with_eval=False, policies=('none', 'full'))
  assert planner.compiles == out['fit_compiles'] <= fit_lib.FIT_COMPILES
  best, peaks = out['max_batch_size'], out['fit_peaks']
  assert out['fits'] and out['planned_batch_size'] == best > 4 and len(peaks) == planner.compiles
  assert peaks[best] == out['hbm_bytes_per_chip'] <= out['hbm_capacity_bytes']
  assert out['next_batch_size'] == best + 1
  assert peaks[best - 1] is not None   # the line's prediction, and the check fitting it
  if not out['fit_checked']:
    refused, _, message = planner.train(best + 1)
    assert refused is None and 'RESOURCE_EXHAUSTED' in message
  assert out['remat_choice'] == 'none' and out['remat_compiles'] == 0
