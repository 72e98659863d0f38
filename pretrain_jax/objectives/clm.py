"""Causal language modelling: next-token pairs of one document.

EOS is appended to every document so the model learns to stop. The pairs of a document are
(doc[i], doc[i+1]) for doc = tokens + [EOS]: every real token of the document is an INPUT that
has a target (its successor, or EOS for the last one), and no target ever crosses into another
document. The first token of a document is never a target (there is no BOS). A packed row may
hold a document's pairs split into pieces; each piece restarts its positions at 0.
"""
import numpy as np


def clm_pairs(tokens: np.ndarray, eos_id: int) -> tuple:
  """(inputs, targets), each (N,) int32 for a document of N tokens: targets = inputs shifted."""
  tokens = np.asarray(tokens, np.int32)
  if tokens.ndim != 1:
    raise ValueError(f'clm_pairs wants one document (N,); got shape {tokens.shape}')
  seq = np.append(tokens, np.int32(eos_id))
  return seq[:-1], seq[1:]


def loss_weights(segment_ids: np.ndarray) -> np.ndarray:
  """float32 (B, T): 1 on every real (non-pad) position; each one has a same-document target."""
  return (np.asarray(segment_ids) > 0).astype(np.float32)
