"""T5-style packing: several examples per fixed-length row, kept apart by segment ids.

Next-fit: examples go into the current row while they fit; the first one that does not fit
closes the row (its unused tail is padding) and opens the next one. So padding appears only at
the tail of a row, and the order of examples is preserved, which keeps the stream resumable.
Segment ids are 1-based per example within a row (0 = padding) and shared by all streams of an
example (T5: encoder and decoder); positions restart at 0 for every example.
"""
import numpy as np


def _prefix(stream: str) -> str:
  return f'{stream}_' if stream else ''


class BatchPacker:
  """Fills a batch of `batch_size` rows, one stream of length lengths[s] per stream s.

  `features` maps each feature key to its stream, e.g. {'inputs': '', 'targets': ''} with
  lengths {'': 128}, or for T5 {'encoder_input_tokens': 'encoder', 'decoder_target_tokens':
  'decoder', ...} with lengths {'encoder': 512, 'decoder': 114}. Segment ids and positions are
  emitted as `<stream>_segment_ids` / `<stream>_positions` (`segment_ids` for stream '').
  """

  def __init__(self, batch_size: int, lengths: dict, features: dict, dtypes: dict | None = None):
    self.batch_size, self.lengths, self.features = batch_size, dict(lengths), dict(features)
    dtypes = dtypes or {}
    self.arrays = {k: np.zeros((batch_size, lengths[s]), dtypes.get(k, np.int32))
                   for k, s in features.items()}
    for s, n in lengths.items():
      self.arrays[_prefix(s) + 'segment_ids'] = np.zeros((batch_size, n), np.int32)
      self.arrays[_prefix(s) + 'positions'] = np.zeros((batch_size, n), np.int32)
    self.row, self.segment = 0, 0
    self.cursor = {s: 0 for s in lengths}

  def room(self, stream: str = '') -> int:
    """Free slots left in the current row of `stream`."""
    return self.lengths[stream] - self.cursor[stream]

  def _lengths(self, example: dict) -> dict:
    out = {}
    for key, value in example.items():
      stream = self.features[key]
      if out.setdefault(stream, len(value)) != len(value):
        raise ValueError(f'features of stream {stream!r} differ in length: {key} has '
                         f'{len(value)}, expected {out[stream]}')
    return out

  def fits(self, example: dict) -> bool:
    """Whether `example` fits in what is left of the current row in every stream."""
    return all(n <= self.room(s) for s, n in self._lengths(example).items())

  def add(self, example: dict) -> None:
    """Write `example` (key -> (n,) array) at the cursor of the current row."""
    lengths = self._lengths(example)
    for s, n in lengths.items():
      if n > self.lengths[s]:
        raise ValueError(f'example of {n} tokens is longer than the {s or "row"} length '
                         f'{self.lengths[s]}')
      if n > self.room(s):
        raise ValueError(f'example of {n} tokens does not fit the {self.room(s)} left in row')
    self.segment += 1
    r = self.row
    for key, value in example.items():
      c = self.cursor[self.features[key]]
      self.arrays[key][r, c:c + len(value)] = value
    for s, n in lengths.items():
      c = self.cursor[s]
      self.arrays[_prefix(s) + 'segment_ids'][r, c:c + n] = self.segment
      self.arrays[_prefix(s) + 'positions'][r, c:c + n] = np.arange(n)
      self.cursor[s] = c + n

  def next_row(self) -> bool:
    """Close the current row; False if it was the last row of the batch (batch is full)."""
    self.row += 1
    self.segment = 0
    self.cursor = {s: 0 for s in self.lengths}
    return self.row < self.batch_size

  @property
  def empty(self) -> bool:
    return self.row == 0 and self.segment == 0


def pack_examples(examples: list, lengths: dict, features: dict) -> dict:
  """Pure next-fit packing of `examples` into as many rows as needed: dict of (R, L) arrays."""
  packer = BatchPacker(max(len(examples), 1), lengths, features)
  rows = 0
  for example in examples:
    if not packer.fits(example):
      packer.next_row()
    packer.add(example)
    rows = packer.row + 1
  return {k: v[:rows] for k, v in packer.arrays.items()}


def shift_right_by_segment(targets: np.ndarray, segment_ids: np.ndarray,
                           start_id: int = 0) -> np.ndarray:
  """(B, T) decoder inputs: targets shifted right by one within each segment, `start_id` first."""
  shifted = np.zeros_like(targets)
  shifted[:, 1:] = targets[:, :-1]
  starts = np.ones(segment_ids.shape, bool)
  starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
  return np.where(starts | (segment_ids == 0), start_id, shifted)


def real_fraction(segment_ids: np.ndarray) -> float:
  """Share of non-padding positions."""
  return float(np.mean(np.asarray(segment_ids) > 0)) if np.size(segment_ids) else 0.0
