"""Data streams (data/streams.py): the global batches and the saved data state do not depend on
the host count, so a checkpoint written by N hosts resumes on M; the refusals name the numbers."""
import json

import numpy as np
import pytest

from configs import common
from pretrain_jax import data
from pretrain_jax.data import pipeline, streams
from pretrain_jax.data.config import DataConfig
from pretrain_jax.run import checkpoint

CASES = [('clm', False), ('mlm', False), ('mlm', True), ('span_corruption', False)]
GLOBAL = 8


@pytest.fixture(autouse=True)
def stop_prefetching():
  """Each iterator's prefetch thread polls its full queue until stopped: left running, the
  dozens made here would poll until the process exits."""
  yield
  pipeline.stop_prefetching()   # every live one, all told at once, then waited for together


@pytest.fixture(scope='module')
def tokenizer(data_cache):  # (the session's data cache: tests/conftest.py)
  del data_cache
  return data.load_tokenizer(DataConfig.from_config(common.data_config('clm', 64)))


def config(objective, nsp=False, num_streams=4):
  dc = common.data_config(objective, 32)
  dc.update(nsp=nsp, num_streams=num_streams, prefetch=1)
  return DataConfig.from_config(dc)


def hosts(dc, tokenizer, count, split='train'):
  """`count` simulated hosts' iterators (one process), each fed GLOBAL // count rows."""
  return [data.make_dataset(dc, tokenizer, split=split, batch_size=GLOBAL // count,
                            process_index=p, process_count=count) for p in range(count)]


def global_batches(its, n):
  return [data.assemble_global_batch([next(it) for it in its]) for _ in range(n)]


def assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b, strict=True):
    assert x.keys() == y.keys()
    for k in x:
      assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), k


def test_the_rule():
  assert [list(streams.owned(8, h, 2)) for h in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
  assert [list(streams.owned(8, h, 4)) for h in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
  assert streams.resolve(0, 16) == 8 and streams.resolve(0, 12) == 4
  assert streams.resolve(0, 2) == 2 and streams.resolve(16, 32) == 16
  assert streams.fit_to_split(8, 6) == 4 and streams.fit_to_split(8, 100) == 8
  assert streams.fit_to_split(4, 6, per_stream=2) == 2 and streams.fit_to_split(4, 1) == 1


@pytest.mark.parametrize('objective,nsp', CASES)
def test_global_batches_are_the_same_on_1_2_and_4_hosts_and_a_state_saved_on_n_resumes_on_m(
    tokenizer, objective, nsp):
  """The first 3 global batches on 2, 1 and 4 hosts are the 1-host ones; the state saved there,
  restored on 1, 2 and 2 hosts, gives the 1-host batches 4 to 6."""
  dc = config(objective, nsp)
  reference = global_batches(hosts(dc, tokenizer, 1), 6)
  # Rows [s*B/S, (s+1)*B/S) are stream s: a stream alone (host 3 of 4) gives them.
  alone = global_batches([data.make_dataset(dc, tokenizer, split='train',
                                            batch_size=GLOBAL // 4, process_index=3,
                                            process_count=4)], 6)
  assert_same([{k: v[6:] for k, v in b.items()} for b in reference], alone)
  seg = reference[0].get('segment_ids', reference[0].get('encoder_segment_ids'))
  assert (seg > 0).mean() > 0.7  # real rows, not padding that would match trivially
  for before, after in [(2, 1), (1, 2), (4, 2)]:
    its = hosts(dc, tokenizer, before)
    assert_same(global_batches(its, 3), reference[:3])
    saved = json.loads(json.dumps(checkpoint.saved_data_state([it.get_state() for it in its])))
    assert sorted(saved['streams'], key=int) == ['0', '1', '2', '3']
    assert 'process_count' not in saved and 'processes' not in saved
    resumed = hosts(dc, tokenizer, after)
    for it in resumed:
      it.set_state(checkpoint.host_data_state(saved, step=3))
    assert_same(global_batches(resumed, 3), reference[3:])


def test_stopped_prefetching_threads_end_and_each_iterator_goes_on_from_its_position(tokenizer):
  dc = config('mlm', True)
  straight, stopped = hosts(dc, tokenizer, 1)[0], hosts(dc, tokenizer, 1)[0]
  expected = global_batches([straight], 4)
  got = global_batches([stopped], 2)
  threads = [it._thread for it in (straight, stopped)]
  assert all(t.is_alive() for t in threads)
  pipeline.stop_prefetching()
  assert not any(t.is_alive() for t in threads)
  assert_same(got + global_batches([stopped], 2), expected)


def test_eval_split_smaller_than_the_streams(tokenizer):
  dc = config('clm', num_streams=8)  # validation holds 6 documents: read as 4 streams
  one, two = hosts(dc, tokenizer, 1, 'validation'), hosts(dc, tokenizer, 2, 'validation')
  assert one[0].get_state()['num_streams'] == 4
  assert_same(global_batches(one, 3), global_batches(two, 3))


def test_refusals(tokenizer):
  dc = config('clm')
  with pytest.raises(ValueError, match=r'4 data streams .* 3 hosts;.*\[1, 2, 4\].*'
                                       r'\[3, 6, 12, 24\]'):
    data.make_dataset(dc, tokenizer, split='train', batch_size=8, process_index=0,
                      process_count=3)
  with pytest.raises(ValueError, match=r'batch_size=6 .*num_streams=4 .*\[1, 2, 3, 6\]'):
    data.make_dataset(dc, tokenizer, split='train', batch_size=6)
  saved = hosts(dc, tokenizer, 2)[0].get_state()
  other = hosts(config('clm', num_streams=8), tokenizer, 1)[0]
  with pytest.raises(ValueError, match=r'saved with 4 streams .* has 8;.*num_streams=4 .*'
                                       r'\[1, 2, 4\]'):
    other.set_state(saved)
  one = hosts(dc, tokenizer, 1)[0]
  with pytest.raises(ValueError, match=r"streams \[2, 3\] .*\['0', '1'\].*\[0, 1, 2, 3\]"):
    one.set_state(saved)  # one host's state alone is not the whole data position
  old = {'version': 1, 'split': 'train', 'epoch': 0, 'doc': 5, 'offset': 0, 'batches': 2}
  with pytest.raises(ValueError, match='version 1 was saved before data streams'):
    one.set_state(old)
  per_host = checkpoint.saved_data_state([old, old])  # a checkpoint written before streams
  assert per_host == {'process_count': 2, 'processes': [old, old]}
  with pytest.raises(ValueError, match=r'step 7 .*\b2 processes.* 1\b'):
    checkpoint.host_data_state(per_host, step=7)


def test_an_nsp_evaluation_reads_every_pair_of_every_stream(tokenizer):
  """Without repeat, NSP batches ended with the host's first stream to end, and each stream's
  last incomplete batch was dropped: the pairs read depended on the batch size."""
  dc = config('mlm', nsp=True, num_streams=2)

  def pairs(batch_size):
    it = data.make_dataset(dc, tokenizer, split='train', batch_size=batch_size, repeat=False)
    return sorted(tuple(row) for b in it
                  for row, label in zip(b['targets'].tolist(), b['nsp_labels'], strict=True)
                  if label >= 0)
  small = pairs(2)
  assert len(small) > 4 and small == pairs(4) == pairs(6)
