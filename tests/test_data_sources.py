"""Sources: local C4-format files (bad records counted), named tfds datasets, host shares."""
import collections
import gzip
import json
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from configs import common
from pretrain_jax import cli, data, paths
from pretrain_jax.data import local_builder, sources
from pretrain_jax.data.config import DataConfig

CLM16 = DataConfig.from_config(common.data_config('clm', 16))


@pytest.fixture()
def cache(tmp_path, monkeypatch):
  monkeypatch.setenv('PRETRAIN_JAX_CACHE', str(tmp_path / 'cache'))
  return tmp_path / 'cache'


def write_files(d):
  good = [f'document number {i} about things' for i in range(40)]
  lines = [json.dumps({'text': t, 'url': 'x'}).encode() for t in good[:30]]
  lines += [b'{"text": "bad \xff\xfe utf8"}', b'not json at all',
            json.dumps({'txt': 'no field'}).encode(), json.dumps({'text': '   '}).encode(),
            json.dumps({'text': 'lone \udc80 surrogate'}).encode()]
  (d / 'a.jsonl').write_bytes(b'\n'.join(lines) + b'\n')
  with gzip.open(d / 'b.json.gz', 'wt') as f:
    f.write(''.join(json.dumps({'text': t}) + '\n' for t in good[30:35]))
  (d / 'c.txt').write_text('\n\n'.join(good[35:39]) + '\n\n\n')
  (d / 'd.json').write_text(json.dumps([{'text': good[39]}]))
  (d / 'e.jsonl').write_text('')
  return good


def test_read_documents_counts_bad_records(tmp_path):
  good = write_files(tmp_path)
  stats = collections.Counter()
  paths = local_builder.expand_files(str(tmp_path / '*'))
  assert [os.path.basename(p) for p in paths] == ['a.jsonl', 'b.json.gz', 'c.txt', 'd.json',
                                                  'e.jsonl']
  # Globs that overlap name each file once, in the globs' order
  both = local_builder.expand_files(f'{tmp_path}/e.jsonl, {tmp_path}/*, {tmp_path}/a.jsonl')
  assert [os.path.basename(p) for p in both] == ['e.jsonl', 'a.jsonl', 'b.json.gz', 'c.txt',
                                                 'd.json']
  docs = list(local_builder.read_documents(paths, 'text', stats))
  assert docs == good
  assert stats == {'documents': 40, 'invalid_utf8': 2, 'bad_json': 1, 'no_text_field': 1,
                   'empty_document': 1, 'empty_file': 1}


