"""The matmul FLOPs and bytes of a compiled program, each loop body counted as often as it runs,
read from the program's HLO text (`compiled.as_text()`).

XLA's cost analysis (`compiled.cost_analysis()`) counts a while loop's body once: a scanned
layer stack (model.scan_layers), the microbatches' gradient accumulation and the chunked loss
are each one body there, however many times they run. This reads the optimized program: its
computations, which instruction calls which (a fusion its fused computation, a while loop its
condition and body), each loop's trip count (XLA's own `known_trip_count`, or its condition
`counter < N` with the counter's start and step constants: the TPU compiler's collective
matmul loops run two steps a body), and per computation the FLOPs of its dots and
convolutions (2 per multiply-add, as XLA counts them; the TPU compiler writes matmuls as
convolutions) and the bytes its instructions read and write (operands and results; a slice
reads what it produces, an in-place update writes its update: an estimate, 0.75x XLA's own
count on a tiny GPT's program, within 4% between GPT-2 small scanned and unrolled). A Mosaic
kernel (a custom call) counts nothing here either.
"""
import dataclasses
import math
import re

ARRAY = re.compile(r'\b([a-z]+)(\d*)[a-z0-9]*\[([\d,]*)\]')   # bf16[2,128], pred[], f8e4m3fn[4]
START = re.compile(r'\s*(?:ROOT )?%([^\s=]+) = ')
NAME = re.compile(r'%([^\s,(){}]+)')
TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
# Instructions that read or write no memory of their own (a view, a tuple's bookkeeping, a
# call whose callee's instructions are counted).
FREE = {'parameter', 'get-tuple-element', 'tuple', 'constant', 'bitcast', 'while', 'call',
        'conditional', 'after-all', 'partition-id', 'replica-id', 'copy-done', 'slice-done',
        'all-gather-done', 'all-reduce-done', 'collective-permute-done', 'async-done',
        'send-done', 'recv-done', 'opt-barrier'}
CONTROL = {'while', 'call', 'conditional'}   # callees run as instructions of their own
PASS_THROUGH = {'copy', 'bitcast', 'convert', 'reshape'}


@dataclasses.dataclass
class Instruction:
  name: str
  shape: str
  opcode: str
  operands: list
  attrs: str
  args: str = ''   # the text between the opcode's parentheses (a constant's value)


@dataclasses.dataclass
class Counts:
  """FLOPs and bytes of one device's program: as XLA counts loops (`*_once`: each body once)
  and with each body times its trip count; `loops` the trip count of each while loop's body
  (None where it could not be read)."""
  flops: float = 0.0
  flops_once: float = 0.0
  bytes: float = 0.0
  bytes_once: float = 0.0
  loops: dict = dataclasses.field(default_factory=dict)

  @property
  def unknown_loops(self) -> list:
    return [body for body, trips in self.loops.items() if trips is None]


def _closing(text: str, start: int) -> int:
  """The index of the parenthesis that closes text[start] ('(')."""
  depth = 0
  for i in range(start, len(text)):
    depth += {'(': 1, ')': -1}.get(text[i], 0)
    if depth == 0:
      return i
  return len(text)


def parse_instruction(line: str) -> Instruction | None:
  start = START.match(line)
  if not start:
    return None
  rest = line[start.end():]
  if rest.startswith('('):   # a tuple's shape
    end = _closing(rest, 0)
    shape, rest = rest[:end + 1], rest[end + 1:].lstrip()
  else:
    shape, _, rest = rest.partition(' ')
  opcode, paren, rest = rest.partition('(')
  if not paren:
    return None
  end = _closing('(' + rest, 0) - 1
  return Instruction(start.group(1), shape, opcode, NAME.findall(rest[:end]), rest[end + 1:],
                     rest[:end])


def parse(text: str) -> tuple:
  """({computation: {instruction name: Instruction}}, the entry computation's name). An
  instruction's attributes may run over several lines (a kernel's metadata)."""
  computations, entry, current, last = {}, None, None, None
  for line in text.splitlines():
    if current is None:
      if line.endswith('{') and not line.startswith((' ', 'HloModule')):
        head = line.split()
        is_entry = head[0] == 'ENTRY'
        current = head[1 if is_entry else 0].lstrip('%')
        computations[current] = {}
        entry = current if is_entry else entry
      continue
    if line == '}':
      current, last = None, None
      continue
    inst = parse_instruction(line)
    if inst:
      computations[current][inst.name] = last = inst
    elif last is not None:
      last.attrs += '\n' + line
  return computations, entry


def dims(shape: str) -> list:
  found = ARRAY.search(shape)
  return [int(d) for d in found.group(3).split(',') if d] if found else []


def array_bytes(shape: str) -> float:
  """Bytes of every array in a shape (a tuple's elements added up)."""
  total = 0.0
  for _, bits, extent in ARRAY.findall(shape):
    size = int(bits) / 8 if bits else 1   # pred and token: a byte
    total += size * math.prod(int(d) for d in extent.split(',') if d)
  return total


