"""Where documents come from: one code path for every source in `config.data`.

- `tfds_name` set: any tfds dataset with a text feature (`c4/en:3.1.0` with `tfds_data_dir`
  pointing at a prepared copy, possibly `gs://...`). It is never downloaded from here.
- `files` set: local C4-format files (or gs://), prepared once as a tfds dataset
  (local_builder.py) in `prepared_dir`.
- neither: the embedded CPython documentation corpus (corpus.py), written as a JSON-lines file
  in the cache and then handled exactly like `files`.

Where the prepared copy lives (`prepared_dir`): `data.prepared_dir` when set; else, on one
process, this host's cache (`$PRETRAIN_JAX_CACHE/tfds`, reused by later runs); else
`<workdir>/prepared_data`, one copy the whole run shares (on a slice the workdir is a bucket).
On several processes only process 0 reads the raw files, once, to prepare them; the others
wait for it and open its copy (open_source's `sync`), and every host then reads only its
streams' shares of that copy (text_dataset). For C4-size data use a dataset prepared once for
all runs instead (`tfds_name` + `tfds_data_dir` on gs://), as t5x does.

`text_dataset` returns the per-stream, per-epoch shuffled tf.data stream of document strings.
"""
import functools
import hashlib
import re

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from pretrain_jax import paths as paths_lib
from pretrain_jax.data import corpus, local_builder
from pretrain_jax.data.config import DataConfig

# The input pipeline runs on the host CPU; keep TensorFlow off accelerators JAX owns.
tf.config.set_visible_devices([], 'GPU')


cache_dir = paths_lib.cache_dir


class PeerError(RuntimeError):
  """Another process of the run failed (its own error says why); this one stops too."""


class DataReadError(RuntimeError):
  """A data file could not be read: the storage refused or failed after its client's retries
  (TensorFlow's GCS client: GCS_RETRY_CONFIG_MAX_RETRIES, 10 by default), or it is gone."""


# TensorFlow's errors of a read that failed in the storage or found the file gone or cut short.
_READ_ERRORS = ('NotFoundError', 'PermissionDeniedError', 'UnauthenticatedError',
                'UnavailableError', 'AbortedError', 'DeadlineExceededError',
                'ResourceExhaustedError', 'FailedPreconditionError', 'DataLossError')


def read_error(error) -> DataReadError | None:
  """The input pipeline's `error` as a DataReadError naming the file when it is a failed read
  (TensorFlow's I/O errors say `... when reading gs://b/x.tfrecord-00000-of-00001`, gcsfs's
  OSError names the object), else None (a bug, which keeps its traceback)."""
  is_tf = isinstance(error, tf.errors.OpError) and type(error).__name__ in _READ_ERRORS
  if not (is_tf or isinstance(error, OSError)):
    return None
  text = error.message if is_tf else str(error)
  found = (re.search(r'when reading (\S+)', text) or re.search(r'\b(gs://\S+)', text)
           or re.search(r"'?(/\S+?)'?(?:[;:,]|\s|$)", text))
  name = getattr(error, 'filename', None) or (found.group(1) if found else 'a data file')
  why = re.sub(r'\{\{function_node [^}]*\}\}|\s*when reading \S+|\s*\[Op:\w+\].*', '',
               text, flags=re.DOTALL)
  return DataReadError(f'reading {name} failed ({type(error).__name__}: '
                       f'{" ".join(why.split())[:300]})')


class Source:
  """A prepared tfds builder, the name of its text feature, and a fingerprint of the data."""

  def __init__(self, builder, text_key: str, fingerprint: str, description: str):
    self.builder, self.text_key = builder, text_key
    self.fingerprint, self.description = fingerprint, description

  def num_examples(self, split: str) -> int:
    """Documents in `split`, which may be a tfds slice such as 'train[:90%]'."""
    return self.builder.info.splits[split].num_examples

  def num_bytes(self, split: str) -> int:
    """Size of the prepared examples of `split`'s base split (tfds records its bytes per split,
    not per slice): with num_examples, what tells other data of the same count apart."""
    return int(self.builder.info.splits[split.split('[')[0]].num_bytes)

  def check_split(self, split: str) -> None:
    splits = self.builder.info.splits
    if split.split('[')[0] not in splits:
      raise ValueError(f'{self.description} has no split {split!r}; available: '
                       f'{sorted(splits.keys()) or "none (is the dataset prepared?)"}')
    if self.num_examples(split) == 0:
      raise ValueError(f'split {split!r} of {self.description} has no documents; with local '
                       'files add documents or raise config.data.validation_fraction')


