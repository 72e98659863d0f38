"""Input pipelines: sources -> sentencepiece -> objective -> packed per-host numpy batches.

Public API (see DESIGN.md for the batch keys of each objective):
  load_tokenizer(data_config, source=None) -> Tokenizer
  make_dataset(data_config, tokenizer, *, split, batch_size, process_index=0, process_count=1,
               seed=None, repeat=True, model_max_len=None, source=None) -> DataIterator
  host_batch_size(global_batch_size, process_count), assemble_global_batch(host_batches)
"""
from pretrain_jax.data.pipeline import (DataIterator, assemble_global_batch, check_lengths,
                                        host_batch_size, make_dataset)
from pretrain_jax.data.tokenizer import Tokenizer, load_tokenizer, train_sentencepiece

__all__ = ['DataIterator', 'Tokenizer', 'assemble_global_batch', 'check_lengths',
           'host_batch_size', 'load_tokenizer', 'make_dataset', 'train_sentencepiece']