def _attr_list(attrs: str, key: str) -> list:
  found = re.search(key + r'=\{([\d,]*)\}', attrs)
  return [int(d) for d in found.group(1).split(',') if d] if found else []


def _window(attrs: str, spatial: int) -> list:
  """(size, low padding, stride, lhs dilation, rhs dilation) per spatial dimension."""
  found = re.search(r'window=\{([^}]*)\}', attrs)
  fields = dict(f.split('=', 1) for f in found.group(1).split()) if found else {}

  def each(key, default):
    if key not in fields:
      return [default] * spatial
    return [int(v.split('_')[0]) for v in fields[key].split('x')]
  return list(zip(each('size', 1), each('pad', 0), each('stride', 1), each('lhs_dilate', 1),
                  each('rhs_dilate', 1), strict=True))


def _taps(inputs: int, outputs: int, window: tuple) -> int:
  """(output position, window tap) pairs of one spatial dimension that read an input (not
  padding, not a hole of the input's dilation)."""
  size, low, stride, lhs_dilate, rhs_dilate = window
  span = (inputs - 1) * lhs_dilate
  pairs = 0
  for k in range(size):
    if lhs_dilate == 1:   # the outputs o with 0 <= o * stride + k * rhs_dilate - low <= span
      first = max(0, -((k * rhs_dilate - low) // stride))
      last = min(outputs - 1, (span + low - k * rhs_dilate) // stride)
      pairs += max(0, last - first + 1)
    else:
      pairs += sum(1 for o in range(outputs)
                   if 0 <= (i := o * stride + k * rhs_dilate - low) <= span and i % lhs_dilate == 0)
  return pairs


def matmul_flops(inst: Instruction, names: dict) -> float:
  """2 x the multiply-adds of a dot or convolution, as XLA's cost analysis counts them (a
  convolution's window taps over padding count none)."""
  out = dims(inst.shape)
  if inst.opcode == 'dot':
    lhs = dims(names[inst.operands[0]].shape)
    contracted = _attr_list(inst.attrs, 'lhs_contracting_dims')
    return 2.0 * math.prod(out) * math.prod(lhs[d] for d in contracted)
  lhs_labels, rhs_labels, out_labels = re.search(
      r'dim_labels=(\w+)_(\w+)->(\w+)', inst.attrs).groups()
  lhs, rhs = (dims(names[o].shape) for o in inst.operands[:2])
  spatial = sum(c.isdigit() for c in out_labels)
  windows = _window(inst.attrs, spatial)
  macs = math.prod(size for label, size in zip(out_labels, out, strict=True) if not label.isdigit())
  macs *= rhs[rhs_labels.index('i')]   # one group's input features
  for d in range(spatial):
    macs *= _taps(lhs[lhs_labels.index(str(d))], out[out_labels.index(str(d))], windows[d])
  return 2.0 * macs


def _callees(inst: Instruction) -> list:
  """(computation, how it is called) of each computation `inst` calls."""
  out = []
  for key in ('calls', 'to_apply', 'condition', 'body', 'true_computation',
              'false_computation'):
    found = re.search(rf'\b{key}=%([^\s,}}]+)', inst.attrs)
    if found:
      out.append((found.group(1), key))
  branches = re.search(r'branch_computations=\{([^}]*)\}', inst.attrs)
  out += [(name, 'branch') for name in NAME.findall(branches.group(1))] if branches else []
  return out


def _source(names: dict, name: str) -> Instruction | None:
  """The instruction a value comes from, through copies and conversions."""
  inst = names.get(name)
  while inst is not None and inst.opcode in PASS_THROUGH and inst.operands:
    inst = names.get(inst.operands[0])
  return inst


def _constant(names: dict, name: str) -> int | None:
  inst = _source(names, name)
  if inst is None or inst.opcode != 'constant':
    return None
  return int(inst.args) if re.fullmatch(r'-?\d+', inst.args.strip()) else None


def _bound(computations: dict, condition: str) -> tuple | None:
  """(the loop counter's tuple index, N) of a condition `counter < N`, else None."""
  names = computations.get(condition, {})
  root = next(reversed(names.values()), None)
  if root is None or root.opcode != 'compare' or len(root.operands) != 2:
    return None
  a, b = (names.get(n) for n in root.operands)
  if 'direction=GT' in root.attrs:
    a, b = b, a
  elif 'direction=LT' not in root.attrs:
    return None
  if a is None or b is None or a.opcode != 'get-tuple-element':
    return None
  index = re.search(r'index=(\d+)', a.attrs)
  bound = _constant(names, b.name)
  return (int(index.group(1)), bound) if index and bound is not None else None


def _step(body: dict, index: int) -> int | None:
  """What the body adds to the loop counter (tuple element `index`) each run: its root tuple's
  element is `counter + constant` (the TPU compiler steps a loop it unrolled by 2 by 2)."""
  root = next(reversed(body.values()), None)
  if root is None or root.opcode != 'tuple' or index >= len(root.operands):
    return None
  update = body.get(root.operands[index])
  if update is None or update.opcode != 'add' or len(update.operands) != 2:
    return None
  for counter, step in (update.operands, reversed(update.operands)):
    read = _source(body, counter)
    if (read is not None and read.opcode == 'get-tuple-element'
        and re.search(rf'\bindex={index}\b', read.attrs)):
      return _constant(body, step)
  return None


def trip_count(computations: dict, names: dict, loop: Instruction) -> int | None:
  """How many times a while loop runs its body, or None where the program does not say: XLA's
  `known_trip_count`, else a condition `counter < N` with the counter starting at a constant
  and stepped by one."""
  known = TRIP.search(loop.attrs)
  if known:
    return int(known.group(1))
  called = dict((how, c) for c, how in _callees(loop))
  found = _bound(computations, called.get('condition', ''))
  init = names.get(loop.operands[0]) if loop.operands else None
  if found is None or init is None or init.opcode != 'tuple':
    return None
  start = _constant(names, init.operands[found[0]])
  step = _step(computations.get(called.get('body', ''), {}), found[0])
  if start is None or not step or step < 0:
    return None
  return max(-(-(found[1] - start) // step), 0)


SLICING = {'slice', 'dynamic-slice', 'gather'}


def _fusion_bytes(fused: dict, operand_bytes: list, result_bytes: float) -> float:
  """What a fusion reads and writes: an operand only sliced inside reads its slices, a buffer
  updated in place (dynamic-update-slice) writes only its update."""
  params = {int(i.args): i.name for i in fused.values() if i.opcode == 'parameter'
            and i.args.strip().isdigit()}
  users = {}
  for inst in fused.values():
    for position, operand in enumerate(inst.operands):
      users.setdefault(operand, []).append((inst, position))
  moved = 0.0
  for index, size in enumerate(operand_bytes):
    uses = users.get(params.get(index), [])
    if uses and all(u.opcode in SLICING and p == 0 for u, p in uses):
      size = sum(array_bytes(u.shape) for u, _ in uses)
    elif uses and all(u.opcode == 'dynamic-update-slice' and p == 0 for u, p in uses):
      size = 0.0   # the buffer it updates in place
    moved += size
  root = next(reversed(fused.values()), None)
  outputs = [fused.get(o) for o in root.operands] if root and root.opcode == 'tuple' else [root]
  for out in outputs:
    if out is not None and out.opcode == 'dynamic-update-slice' and len(out.operands) > 1:
      result_bytes -= array_bytes(out.shape) - array_bytes(fused[out.operands[1]].shape)
  return moved + result_bytes


def moved_bytes(inst: Instruction, names: dict, computations: dict) -> float:
  """Bytes an instruction reads and writes (its operands and result; slicing reads what it
  produces; an in-place update writes its update)."""
  operands = [array_bytes(names[o].shape) if o in names else 0.0 for o in inst.operands]
  result = array_bytes(inst.shape)
  if inst.opcode == 'slice-start':   # shape: ((the operand), the slice, a context)
    return 2.0 * (result - sum(operands))
  if inst.opcode.endswith('-start'):   # shape: the operands, the result and a context
    return result
  if inst.opcode in SLICING:
    return 2.0 * result
  if inst.opcode == 'dynamic-update-slice' and len(operands) > 1:
    return 2.0 * operands[1]
  if inst.opcode == 'fusion':
    callee = next((c for c, how in _callees(inst) if how == 'calls'), None)
    if callee in computations:
      return _fusion_bytes(computations[callee], operands, result)
  return result + sum(operands)


def count(text: str) -> Counts:
  """The Counts of one device's compiled program (`compiled.as_text()`)."""
  computations, entry = parse(text)
  counts = Counts()
  own = {}
  for comp, names in computations.items():
    flops = sum(matmul_flops(i, names) for i in names.values()
                if i.opcode in ('dot', 'convolution'))
    moved = sum(moved_bytes(i, names, computations) for i in names.values()
                if i.opcode not in FREE)
    own[comp] = (flops, moved)
  memo = {}

  def total(comp: str, repeat: bool) -> tuple:
    """(FLOPs, bytes) of one run of `comp`, loops repeated or each body once."""
    if (comp, repeat) in memo:
      return memo[comp, repeat]
    flops, moved = own.get(comp, (0.0, 0.0))
    names = computations.get(comp, {})
    for inst in names.values():
      for callee, how in _callees(inst):
        times = 1
        if inst.opcode == 'while' and how == 'body':
          trips = trip_count(computations, names, inst)
          counts.loops[callee] = trips
          times = trips if repeat and trips is not None else 1
        f, b = total(callee, repeat)
        flops += times * f
        moved += times * b if inst.opcode in CONTROL else 0.0
    memo[comp, repeat] = (flops, moved)
    return flops, moved

  counts.flops, counts.bytes = total(entry, True)
  counts.flops_once, counts.bytes_once = total(entry, False)
  return counts