PREPARED_DATA = 'prepared_data'  # under the workdir: the copy all processes of a run read


def prepared_dir(data_config: DataConfig, workdir: str | None = None,
                 process_count: int = 1) -> str:
  """Where local files / the embedded corpus are prepared as tfds (see the module doc)."""
  if data_config.prepared_dir:
    return str(paths_lib.resolve(data_config.prepared_dir))
  if process_count == 1:
    return str(cache_dir() / 'tfds')
  if not workdir:
    raise ValueError(f'{process_count} processes read one prepared copy of the data; pass the '
                     'workdir or set config.data.prepared_dir to a directory every host reads')
  return str(paths_lib.resolve(workdir) / PREPARED_DATA)


def open_source(data_config: DataConfig, *, data_dir: str | None = None,
                process_index: int = 0, sync=None) -> Source:
  """The Source named by `data_config`; local files / the embedded corpus are prepared once in
  `data_dir` (default prepared_dir(data_config)) and reused from there.

  Several processes pass their index and `sync(name) -> name`, which returns process 0's
  argument on every process once process 0 has called it (a barrier). Process 0 alone reads
  the raw files and prepares them, then calls it with the prepared copy's name ('' when it
  failed); the others open that copy and never prepare: one not prepared in `data_dir` is an
  error naming the directory.
  """
  if data_config.tfds_name:
    return _named_source(data_config)
  if process_index and sync is None:
    raise ValueError(f'process_index={process_index} opens the copy process 0 prepares; '
                     'pass the sync that waits for it')
  data_dir = data_dir or prepared_dir(data_config)
  description = (f'local files {data_config.files!r}' if data_config.files
                 else 'the embedded pydoc corpus')
  name = ''
  if process_index == 0:
    try:
      source = _prepare(data_config, data_dir, description)
    except Exception:
      if sync is not None:
        sync('')  # the others stop instead of waiting for a copy that never comes
      raise
    name = source.fingerprint
  if sync is not None:
    name = sync(name)
  if process_index == 0:
    return source
  if not name:
    raise PeerError(f'process 0 could not prepare {description} in {data_dir!r}; its error '
                    'is in its log')
  if (data_dir, name) not in _OPENED:
    _OPENED[data_dir, name] = Source(local_builder.open_prepared(data_dir, name, description),
                                     'text', name, description)
  return _OPENED[data_dir, name]


def _prepare(data_config: DataConfig, data_dir: str, description: str) -> Source:
  if data_config.files:
    paths = local_builder.expand_files(data_config.files)
  else:
    paths = [_embedded_corpus_file(cache_dir())]
  key = (data_dir, local_builder.fingerprint(paths, data_config.text_key,
                                             data_config.validation_fraction))
  if key not in _OPENED:  # one builder per process: tfds logs every instantiation
    builder = local_builder.prepare(paths, data_dir, text_key=data_config.text_key,
                                    validation_fraction=data_config.validation_fraction)
    _OPENED[key] = Source(builder, 'text', builder.builder_config.name, description)
  return _OPENED[key]


_OPENED = {}


@functools.cache
def _embedded_corpus_file(directory: str) -> str:
  return corpus.write_embedded_corpus(directory / 'corpus')


def open_builder(name: str, data_dir):
  """tfds.builder(name, data_dir); ValueError naming the dataset and data_dir when tfds cannot
  open it."""
  try:
    return tfds.builder(name, data_dir=data_dir or None)
  except Exception as e:  # tfds raises several types (DatasetNotFoundError, ValueError, ...)
    why = (str(e).strip().splitlines() or [''])[0]   # (then tfds lists every dataset it has)
    raise ValueError(f'cannot open tfds dataset {name!r} (data_dir={data_dir or None!r}): '
                     f'{type(e).__name__}: {why}; expected a copy prepared in data_dir, or a '
                     f'name and version tensorflow-datasets {tfds.__version__} knows') from None


def not_prepared(name: str, data_dir, data_dir_key: str) -> ValueError:
  """The error for a tfds dataset that data_dir does not hold; `data_dir_key`: the config key
  that sets data_dir."""
  build = f'tfds build {name}' + (f' --data_dir {data_dir}' if data_dir else '')
  return ValueError(f'tfds dataset {name!r} in {data_dir or "the default data_dir"} is not '
                    f'prepared; prepare it (e.g. `{build}`) or point {data_dir_key} at a '
                    'prepared copy')


