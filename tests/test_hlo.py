"""perf/hlo.py: a compiled program's matmul FLOPs with each loop body times its trip count,
against XLA's own cost analysis of programs compiled here (CPU, milliseconds each)."""
import jax
import jax.numpy as jnp
import pytest

from pretrain_jax.perf import hlo, plan

M, K, N, INNER, OUTER = 16, 32, 24, 7, 3


def nested_scans(x, w, v):
  """OUTER x INNER (M, K) @ (K, K) matmuls in two nested scans, then one (M, K) @ (K, N)."""
  def inner(c, _):
    return jnp.tanh(c @ w), None

  def outer(c, _):
    return jax.lax.scan(inner, c, None, length=INNER)[0], None
  return jax.lax.scan(outer, x, None, length=OUTER)[0] @ v


@pytest.fixture(scope='module')
def compiled():
  args = jnp.ones((M, K)), jnp.ones((K, K)), jnp.ones((K, N))
  return jax.jit(nested_scans).lower(*args).compile()


def test_each_loop_body_counts_its_trip_count_times(compiled):
  counts = hlo.count(compiled.as_text())
  body, last = 2 * M * K * K, 2 * M * K * N
  assert sorted(counts.loops.values()) == [OUTER, INNER]
  assert counts.flops == OUTER * INNER * body + last
  assert counts.flops_once == body + last
  # XLA counts each body once: its matmuls and a few scalar adds (tanh is a transcendental)
  assert 0 <= compiled.cost_analysis()['flops'] - counts.flops_once < 0.01 * counts.flops_once
  assert counts.bytes > counts.bytes_once > 0 and not counts.unknown_loops


def test_trip_counts_come_from_the_condition_where_xla_states_none(compiled):
  """Without XLA's statement (known_trip_count) a condition `counter < N`, the counter starting
  at a constant, gives the same counts; a loop whose condition is another test is unknown."""
  text = compiled.as_text()
  assert text.count('"known_trip_count":{"n":"') == 2
  bare = text.replace(f'"known_trip_count":{{"n":"{INNER}"}}', '"_":{}').replace(
      f'"known_trip_count":{{"n":"{OUTER}"}}', '"_":{}')
  assert '"known_trip_count"' not in bare and hlo.count(bare) == hlo.count(text)
  assert bare.count('direction=LT') == 2
  assert len(hlo.count(bare.replace('direction=LT', 'direction=NE')).unknown_loops) == 2


@pytest.mark.parametrize('options, kernel', [
    (dict(window_strides=(1, 1), padding='SAME'), (3, 4, 6, 8)),
    (dict(window_strides=(2, 3), padding=((2, 1), (0, 3))), (3, 4, 6, 8)),
    (dict(window_strides=(1, 1), padding=((1, 1), (2, 2)), lhs_dilation=(2, 1),
          rhs_dilation=(1, 2)), (3, 4, 6, 8)),
    (dict(window_strides=(1, 1), padding='VALID', feature_group_count=3), (3, 4, 2, 9))])
def test_a_convolution_counts_the_taps_that_read_an_input(options, kernel):
  """Padding, strides, dilations and feature groups, as XLA's cost analysis counts them (the
  TPU compiler writes its matmuls as such convolutions)."""
  def conv(x, k):
    return jax.lax.conv_general_dilated(x, k, dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
                                        **options)
  program = jax.jit(conv).lower(jnp.ones((2, 9, 10, 6)), jnp.ones(kernel)).compile()
  assert hlo.count(program.as_text()).flops == program.cost_analysis()['flops']


