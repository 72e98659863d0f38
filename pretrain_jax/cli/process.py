"""Process set-up for the commands: glibc malloc tuned for XLA:CPU's step buffers, TensorFlow's
C++ log settings, JAX's platform on a host without an accelerator, and the host CPU's XLA device
count (`use_cpu_devices`). The standard library only (JAX is imported late, by
use_cpu_devices): `start` runs before anything else is imported (pretrain_jax/cli/__init__.py)."""
import ctypes
import glob
import importlib.util
import os
import re
import sys

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX, M_ARENA_MAX = -1, -2, -4, -8   # glibc mallopt


def start() -> None:
  """What every command sets before any thread starts: TensorFlow's env settings (it reads them
  when it loads) and glibc malloc for the device count XLA_FLAGS asks for (an arena limit
  binds only threads started after it; numpy's import starts one)."""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')  # TensorFlow's C++ CPU-feature notices
  # TensorFlow (tf.data only: integer and string ops here) logs "oneDNN custom operations are
  # on" through absl before TF_CPP_MIN_LOG_LEVEL applies, on CPUs where oneDNN is on by
  # default. oneDNN only changes TF's float kernels.
  os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')
  choose_platform()
  keep_freed_memory(forced_cpu_devices())


# Where a host shows its accelerators: TPU chips (/dev/accel* on v2-v4, VFIO groups on v5e and
# later), NVIDIA GPUs (also under WSL2), AMD GPUs.
ACCELERATOR_DEVICES = ('/dev/accel*', '/dev/vfio/[0-9]*', '/dev/nvidia0', '/dev/nvidiactl',
                       '/dev/dxg', '/dev/kfd')
GOOGLE_PCI_VENDOR = '0x1ae0'   # TPU chips are Google PCI devices (so are some virtual NICs)


def host_files(root: str, pattern: str) -> list[str]:
  """The files under `root` that match an absolute `pattern` (the host's own device files: a
  local glob, since this module runs before epath may load)."""
  return glob.glob(root.rstrip('/') + pattern)  # noqa: TID251 (local /dev and /sys only)


def has_accelerator(root: str = '/') -> bool:
  """Whether the host under `root` may have a TPU or GPU: a device file of one, or any Google
  PCI device (a TPU VM's chips; an unknown one counts, so a new TPU is never missed)."""
  if any(host_files(root, pattern) for pattern in ACCELERATOR_DEVICES):
    return True
  for vendor in host_files(root, '/sys/bus/pci/devices/*/vendor'):
    try:
      with open(vendor) as f:  # noqa: PTH123 (a local sysfs file)
        if f.read().strip() == GOOGLE_PCI_VENDOR:
          return True
    except OSError:
      continue
  return False


def libtpu_installed() -> bool:
  return importlib.util.find_spec('libtpu') is not None


def choose_platform(root: str = '/') -> str:
  """JAX_PLATFORMS=cpu where libtpu is installed (the `tpu` extra, the tests' TPU compiler) on
  a host with no accelerator, unless JAX_PLATFORMS is set: JAX would try the TPU backend first,
  and libtpu's start-up prints warnings about the TPU runtime it cannot find. `pretrain-jax
  plan` still compiles for a TPU (its topology needs no backend). Returns JAX_PLATFORMS."""
  if 'JAX_PLATFORMS' not in os.environ and libtpu_installed() and not has_accelerator(root):
    os.environ['JAX_PLATFORMS'] = 'cpu'
  return os.environ.get('JAX_PLATFORMS', '')


def _glibc():
  """libc for mallopt, or None (not Linux, not glibc, or PRETRAIN_JAX_MALLOC=default)."""
  if os.environ.get('PRETRAIN_JAX_MALLOC') == 'default' or not sys.platform.startswith('linux'):
    return None
  try:
    return ctypes.CDLL('libc.so.6')
  except OSError:   # not glibc (e.g. musl): nothing to tune
    return None


def malloc_arenas(cpu_devices: int) -> int:
  """glibc arenas for a process running XLA on `cpu_devices` host devices: 1 for one device
  (its step buffers come from the main heap; see keep_freed_memory), glibc's own default of
  8 per core for several (their threads allocate at once and one arena serialises them)."""
  return 1 if cpu_devices <= 1 else 8 * (os.cpu_count() or 1)


def keep_freed_memory(cpu_devices: int = 1) -> bool:
  """glibc malloc tuned so a train step reuses the memory the last one freed.

  XLA:CPU allocates each step's buffers (tens of MB) from its worker threads. By default glibc
  serves those from per-thread arenas whose heaps cannot hold them, so they are mmap'ed and
  unmapped every step: fresh pages every call. No mmap, no trimming and a 256 MB top pad keep
  them in the heap: no page faults, faster steps (docs/performance.md). No trimming means
  M_TRIM_THRESHOLD -1 (mallopt(3): "disables trimming completely"). The largest positive value,
  2**31 - 1, still trims a free top of the heap above 2 GB, and the next step faults all of it
  in again.
  The arena count depends on `cpu_devices` (malloc_arenas):
  - one device: ONE arena. A thread arena's heap holds at most 64 MB and glibc (2.36) mmaps
    anything larger from a thread arena whatever M_MMAP_MAX says; tiny_gpt's step needs about
    100 MB, so only the main heap can keep it.
  - several devices (pretrain-jax shakespeare's cpu_devices=2): glibc's default arena count. Their
    threads allocate at the same time, and one arena would serialise XLA's compilation and
    steps on its lock. Each device's buffers (tens of MB) still fit a thread arena.
  Runs before any thread starts (`start`; use_cpu_devices sets the arena count again before
  JAX starts). PRETRAIN_JAX_MALLOC=default leaves glibc alone. Returns whether it applied.
  """
  libc = _glibc()
  if libc is None:
    return False
  return all(libc.mallopt(option, value) == 1 for option, value in (
      (M_ARENA_MAX, malloc_arenas(cpu_devices)), (M_MMAP_MAX, 0),
      (M_TRIM_THRESHOLD, -1), (M_TOP_PAD, 256 << 20)))


def forced_cpu_devices() -> int:
  """The device count XLA_FLAGS asks of the host platform (1 if it asks none)."""
  found = re.findall(r'--xla_force_host_platform_device_count=(\d+)',
                     os.environ.get('XLA_FLAGS', ''))
  return int(found[-1]) if found else 1


def use_cpu_devices(count: int) -> None:
  """Splits the host CPU into `count` XLA devices (0: leave it), before JAX starts its backends;
  a device count already in XLA_FLAGS wins, and GPU/TPU backends keep their devices."""
  if not isinstance(count, int) or count < 0:
    raise ValueError(f'cpu_devices={count!r}; expected 0 (leave it) or a device count')
  xla_flags = os.environ.get('XLA_FLAGS', '')
  if count and 'xla_force_host_platform_device_count' not in xla_flags:
    keep_freed_memory(count)   # arenas for `count` devices, while no thread took one
    os.environ['XLA_FLAGS'] = (f'{xla_flags} --xla_force_host_platform_device_count={count}'
                               .strip())
    import jax  # noqa: PLC0415 (start-up order: cli loads before JAX)
    if jax.default_backend() == 'cpu' and jax.local_device_count() != count:
      raise ValueError(f'cpu_devices={count} came too late: JAX already runs on '
                       f'{jax.local_device_count()} CPU device(s); set XLA_FLAGS='
                       f'--xla_force_host_platform_device_count={count} before starting')