def _named_source(data_config: DataConfig) -> Source:
  name, data_dir = data_config.tfds_name, data_config.tfds_data_dir or None
  builder = open_builder(name, data_dir)
  if not builder.is_prepared():       # (its files in data_dir, not metadata tfds may know)
    raise not_prepared(name, data_dir, 'config.data.tfds_data_dir')
  description = f'tfds dataset {name!r} in {data_dir or "the default data_dir"}'
  features = builder.info.features
  if data_config.text_key not in features:
    raise ValueError(f'{description} has no feature {data_config.text_key!r}; features: '
                     f'{sorted(features.keys())}; set config.data.text_key')
  fp = hashlib.sha256(repr((name, data_dir, str(builder.version))).encode()).hexdigest()[:16]
  return Source(builder, data_config.text_key, fp, description)


def _seed(*parts) -> int:
  """A 31-bit tf.data seed mixed from integers (epoch-dependent shuffles)."""
  return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] >> 1)


def text_dataset(source: Source, split: str, *, process_index: int = 0, process_count: int = 1,
                 seed: int = 0, epoch: int = 0, shuffle_buffer: int = 10_000,
                 skip: int = 0) -> tf.data.Dataset:
  """Strings of one epoch of share `process_index` of `process_count` of `split`, shuffled
  deterministically (the pipeline's shares are data streams, not hosts).

  Share p of N is tfds.even_splits(split, N)[p]: disjoint contiguous ranges of the split.
  A share the shuffle buffer would hold whole is read once and kept in memory, each epoch a
  permutation seeded by (seed, epoch, process_index): reopening the files every epoch would
  dominate the pipeline's time for a share of a few dozen documents. A larger share streams
  from the files, file order and shuffle buffer seeded the same way. Either way an epoch is the
  same sequence every time. `skip` drops that many documents BEFORE tokenization (resume).
  """
  source.check_split(split)
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index={process_index}; expected 0 <= index < {process_count}')
  share = tfds.even_splits(split, n=process_count)[process_index] if process_count > 1 else split
  epoch_seed = _seed(seed, epoch, process_index)
  if 1 < shuffle_buffer and source.num_examples(split) <= shuffle_buffer * process_count:
    texts = _share_texts(source, share)
    order = np.random.default_rng([int(seed), int(epoch), int(process_index)]).permutation(
        len(texts))
    return tf.data.Dataset.from_tensor_slices(tf.constant(texts[order][skip:], tf.string))
  options = tf.data.Options()
  options.deterministic = True
  ds = source.builder.as_dataset(
      split=share, shuffle_files=True,
      read_config=tfds.ReadConfig(shuffle_seed=epoch_seed, options=options,
                                  add_tfds_id=False, try_autocache=False))
  ds = ds.map(lambda ex: ex[source.text_key], num_parallel_calls=tf.data.AUTOTUNE,
              deterministic=True)
  if shuffle_buffer > 1:
    ds = ds.shuffle(shuffle_buffer, seed=epoch_seed, reshuffle_each_iteration=False)
  return ds.skip(skip) if skip else ds


def _share_texts(source: Source, share) -> np.ndarray:
  """The strings of a (small) share in file order, read once per process."""
  key = (source.fingerprint, source.description, str(share))
  if key not in _SHARES:
    ds = source.builder.as_dataset(split=share, shuffle_files=False,
                                   read_config=tfds.ReadConfig(add_tfds_id=False,
                                                               try_autocache=False))
    texts = [ex[source.text_key] for ex in ds.as_numpy_iterator()]
    _SHARES[key] = np.array(texts, dtype=object)
  return _SHARES[key]


_SHARES = {}


def iter_texts(data_config: DataConfig, split: str | None = None,
               max_chars: int = 100_000_000, source: Source | None = None):
  """Python strings of a split in a fixed order, up to `max_chars` (tokenizer training), of
  `source` (default open_source(data_config))."""
  source = source or open_source(data_config)
  total = 0
  texts = text_dataset(source, split or data_config.train_split, shuffle_buffer=0)
  for raw in texts.as_numpy_iterator():
    text = raw.decode('utf-8', errors='replace')
    yield text
    total += len(text)
    if total >= max_chars:
      return