def test_file_errors_name_the_problem(tmp_path, cache):
  with pytest.raises(FileNotFoundError, match='nothing-here'):
    local_builder.expand_files(str(tmp_path / 'nothing-here*.jsonl'))
  (tmp_path / 'x.csv').write_text('a,b')
  with pytest.raises(ValueError, match=r"x.csv' has an unsupported extension"):
    local_builder.expand_files(str(tmp_path / 'x.csv'))
  (tmp_path / 'adir').mkdir()   # was 'has an unsupported extension'
  with pytest.raises(ValueError, match=r"adir' is a directory;"):
    local_builder.expand_files(str(tmp_path / 'adir'))
  (tmp_path / 'empty.jsonl').write_text('\n\n')
  dc = CLM16.replace(files=str(tmp_path / 'empty.jsonl'))
  with pytest.raises(ValueError, match='no usable document'):
    sources.open_source(dc)
  with pytest.raises(ValueError, match='both tfds_name'):
    sources.open_source(dc.replace(tfds_name='c4/en'))
  whole = gzip.compress(b'{"text": "a document"}\n' * 50)
  (tmp_path / 'plain.json.gz').write_bytes(b'{"text": "not compressed"}\n')
  (tmp_path / 'cut.json.gz').write_bytes(whole[:len(whole) // 2])
  for name, why in (('plain.json.gz', 'BadGzipFile'), ('cut.json.gz', 'EOFError')):
    dc = dc.replace(files=str(tmp_path / name))
    with pytest.raises(ValueError, match=f'{name} is not a readable gzip file \\({why}'):
      sources.open_source(dc)


def test_validation_indices():
  assert local_builder.validation_indices(100, 0.02) == {25, 75}
  assert local_builder.validation_indices(10, 0.02) == {5}   # at least one
  assert local_builder.validation_indices(1, 0.5) == set()
  assert local_builder.validation_indices(10, 0.0) == set()


def texts(ds):
  return [t.decode() for t in ds.as_numpy_iterator()]


def test_local_files_splits_and_disjoint_host_shares(tmp_path, cache, capsys, caplog):
  good = write_files(tmp_path)
  dc = CLM16.replace(files=str(tmp_path / '*'), validation_fraction=0.1)
  with caplog.at_level('INFO', logger=local_builder.log.name):
    source = sources.open_source(dc)
  # The skipped records are said without --verbose; each one is logged at INFO (--verbose)
  # once, by the counting pass, not again by each split's.
  warning = [line for line in capsys.readouterr().err.splitlines() if 'records skipped' in line]
  assert len(warning) == 1 and warning[0].startswith('warning: local files: 40 documents kept')
  assert "'bad_json': 1" in warning[0], warning
  logged = [r for r in caplog.records if r.name == local_builder.log.name]
  assert logged and all(r.levelname == 'INFO' for r in logged)
  assert len(logged) == len({r.getMessage() for r in logged}), [r.getMessage() for r in logged]
  train = texts(sources.text_dataset(source, 'train', shuffle_buffer=0))
  val = texts(sources.text_dataset(source, 'validation', shuffle_buffer=0))
  assert len(val) == 4 and sorted(train + val) == sorted(good)
  shares = [texts(sources.text_dataset(source, 'train', process_index=p, process_count=3,
                                       seed=5)) for p in range(3)]
  assert sorted(sum(shares, [])) == sorted(train)  # disjoint and complete
  assert all(abs(len(s) - len(train) / 3) <= 1 for s in shares)
  # Deterministic per (seed, epoch); a new epoch reshuffles.
  e0 = texts(sources.text_dataset(source, 'train', seed=5, epoch=0))
  assert e0 == texts(sources.text_dataset(source, 'train', seed=5, epoch=0))
  assert e0 != texts(sources.text_dataset(source, 'train', seed=5, epoch=1))
  assert texts(sources.text_dataset(source, 'train', seed=5, epoch=0, skip=7)) == e0[7:]
  half = texts(sources.text_dataset(source, 'train[:50%]'))  # tfds slices work as splits
  assert len(half) == len(train) // 2 and set(half) <= set(train)
  with pytest.raises(ValueError, match="no split 'test'"):
    sources.text_dataset(source, 'test')


def test_where_the_files_are_prepared(tmp_path, cache, monkeypatch):
  """One process: this host's cache; several: one copy under the workdir; prepared_dir wins."""
  monkeypatch.setattr(paths, '_CHECKED', {'bucket'})   # (names only: no bucket is reached)
  dc = CLM16
  assert sources.prepared_dir(dc) == sources.prepared_dir(dc, 'runs/x', 1) == str(cache / 'tfds')
  assert sources.prepared_dir(dc, str(tmp_path / 'run'), 2) == str(tmp_path / 'run' /
                                                                 'prepared_data')
  assert sources.prepared_dir(dc, 'gs://bucket/run/', 4) == 'gs://bucket/run/prepared_data'
  with pytest.raises(ValueError, match='2 processes .* config.data.prepared_dir'):
    sources.prepared_dir(dc, None, 2)
  dc = dc.replace(prepared_dir='gs://bucket/prepared')
  assert {sources.prepared_dir(dc, 'gs://bucket/run', n) for n in (1, 2)} == {dc.prepared_dir}


def test_only_process_0_prepares_the_others_open_its_copy(tmp_path, cache, monkeypatch):
  (tmp_path / 'files').mkdir()
  good = write_files(tmp_path / 'files')
  dc = CLM16.replace(files=str(tmp_path / 'files' / '*'))
  shared = str(tmp_path / 'shared')
  # Process 1 never prepares: a name process 0 would send, nothing in the directory.
  with pytest.raises(FileNotFoundError, match=f"not prepared in '{shared}'"):
    sources.open_source(dc, data_dir=shared, process_index=1, sync=lambda _: 'f' + '0' * 16)
  assert not os.path.exists(os.path.join(shared, 'local_text_files', 'f' + '0' * 16))
  with pytest.raises(sources.PeerError, match='process 0 could not prepare') as failed:
    sources.open_source(dc, data_dir=shared, process_index=1, sync=lambda _: '')
  assert cli.is_user_error(failed.value)   # one error line on every other host, no traceback
  with pytest.raises(ValueError, match='pass the sync'):
    sources.open_source(dc, data_dir=shared, process_index=1)
  # Process 0 prepares, then hands its copy's name to the barrier.
  sent = []
  first = sources.open_source(dc, data_dir=shared, process_index=0,
                              sync=lambda name: sent.append(name) or name)
  assert sent == [first.fingerprint]
  assert os.listdir(os.path.join(shared, 'local_text_files')) == [first.fingerprint]
  # Process 1 (a fresh process: nothing opened) reads that copy without the raw files.
  for name in os.listdir(tmp_path / 'files'):
    os.remove(tmp_path / 'files' / name)
  monkeypatch.setattr(sources, '_OPENED', {})
  other = sources.open_source(dc, data_dir=shared, process_index=1, sync=lambda _: sent[0])
  assert other.builder is not first.builder
  assert sorted(texts(sources.text_dataset(other, 'train', shuffle_buffer=0)) +
                texts(sources.text_dataset(other, 'validation', shuffle_buffer=0))) == sorted(good)
  assert not os.path.exists(cache / 'tfds')
  # Process 0 failing tells the others ('') before it raises.
  sent.clear()
  with pytest.raises(FileNotFoundError, match='matches no file'):
    sources.open_source(dc, data_dir=shared, process_index=0,
                        sync=lambda name: sent.append(name) or name)
  assert sent == ['']


def test_a_prepared_dir_that_cannot_be_written_is_one_error_naming_it(tmp_path, cache):
  write_files(tmp_path)
  (tmp_path / 'a_file').write_text('not a directory')
  dc = CLM16.replace(files=str(tmp_path / '*.jsonl'),
                     prepared_dir=str(tmp_path / 'a_file' / 'prepared'))
  with pytest.raises(OSError, match=f"cannot prepare the data in '{dc.prepared_dir}'.*"
                                    'config.data.prepared_dir'):
    sources.open_source(dc)
  assert not os.path.exists(cache / 'tfds')


class PjTestText(tfds.core.GeneratorBasedBuilder):
  """A named tfds dataset with a `content` text feature, prepared into a tmp data_dir."""
  VERSION = tfds.core.Version('1.0.0')
  code_path = None

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
        {'content': tfds.features.Text(), 'id': tfds.features.Scalar(np.int32)}))

  def _split_generators(self, dl_manager):
    return {'train': self._generate_examples(20, bad=True),
            'validation': self._generate_examples(4)}

  def _generate_examples(self, n, bad=False):
    for i in range(n):
      yield i, {'content': f'named dataset text {i}', 'id': i}
    if bad:  # records a named dataset may hold: invalid UTF-8 bytes, an empty text
      yield n, {'content': b'broken \xff\xfe bytes', 'id': n}
      yield n + 1, {'content': '', 'id': n + 1}


