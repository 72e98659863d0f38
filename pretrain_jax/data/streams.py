"""The stream rule: how a global batch is cut into data streams and streams onto hosts.

The data is S streams (config.data.num_streams), none of which knows the host count:

  split (shuffled per stream)   streams, each B/S rows         global batch (B rows)
  documents share 0 of S  --->  stream 0: shuffle, pack  --->  rows [0,      B/S)  \\ host 0
  documents share 1 of S  --->  stream 1: shuffle, pack  --->  rows [B/S,   2B/S)  /  (H = 2)
  documents share 2 of S  --->  stream 2: shuffle, pack  --->  rows [2B/S,  3B/S)  \\ host 1
  documents share 3 of S  --->  stream 3: shuffle, pack  --->  rows [3B/S,  4B/S)  /

Stream s reads tfds.even_splits(split, S)[s] with its own seeded per-epoch shuffle, packing and
MLM / span randomness (seeded by s, never by a host), and fills rows [s*B/S, (s+1)*B/S) of every
global batch. Host h of H owns streams [h*S/H, (h+1)*S/H) and yields their rows in stream
order: the contiguous block `jax.make_array_from_process_local_data` expects. A data state is
one position per stream, so a checkpoint written by N hosts restores on any M dividing S.

This module is pure (no TensorFlow): the checkpoint and tests use it without the pipeline.
"""
import math

AUTO_STREAMS = 8  # num_streams=0 takes gcd(global batch, 8): 1, 2, 4 or 8 hosts can resume it


def divisors(n: int) -> list:
  return [d for d in range(1, n + 1) if n % d == 0]


def resolve(num_streams: int, global_batch: int) -> int:
  """config.data.num_streams (0 = gcd(global batch, AUTO_STREAMS)) -> S; checks S | batch."""
  if not isinstance(num_streams, int) or num_streams < 0:
    raise ValueError(f'config.data.num_streams={num_streams!r}; expected a positive integer '
                     f'(or 0 for gcd(global batch, {AUTO_STREAMS}))')
  if num_streams == 0:
    return math.gcd(global_batch, AUTO_STREAMS)
  if global_batch % num_streams:
    raise ValueError(f'global batch_size={global_batch} does not split into '
                     f'config.data.num_streams={num_streams} streams of equal rows; expected a '
                     f'batch size that is a multiple of {num_streams}, or num_streams one of '
                     f'{divisors(global_batch)}')
  return num_streams


def fit_to_split(num_streams: int, num_documents: int, per_stream: int = 1) -> int:
  """A split too small to give every stream `per_stream` documents (a tiny validation split;
  NSP needs 2) is read by the largest divisor of S it can fill: a rule of the data alone, so
  still the same on every host count."""
  return max(d for d in divisors(num_streams) if d == 1 or num_documents // d >= per_stream)


def owned(num_streams: int, process_index: int, process_count: int,
          global_batch: int = 0) -> range:
  """The streams host `process_index` of `process_count` produces, in row order."""
  if num_streams % process_count:
    fits = [d for d in divisors(global_batch) if d % process_count == 0] if global_batch else []
    raise ValueError(f'{num_streams} data streams (config.data.num_streams) cannot be split '
                     f'over {process_count} hosts; expected a host count dividing '
                     f'{num_streams}: one of {divisors(num_streams)}'
                     + (f', or a run started with num_streams one of {fits}' if fits else ''))
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index={process_index}; expected 0 <= index < {process_count}')
  per_host = num_streams // process_count
  return range(process_index * per_host, (process_index + 1) * per_host)