def test_instructions_parse_with_tuple_shapes_and_kernel_metadata():
  text = '\n'.join([
      'HloModule m', '',
      'ENTRY %main (p: f32[4,8]) -> f32[4,2] {',
      '  %p = f32[4,8]{1,0} parameter(0)',
      '  %c = (f32[4,8]{1,0:T(8,128)}, s32[]) custom-call(%p), custom_call_target="k", '
      'frontend_attributes={kernel_metadata={',
      '"xprof_metadata":"{}"',
      '}}, metadata={op_name="x"}',
      '  %g = f32[4,8]{1,0} get-tuple-element(%c), index=0',
      '  %w = f32[8,2]{1,0} constant({...})',
      '  ROOT %d = f32[4,2]{1,0} dot(%g, %w), lhs_contracting_dims={1}, '
      'rhs_contracting_dims={0}',
      '}'])
  computations, entry = hlo.parse(text)
  names = computations[entry]
  assert entry == 'main' and list(names) == ['p', 'c', 'g', 'w', 'd']
  assert names['c'].opcode == 'custom-call' and names['c'].operands == ['p']
  assert 'xprof_metadata' in names['c'].attrs and names['g'].attrs == ', index=0'
  assert hlo.count(text).flops == 2 * 4 * 8 * 2


def stepped_loop(bound: int, step: int) -> str:
  """A while loop as the TPU compiler writes its collective matmuls, unrolled by `step`: the
  counter, read through a copy, goes up by `step` a body, from 0 while below `bound`."""
  state = '(s32[], f32[4,8])'
  return '\n'.join([
      'HloModule m', '',
      f'%cond (p: {state}) -> pred[] {{',
      f'  %p = {state} parameter(0)',
      '  %i = s32[] get-tuple-element(%p), index=0',
      f'  %n = s32[] constant({bound})',
      '  ROOT %lt = pred[] compare(%i, %n), direction=LT',
      '}', '',
      f'%body (p: {state}) -> {state} {{',
      f'  %p = {state} parameter(0)',
      '  %i = s32[] get-tuple-element(%p), index=0',
      '  %c = s32[] copy(%i)',
      f'  %step = s32[] constant({step})',
      '  %next = s32[] add(%c, %step)',
      '  %x = f32[4,8] get-tuple-element(%p), index=1',
      '  %w = f32[8,8] constant({...})',
      '  %y = f32[4,8] dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}',
      f'  ROOT %t = {state} tuple(%next, %y)',
      '}', '',
      f'ENTRY %main (x: f32[4,8]) -> {state} {{',
      '  %x = f32[4,8] parameter(0)',
      '  %zero = s32[] constant(0)',
      f'  %init = {state} tuple(%zero, %x)',
      f'  ROOT %loop = {state} while(%init), condition=%cond, body=%body',
      '}'])


@pytest.mark.parametrize('bound, step, trips', [(8, 1, 8), (8, 2, 4), (7, 2, 4), (4, 4, 1)])
def test_a_loop_stepping_its_counter_by_more_than_one_runs_fewer_times(bound, step, trips):
  counts = hlo.count(stepped_loop(bound, step))
  assert counts.loops == {'body': trips}
  assert counts.flops == trips * 2 * 4 * 8 * 8 and counts.flops_once == 2 * 4 * 8 * 8


class Compiled:
  """What plan.costs reads of a compiled program: its cost analysis and its text."""

  def __init__(self, text, flops=1000.0, moved=500.0):
    self.text, self.analysis = text, {'flops': flops, 'bytes accessed': moved}

  def cost_analysis(self):
    return self.analysis

  def as_text(self):
    return self.text


def test_plan_adds_the_loops_further_runs_or_falls_back_to_the_analytic_count(compiled):
  text = compiled.as_text()
  counts = hlo.count(text)
  out = plan.costs(Compiled(text), analytic_flops=7.0)
  assert out['flops_source'] == 'compiler+loops' and out['compiler_flops_per_chip'] == 1000.0
  assert out['flops_per_chip'] == 1000.0 + counts.flops - counts.flops_once
  assert out['bytes_accessed_per_chip'] == 500.0 + counts.bytes - counts.bytes_once
  unreadable = plan.costs(Compiled(text.replace('"known_trip_count"', '"_"').replace(
      'direction=LT', 'direction=NE')), analytic_flops=7.0)
  assert unreadable['flops_source'] == 'analytic' and unreadable['flops_per_chip'] == 7.0
  assert unreadable['bytes_accessed_per_chip'] == 500.0
  straight = plan.costs(Compiled(stepped_loop(4, 1).replace('while(', 'call(')), 7.0)
  assert straight['flops_source'] == 'compiler' and straight['flops_per_chip'] == 1000.0
