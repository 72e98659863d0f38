"""Prefix language modelling (the T5 paper's prefix LM objective, UniLM's seq-to-seq mask).

A decoder-only model reads each document's first P tokens as a bidirectional prefix and
predicts the rest left to right. The rows are CLM's (objectives/clm.py: inputs, next-token
targets, packed with segment ids and positions restarting at 0 per piece); this adds per piece
of n tokens a split point P drawn uniformly from 1..n-1 (a one-token piece: P = 1), as T5's
prefix_lm splits each text at a random point:

    prefix        1 on positions 0..P-1 of the piece: the tokens that see each other both ways
    loss_weights  1 on positions P-1..n-1: the targets that are not in the prefix (position
                  P-1 reads the whole prefix and predicts the first token after it; an earlier
                  position would predict a token it can see)

P = 1 is plain CLM on that piece. Worked example, one row holding a 5-token piece split at P = 3
and a 2-token piece (P = 1), then padding:

    segment_ids   1 1 1 1 1 2 2 0
    positions     0 1 2 3 4 0 1 0
    prefix        1 1 1 0 0 1 0 0
    loss_weights  0 0 1 1 1 1 1 0
"""
import numpy as np


def split_points(segment_ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """(B, T) int32: each real token's piece prefix length P (0 on padding), P uniform in
  1..max(n - 1, 1) for a piece of n tokens. One uniform draw per position, the piece taking
  its first position's, so the draws of a batch do not depend on how it is packed."""
  segment_ids = np.asarray(segment_ids)
  draws = rng.random(segment_ids.shape)                                   # (B, T)
  out = np.zeros(segment_ids.shape, np.int32)
  for row in range(segment_ids.shape[0]):
    seg = segment_ids[row]
    ids, starts, counts = np.unique(seg, return_index=True, return_counts=True)
    for sid, start, n in zip(ids, starts, counts, strict=True):
      if sid == 0:
        continue
      choices = max(int(n) - 1, 1)
      out[row, seg == sid] = 1 + int(draws[row, start] * choices)
  return out


def features(segment_ids: np.ndarray, positions: np.ndarray, rng: np.random.Generator) -> dict:
  """The prefix-LM features of packed CLM rows: {'prefix': int32 (B, T), 'loss_weights':
  float32 (B, T)} (see the module docstring)."""
  segment_ids, positions = np.asarray(segment_ids), np.asarray(positions)
  split = split_points(segment_ids, rng)
  real = segment_ids > 0
  return {'prefix': (real & (positions < split)).astype(np.int32),
          'loss_weights': (real & (positions >= split - 1)).astype(np.float32)}
