"""T5-style packing: several examples per fixed-length row, kept apart by segment ids.

Next-fit: examples go into the current row while they fit; the first one that does not fit
closes the row (its unused tail is padding) and opens the next one. First-fit (T5 examples,
which cannot be cut): each example goes into the first row of the batch with room in every
stream. Either way rows fill left to right, so padding appears only at the tail of a row, and a
batch holds a contiguous run of the example stream, which keeps the stream resumable.
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
  Rows fill left to right; `add` writes into the current row (next-fit) or any row (first-fit,
  `first_fit` finds the first row with room, as seqio's packing window does).
  """

  def __init__(self, batch_size: int, lengths: dict, features: dict):
    self.batch_size, self.lengths, self.features = batch_size, dict(lengths), dict(features)
    self.arrays = {k: np.zeros((batch_size, lengths[s]), np.int32) for k, s in features.items()}
    for s, n in lengths.items():
      self.arrays[_prefix(s) + 'segment_ids'] = np.zeros((batch_size, n), np.int32)
      self.arrays[_prefix(s) + 'positions'] = np.zeros((batch_size, n), np.int32)
    self.row = 0                                             # current row of next-fit
    self.segments = np.zeros(batch_size, np.int32)           # examples in each row
    self.cursors = {s: np.zeros(batch_size, np.int64) for s in lengths}  # next free slot

  @property
  def segment(self) -> int:
    """Examples already in the current row."""
    return int(self.segments[self.row]) if self.row < self.batch_size else 0

  def room(self, stream: str = '', row: int | None = None) -> int:
    """Free slots left in `row` (default: the current row) of `stream`."""
    return self.lengths[stream] - int(self.cursors[stream][self.row if row is None else row])

  def _lengths(self, example: dict) -> dict:
    out = {}
    for key, value in example.items():
      stream = self.features[key]
      if out.setdefault(stream, len(value)) != len(value):
        raise ValueError(f'features of stream {stream!r} differ in length: {key} has '
                         f'{len(value)}, expected {out[stream]}')
    return out

  def fits(self, example: dict, row: int | None = None) -> bool:
    """Whether `example` fits in what is left of `row` (default: current) in every stream."""
    return all(n <= self.room(s, row) for s, n in self._lengths(example).items())

  def first_fit(self, example: dict) -> int | None:
    """Index of the first row with room for `example` in every stream, or None."""
    ok = np.ones(self.batch_size, bool)
    for s, n in self._lengths(example).items():
      ok &= self.lengths[s] - self.cursors[s] >= n
    rows = np.flatnonzero(ok)
    return int(rows[0]) if rows.size else None

  def empty_row(self) -> int | None:
    """Index of the first row holding no example, or None (unpacked: one example per row)."""
    rows = np.flatnonzero(self.segments == 0)
    return int(rows[0]) if rows.size else None

  def add(self, example: dict, row: int | None = None) -> None:
    """Write `example` (key -> (n,) array) at the free end of `row` (default: current)."""
    r = self.row if row is None else row
    lengths = self._lengths(example)
    for s, n in lengths.items():
      if n > self.lengths[s]:
        raise ValueError(f'example of {n} tokens is longer than the {s or "row"} length '
                         f'{self.lengths[s]}')
      if n > self.room(s, r):
        raise ValueError(f'example of {n} tokens does not fit the {self.room(s, r)} left in '
                         f'row {r}')
    self.segments[r] += 1
    for key, value in example.items():
      c = self.cursors[self.features[key]][r]
      self.arrays[key][r, c:c + len(value)] = value
    for s, n in lengths.items():
      c = self.cursors[s][r]
      self.arrays[_prefix(s) + 'segment_ids'][r, c:c + n] = self.segments[r]
      self.arrays[_prefix(s) + 'positions'][r, c:c + n] = np.arange(n)
      self.cursors[s][r] = c + n

  def next_row(self) -> bool:
    """Close the current row; False if it was the last row of the batch (batch is full)."""
    self.row += 1
    return self.row < self.batch_size

  @property
  def empty(self) -> bool:
    return not self.segments.any()


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
