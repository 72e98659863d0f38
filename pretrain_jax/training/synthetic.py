"""Deterministic synthetic batches in the DESIGN.md layout, for tests and benchmarks.

Batch i is a pure function of (seed, i), so a restored iterator (get_state / set_state) repeats
exactly; `fixed=True` repeats batch 0 (a loss that must go down). `zipf=a` (> 1) ranks ids by a
Zipf law like text's, so costs of repeated ids (an embedding gradient's scatter-add) show up.
"""
import numpy as np

from pretrain_jax.data.config import DataConfig
from pretrain_jax.models import ModelConfig, family_of


class SyntheticDataset:

  def __init__(self, family: str, *, vocab_size: int, seq_len: int, batch_size: int,
               seed: int = 0, nsp: bool = False, fixed: bool = False, zipf: float = 0.0,
               target_len: int = 0):
    if zipf and zipf <= 1.0:
      raise ValueError(f'zipf={zipf}; expected 0 (uniform ids) or an exponent > 1')
    self.family, self.target_len = family_of(family), target_len or None
    self.vocab_size, self.seq_len, self.zipf = vocab_size, seq_len, zipf
    self.batch_size, self.seed, self.nsp, self.fixed = batch_size, seed, nsp, fixed
    self.index = 0

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    batch = self.batch(0 if self.fixed else self.index)
    self.index += 1
    return batch

  def get_state(self) -> dict:
    return {'index': self.index}

  def set_state(self, state: dict) -> None:
    self.index = int(state['index'])

  def batch(self, index: int) -> dict:
    """Batch `index`: (B, T + 1) ids in [3, vocab_size) (uniform, or 3 + Zipf rank clipped to
    the vocabulary) laid out by the family's record (models.family)."""
    rng = np.random.default_rng([self.seed, index])
    shape = (self.batch_size, self.seq_len + 1)
    if self.zipf:
      ranks = np.minimum(rng.zipf(self.zipf, shape) - 1, self.vocab_size - 4)
      tokens = (3 + ranks).astype(np.int32)
    else:
      tokens = rng.integers(3, self.vocab_size, shape, dtype=np.int32)
    return self.family.example_batch(tokens, rng, nsp=self.nsp, target_len=self.target_len)


def synthetic_datasets(config, fixed: bool = False):
  """A `datasets` callable for train_and_evaluate built from config.model / config.data (a
  whole ConfigDict: pretrain-jax train --synthetic_data and tests build its sections here)."""
  model, data = ModelConfig.from_config(config.model), DataConfig.from_config(config.data)

  def datasets(*, split, batch_size, process_index=0, process_count=1, **unused):
    del unused, process_count
    seed = 1000 * (split != data.train_split) + 17 * process_index + data.seed
    return SyntheticDataset(model.family, vocab_size=model.vocab_size, seq_len=data.seq_len,
                            batch_size=batch_size, seed=seed, nsp=model.nsp, fixed=fixed)
  return datasets
