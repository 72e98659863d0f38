"""The one table of accelerator facts: Cloud TPU generations and the GPUs' peak for MFU.

Standard library only, so every layer may import it, the launcher (cloud/) included:
run/metrics.py reads the peak FLOP/s for MFU, perf/plan.py the topology of an accelerator type
and its chips' memory, peak and bandwidth, cloud/gcloud.py the types Cloud TPU sells. The
numbers and their sources (Cloud TPU's system architecture pages): docs/performance.md
("chip facts").

Worked example: topology('v5e-16') == Topology('v5litepod-16', BY_FAMILY['v5litepod'],
chips=16, name='v5e:4x4', host_bounds=(2, 2, 1)): 4 hosts of 2 x 2 chips; libtpu compiles for
it with `chip_config_name='default'` (v4 / v5p: 'megacore', one device per chip).
"""
import dataclasses
import re

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation, per chip (a JAX device is a chip, or a TensorCore on v2 / v3)."""
  family: str                 # gcloud's accelerator-type prefix: 'v4', 'v5litepod', ...
  device_kinds: tuple         # jax.Device.device_kind of its devices, lowercased
  topology_prefix: str        # libtpu's topology names: '<prefix>:2x2x1'
  sizes: tuple                # the N of the FAMILY-N types Cloud TPU sells
  counts_cores: bool          # N counts TensorCores (2 per chip), not chips
  devices_per_chip: int       # JAX devices per chip (2 where the cores are not one megacore)
  dims: int                   # the torus's dimensions (2 or 3)
  hbm_bytes: int              # HBM capacity per chip
  peak_flops: float           # datasheet dense bf16 FLOP/s per chip
  hbm_bytes_per_s: float      # datasheet HBM bandwidth per chip
  chip_config: str = 'default'   # libtpu's chip configuration ('megacore': 1 device per chip)
  host_chips: int = 4         # chips per host in a multi-host slice
  plans: bool = True          # perf/plan.py compiles for it (one device per chip)


def _pow2(lo: int, hi: int) -> tuple:
  return tuple(2 ** i for i in range(lo, hi + 1))


CHIPS = (
    Chip('v2', ('tpu v2',), 'v2', (8, 32, 128, 256, 512), True, 2, 2, 16 * GIB, 45e12, 600e9,
         plans=False),
    Chip('v3', ('tpu v3',), 'v3', (8, 32, 64, 128, 256, 512, 1024, 2048), True, 2, 2,
         32 * GIB, 123e12, 900e9, plans=False),
    Chip('v4', ('tpu v4',), 'v4', _pow2(3, 12), True, 1, 3, 32 * GIB, 275e12, 1200e9,
         'megacore'),
    Chip('v5litepod', ('tpu v5 lite', 'tpu v5e'), 'v5e', (1, 4, 8, 16, 32, 64, 128, 256),
         False, 1, 2, 16 * GIB, 197e12, 819e9),
    Chip('v5p', ('tpu v5', 'tpu v5p'), 'v5', _pow2(3, 13) + (12288,), True, 1, 3, 95 * GIB,
         459e12, 2765e9, 'megacore'),
    Chip('v6e', ('tpu v6 lite', 'tpu v6e'), 'v6e', (1, 4, 8, 16, 32, 64, 128, 256), False, 1, 2,
         32 * GIB, 918e12, 1638e9),
)
BY_FAMILY = {c.family: c for c in CHIPS}
ALIASES = {'v5e': 'v5litepod'}     # a short form people write for gcloud's name
# Dense bf16 peak FLOP/s of GPUs by a substring of their device_kind (for MFU only).
GPU_PEAK_FLOPS = {'h100': 989e12, 'h200': 989e12, 'a100': 312e12, 'v100': 125e12,
                  'l4': 121e12}
# Shapes that do not follow the powers-of-two rule of `_shape`.
SPECIAL_SHAPES = {('v5p', 6144): (16, 16, 24)}


@dataclasses.dataclass(frozen=True)
class Topology:
  """An accelerator type as libtpu's topology description names it."""
  tpu_type: str           # gcloud's spelling, e.g. 'v5litepod-8'
  chip: Chip
  chips: int
  name: str               # e.g. 'v5e:2x4'
  host_bounds: tuple      # chips per host along each axis, 3 long

  @property
  def hosts(self) -> int:
    return self.chips // (self.host_bounds[0] * self.host_bounds[1] * self.host_bounds[2])


def known_types_text() -> str:
  return ', '.join(f'{c.family}-{{{",".join(map(str, c.sizes))}}}' for c in CHIPS)


def parse_type(tpu_type: str) -> tuple:
  """'v5litepod-16' (or 'v5e-16') -> (Chip, 16); ValueError naming the known types otherwise."""
  match = re.fullmatch(r'(v\w+?)-(\d+)', tpu_type or '')
  family = ALIASES.get(match.group(1), match.group(1)) if match else ''
  chip = BY_FAMILY.get(family)
  if chip is None or int(match.group(2)) not in chip.sizes:
    raise ValueError(f'unknown accelerator type {tpu_type!r}; expected one of '
                     f'{known_types_text()} (v5e-N for v5litepod-N too)')
  return chip, int(match.group(2))


def canonical_type(tpu_type: str) -> str:
  """gcloud's spelling: 'v5e-8' -> 'v5litepod-8'."""
  chip, size = parse_type(tpu_type)
  return f'{chip.family}-{size}'


def _shape(chip: Chip, chips: int) -> tuple:
  """The slice's chip grid: 2-D `x <= y` as square as powers of two allow (v5e-8: 2x4), 3-D
  2x2x1 for 4 chips, else doubling the axes from the last (v4-32: 2x2x4, v4-64: 2x4x4)."""
  if (chip.family, chips) in SPECIAL_SHAPES:
    return SPECIAL_SHAPES[(chip.family, chips)]
  log = chips.bit_length() - 1
  if chip.dims == 2:
    x = 2 ** (log // 2)
    return (x, chips // x)
  if chips < 8:
    return (2, 2, 1) if chips == 4 else (1, 1, chips)
  shape = [1, 1, 1]
  for i in range(log):
    shape[2 - i % 3] *= 2
  return tuple(shape)


def topology(tpu_type: str) -> Topology:
  """The topology of an accelerator type (see the module's worked example)."""
  chip, size = parse_type(tpu_type)
  chips = size // 2 if chip.counts_cores else size
  shape = _shape(chip, chips)
  # One host holds a whole small slice (up to 8 chips on v5e / v6e); larger slices have hosts
  # of `host_chips` chips (2x2).
  single = chips <= (8 if chip.dims == 2 else 4)
  bounds = tuple(shape) + (1,) * (3 - len(shape)) if single else (2, 2, 1)
  return Topology(f'{chip.family}-{size}', chip, chips,
                  f'{chip.topology_prefix}:{"x".join(map(str, shape))}', bounds)


def chip_of_device_kind(device_kind: str):
  """The Chip whose devices report `device_kind` (jax.Device.device_kind), or None."""
  kind = device_kind.lower()
  return next((c for c in CHIPS if kind in c.device_kinds), None)


def peak_flops_per_device(device_kind: str):
  """Dense bf16 peak FLOP/s of one JAX device of this kind (a TPU chip's share per device), or
  None when the table has none."""
  chip = chip_of_device_kind(device_kind)
  if chip is not None:
    return chip.peak_flops / chip.devices_per_chip
  kind = device_kind.lower()
  return next((peak for name, peak in GPU_PEAK_FLOPS.items() if name in kind), None)
