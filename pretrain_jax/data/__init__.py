"""Input pipelines: sources -> sentencepiece -> objective -> packed per-host numpy batches.

Public API (see DESIGN.md for the batch keys of each objective):
  load_tokenizer(data_config, source=None) -> Tokenizer     (data_config: config.DataConfig)
  open_tokenizer(path) -> Tokenizer
  make_dataset(data_config, tokenizer, *, split, batch_size, process_index=0, process_count=1,
               seed=None, repeat=True, model_max_len=None, source=None) -> DataIterator
  host_batch_size(global_batch_size, process_count), assemble_global_batch(host_batches)
"""
import importlib
import os

# TensorFlow (tf.data, tfds: loaded only by this package) reads its C++ log settings when it
# loads; without these a library call that starts it (a task's data, Pretrained.predict) prints
# its INFO lines, oneDNN's first, to the user's terminal. A value the user set wins; the
# commands set them first (cli/process.start). oneDNN only changes TF's float kernels, which
# the pipelines do not run.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')   # TensorFlow's C++ errors only
os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')  # its notice comes before that applies

# Imported on first use (PEP 562), so that `pretrain_jax.data.tokenizer` alone (a Hugging Face
# T5's sentinels, say) does not start TensorFlow, which the pipeline needs.
_WHERE = {'DataIterator': 'pipeline', 'DataReadError': 'sources',
          'assemble_global_batch': 'pipeline', 'check_lengths': 'pipeline',
          'host_batch_size': 'pipeline', 'make_dataset': 'pipeline',
          'Tokenizer': 'tokenizer', 'load_tokenizer': 'tokenizer', 'open_tokenizer': 'tokenizer',
          'train_sentencepiece': 'tokenizer'}
__all__ = sorted(_WHERE)


def __getattr__(name):
  if name not in _WHERE:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  return getattr(importlib.import_module(f'{__name__}.{_WHERE[name]}'), name)
