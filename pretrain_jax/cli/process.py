"""Process set-up for the commands: glibc malloc tuned for XLA:CPU's step buffers, and
TensorFlow's C++ log settings. The standard library only: `start` runs before anything else is
imported (pretrain_jax/cli/__init__.py)."""
import ctypes
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
  keep_freed_memory(forced_cpu_devices())


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
  Runs before any thread starts (`start`; cli.use_cpu_devices sets the arena count again before
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