def test_named_tfds_dataset(tmp_path, cache):
  PjTestText(data_dir=str(tmp_path / 'tfds')).download_and_prepare()
  dc = CLM16.replace(tfds_name='pj_test_text:1.0.0', tfds_data_dir=str(tmp_path / 'tfds'))
  with pytest.raises(ValueError, match=r"no feature 'text'; features: \['content', 'id'\]"):
    sources.open_source(dc)
  dc = dc.replace(text_key='content')
  got = texts(sources.text_dataset(sources.open_source(dc), 'validation'))
  assert sorted(got) == [f'named dataset text {i}' for i in range(4)]
  # Through the whole pipeline: bad records are skipped and counted, never a TF trace.
  tokenizer = data.load_tokenizer(dc)
  it = data.make_dataset(dc, tokenizer, split='train', batch_size=2, repeat=False)
  batches = list(it)
  assert batches and it.stats['skipped_invalid_utf8'] == 1 and it.stats['skipped_empty'] == 1
  assert it.stats['documents'] == 20
  dc = dc.replace(tfds_data_dir=str(tmp_path / 'elsewhere'))
  with pytest.raises(ValueError, match=r'pj_test_text:1\.0\.0 .*elsewhere'):
    sources.open_source(dc)
  dc = dc.replace(tfds_name='no_such_dataset_xyz')
  with pytest.raises(ValueError, match="cannot open tfds dataset 'no_such_dataset_xyz'"):
    sources.open_source(dc)
  # No copy there, and a version the pinned tfds cannot build.
  dc = dc.replace(tfds_name='c4/en:3.0.1')
  with pytest.raises(ValueError, match=r"'c4/en:3.0.1'.*expected a copy prepared in data_dir"):
    sources.open_source(dc)


def test_embedded_corpus_is_offline_and_split(cache):
  source = sources.open_source(CLM16)
  n_train, n_val = source.num_examples('train'), source.num_examples('validation')
  assert n_train > 250 and n_val == round((n_train + n_val) * 0.02)
