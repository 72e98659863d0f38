"""make_dataset end to end on the embedded corpus: DESIGN.md keys, determinism, exact resume,
host shares, finite epochs and clear errors for bad input."""
import collections
import io
import itertools
import json

import modeling
import numpy as np
import pytest
import sentencepiece as spm
from helpers import splice

from configs import common
from pretrain_jax import data
from pretrain_jax.data import documents, sources
from pretrain_jax.data.config import DataConfig
from pretrain_jax.objectives import packing, span_corruption
from pretrain_jax.training import task

KEYS = {
    'clm': {'inputs', 'targets', 'segment_ids', 'positions', 'loss_weights'},
    'prefix_lm': {'inputs', 'targets', 'segment_ids', 'positions', 'loss_weights', 'prefix'},
    'mlm': {'inputs', 'targets', 'segment_ids', 'positions', 'token_type_ids', 'loss_weights'},
    'span_corruption': {'encoder_input_tokens', 'encoder_segment_ids', 'encoder_positions',
                        'decoder_input_tokens', 'decoder_target_tokens', 'decoder_segment_ids',
                        'decoder_positions', 'decoder_loss_weights'},
}
CASES = [('clm', False), ('mlm', False), ('mlm', True), ('span_corruption', False),
         ('prefix_lm', False)]


@pytest.fixture(scope='module')
def tokenizer(data_cache):  # (the session's data cache: tests/conftest.py)
  del data_cache
  return data.load_tokenizer(DataConfig.from_config(common.data_config('clm', 64)))


def config(objective, nsp=False, seq_len=64, **kw):
  dc = common.data_config(objective, seq_len)
  dc.nsp = nsp
  dc.update(kw)
  return DataConfig.from_config(dc)


def take(it, n):
  return [next(it) for _ in range(n)]


def assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b, strict=True):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


@pytest.mark.parametrize('objective,nsp', CASES)
def test_keys_shapes_and_dtypes(tokenizer, objective, nsp):
  it = data.make_dataset(config(objective, nsp), tokenizer, split='train', batch_size=4)
  b = next(it)
  keys = KEYS[objective] | ({'nsp_labels'} if nsp else set())
  assert set(b) == keys
  target_len = span_corruption.target_length(64)[1]
  for k, v in b.items():
    assert v.dtype == (np.float32 if 'loss_weights' in k else np.int32), k
    expected = ((4,) if k == 'nsp_labels' else (4, target_len) if k.startswith('decoder')
                else (4, 64))
    assert v.shape == expected, k
  seg = b.get('segment_ids', b.get('encoder_segment_ids'))
  assert (np.diff((seg > 0).astype(int), axis=1) <= 0).all()  # padding only at the tail
  # the share of the first batch's positions that are text (T5: encoder and decoder together,
  # the positions the train loop's tokens/s counts)
  segs = [b[k] for k in ('segment_ids', 'encoder_segment_ids', 'decoder_segment_ids') if k in b]
  assert it.real_fraction == sum(np.count_nonzero(x) for x in segs) / sum(x.size for x in segs)
  assert 0 < it.real_fraction <= 1


@pytest.mark.parametrize('objective,nsp', CASES)
def test_resume_is_exact(tokenizer, objective, nsp):
  # The validation split is a few documents, so 7 batches cross several epochs.
  dc = config(objective, nsp, num_streams=2)  # 3 documents a stream
  def make():
    return data.make_dataset(dc, tokenizer, split='validation', batch_size=4, seed=3)
  straight = take(make(), 7)
  it = make()
  take(it, 3)
  state = json.loads(json.dumps(it.get_state()))  # survives a JSON checkpoint
  resumed = make()
  resumed.set_state(state)
  assert_same(take(resumed, 4), straight[3:])
  assert_same(take(make(), 7), straight)  # same seed, same batches
  other = take(data.make_dataset(dc, tokenizer, split='validation', batch_size=4, seed=4), 7)
  assert any((x[k] != y[k]).any() for x, y in zip(straight, other, strict=True) for k in x)


def test_clm_targets_stay_in_documents(tokenizer):
  b = next(data.make_dataset(config('clm'), tokenizer, split='train', batch_size=8))
  seg, inp, tgt = b['segment_ids'], b['inputs'], b['targets']
  same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0)
  np.testing.assert_array_equal(tgt[:, :-1][same], inp[:, 1:][same])
  np.testing.assert_array_equal(b['loss_weights'], (seg > 0).astype(np.float32))
  assert (b['positions'][seg > 0] >= 0).all() and (b['positions'][:, 0] == 0).all()


def test_prefix_lm_rows_are_clm_rows_with_a_split_per_piece(tokenizer):
  clm = next(data.make_dataset(config('clm'), tokenizer, split='train', batch_size=8))
  b = next(data.make_dataset(config('prefix_lm'), tokenizer, split='train', batch_size=8))
  for k in ('inputs', 'targets', 'segment_ids', 'positions'):
    np.testing.assert_array_equal(b[k], clm[k], err_msg=k)
  seg, pos, prefix, weights = b['segment_ids'], b['positions'], b['prefix'], b['loss_weights']
  for row in range(8):
    for sid in set(seg[row].tolist()) - {0}:
      where = seg[row] == sid
      p = int(prefix[row][where].sum())
      assert p >= 1
      np.testing.assert_array_equal(prefix[row][where], pos[row][where] < p)  # a leading run
      np.testing.assert_array_equal(weights[row][where], pos[row][where] >= p - 1)
  assert not prefix[seg == 0].any() and not weights[seg == 0].any()
  assert 0 < weights.sum() < (seg > 0).sum()        # some pieces are split after their start


def test_mlm_batches(tokenizer):
  it = data.make_dataset(config('mlm', whole_word_mask=True), tokenizer, split='train',
                         batch_size=16)
  bs = take(it, 8)
  sel = np.concatenate([b['loss_weights'] for b in bs]) > 0
  tgt = np.concatenate([b['targets'] for b in bs])
  inp = np.concatenate([b['inputs'] for b in bs])
  seg = np.concatenate([b['segment_ids'] for b in bs])
  assert not tokenizer.special[tgt[sel]].any()            # never [CLS]/[SEP]/padding
  assert 0.10 < sel.sum() / (seg > 0).sum() < 0.20
  assert (inp[~sel] == tgt[~sel]).all()
  for row, s in zip(tgt, seg, strict=True):
    for k in range(1, s.max() + 1):
      piece = row[s == k]
      assert piece[0] == tokenizer.cls_id and piece[-1] == tokenizer.sep_id


def test_nsp_batches(tokenizer):
  bs = take(data.make_dataset(config('mlm', True, seq_len=48), tokenizer, split='train',
                              batch_size=16), 12)
  labels = np.concatenate([b['nsp_labels'] for b in bs])
  assert 0.3 < labels.mean() < 0.7
  for b in bs:
    assert (b['targets'][:, 0] == tokenizer.cls_id).all()
    assert ((b['targets'] == tokenizer.sep_id).sum(1) == 2).all()
    assert (b['token_type_ids'][b['segment_ids'] == 0] == 0).all()


def test_span_corruption_batches_reconstruct(tokenizer):
  b = next(data.make_dataset(config('span_corruption'), tokenizer, split='train',
                             batch_size=8))
  np.testing.assert_array_equal(b['decoder_input_tokens'], packing.shift_right_by_segment(
      b['decoder_target_tokens'], b['decoder_segment_ids']))
  first = tokenizer.sentinel_id(0)
  for row in range(8):
    for k in range(1, b['encoder_segment_ids'][row].max() + 1):
      inputs = b['encoder_input_tokens'][row][b['encoder_segment_ids'][row] == k]
      targets = b['decoder_target_tokens'][row][b['decoder_segment_ids'][row] == k]
      original = splice(inputs, targets, first_sentinel=first)
      assert original and not tokenizer.special[original].any()


def test_host_shares_and_global_batch(tokenizer):
  dc = config('clm')
  per_host = data.host_batch_size(8, 2)
  hosts = [next(data.make_dataset(dc, tokenizer, split='train', batch_size=per_host,
                                  process_index=p, process_count=2)) for p in range(2)]
  assert all(h['inputs'].shape == (4, 64) for h in hosts)
  assert not np.array_equal(hosts[0]['inputs'], hosts[1]['inputs'])
  g = data.assemble_global_batch(hosts)
  assert g['inputs'].shape == (8, 64) and (g['inputs'][4:] == hosts[1]['inputs']).all()
  with pytest.raises(ValueError, match=r'batch_size=10\b.* 4 hosts'):
    data.host_batch_size(10, 4)


def test_a_stream_reads_every_epoch_whole_and_in_order_across_its_chained_pipelines(tokenizer):
  """A small share's epochs are chained 1, 2, 4, ... to a pipeline (data/documents.py): however
  they are grouped, epoch e is text_dataset(epoch=e) in order, and a start at (epoch, doc)
  continues that sequence."""
  dc = config('clm')
  source = sources.open_source(dc)
  kw = dict(process_index=1, process_count=2, seed=3, shuffle_buffer=dc.shuffle_buffer)
  stream = documents.DocumentStream(source, 'validation', tokenizer, num_parallel_calls=1,
                                    repeat=True, stats=collections.Counter(), **kw)
  assert stream.chain >= 8
  # No autotuning thread per stream (documents._OPTIONS): it slows a small host's pipeline and
  # holds every run's end while the streams' pipelines are deleted.
  assert stream._pipeline([0], 0, 64).options().autotune.enabled is False
  expected = []
  for epoch in range(8):   # pipelines of epochs [0], [1, 2], [3, 4, 5, 6], [7, ...]
    texts = list(sources.text_dataset(source, 'validation', epoch=epoch,
                                      **kw).as_numpy_iterator())
    expected += [(epoch, doc, stream.encode([t])[0]) for doc, t in enumerate(texts)]
  assert len(expected) >= 16 and expected[1][2].size > 0
  got = list(itertools.islice(stream.documents(), len(expected)))
  assert [(e, d) for e, d, _ in got] == [(e, d) for e, d, _ in expected]
  assert all(np.array_equal(g, x) for (_, _, g), (_, _, x) in zip(got, expected, strict=True))
  at = [(e, d) for e, d, _ in expected].index((2, 1))
  resumed = list(itertools.islice(stream.documents(2, 1), len(expected) - at))
  assert [(e, d) for e, d, _ in resumed] == [(e, d) for e, d, _ in expected[at:]]
  assert all(np.array_equal(g, x)
             for (_, _, g), (_, _, x) in zip(resumed, expected[at:], strict=True))


def test_one_epoch_ends(tokenizer):
  it = data.make_dataset(config('clm'), tokenizer, split='validation', batch_size=4,
                         repeat=False)
  bs = list(it)
  assert len(bs) >= 2 and it.exhausted
  assert all(s['exhausted'] for s in it.get_state()['streams'].values())
  texts = [t.decode() for t in sources.text_dataset(
      sources.open_source(config('clm')), 'validation').as_numpy_iterator()]
  real = sum(int((b['segment_ids'] > 0).sum()) for b in bs)
  assert real == sum(len(tokenizer.encode(t)) for t in texts)  # every token exactly once
  for row in range(4):  # one row per stream: full rows, one partial, then all padding
    fill = [int((b['segment_ids'][row] > 0).sum()) for b in bs]
    full = next((i for i, f in enumerate(fill) if f < 64), len(fill))
    assert not any(fill[full + 1:]), fill
  with pytest.raises(StopIteration):
    next(it)


def test_bad_lengths_and_specials(tokenizer, tmp_path):
  with pytest.raises(ValueError, match=r'seq_len=256\b.*max_len=128\b'):
    data.make_dataset(config('clm', seq_len=256), tokenizer, split='train', batch_size=2,
                      model_max_len=128)
  with pytest.raises(ValueError, match='seq_len=4 is too short for mlm with NSP'):
    data.make_dataset(config('mlm', True, seq_len=4), tokenizer, split='train', batch_size=2)
  for p in (0.0, 1.5):   # 0 trained on nothing at loss 0.0000
    with pytest.raises(ValueError, match=rf'^config.data.mlm_probability={p};'):
      data.make_dataset(config('mlm', mlm_probability=p), tokenizer, split='train', batch_size=2)
  with pytest.raises(ValueError, match=r'114 noise spans.* 100\b'):
    data.make_dataset(config('span_corruption', seq_len=2048), tokenizer, split='train',
                      batch_size=2)
  with pytest.raises(ValueError, match="objective='bert'"):
    data.make_dataset(config('bert'), tokenizer, split='train', batch_size=2)
  with pytest.raises(ValueError, match='batch_size=0'):
    data.make_dataset(config('clm'), tokenizer, split='train', batch_size=0)
  no_mask = data.Tokenizer(_model_without_specials(tmp_path))
  with pytest.raises(ValueError, match=r'no \[MASK\] piece'):
    data.make_dataset(config('mlm'), no_mask, split='train', batch_size=2)
  it = data.make_dataset(config('clm', num_streams=2), tokenizer, split='train', batch_size=2)
  state = it.get_state()
  other = data.make_dataset(config('clm', num_streams=2), tokenizer, split='train', batch_size=4)
  with pytest.raises(ValueError, match=r'stream_rows=1\b.*stream_rows=2\b'):
    other.set_state(state)


def _model_without_specials(tmp_path):
  out = io.BytesIO()
  lines = ['the quick brown fox jumps over the lazy dog'] * 50
  spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, vocab_size=30,
                                 pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
  (tmp_path / 'plain.model').write_bytes(out.getvalue())
  return str(tmp_path / 'plain.model')


def test_documents_that_tokenize_to_nothing(tokenizer, tmp_path):
  docs = ['\u200b\u200b'] * 5 + ['a real document with words'] * 3
  (tmp_path / 'd.jsonl').write_text(''.join(json.dumps({'text': d}) + '\n' for d in docs))
  dc = config('clm', files=str(tmp_path / 'd.jsonl'), validation_fraction=0.0, num_streams=1)
  it = data.make_dataset(dc, tokenizer, split='train', batch_size=2, repeat=False)
  assert len(list(it)) == 1  # one epoch read to its end, so the counts are final
  assert it.stats['skipped_empty'] == 5 and it.stats['documents'] == 3
  (tmp_path / 'e.jsonl').write_text(''.join(json.dumps({'text': d}) + '\n' for d in docs[:5]))
  dc = dc.replace(files=str(tmp_path / 'e.jsonl'))
  it = data.make_dataset(dc, tokenizer, split='train', batch_size=2)  # repeat=True: no hang
  with pytest.raises(ValueError, match='no document with any token: skipped 5'):
    next(it)


class MinimalTokenizer:
  """Only the attributes the Hugging Face adapters (pretrain_jax.hf) have: no id tables."""

  def __init__(self, t):
    self._t = t
    self.vocab_size, self.pad_id, self.eos_id = t.vocab_size, t.pad_id, t.eos_id
    self.cls_id, self.sep_id, self.mask_id = t.cls_id, t.sep_id, t.mask_id
    self.sentinel_id, self.encode, self.decode = t.sentinel_id, t.encode, t.decode


@pytest.mark.parametrize('objective', ['mlm', 'span_corruption'])
def test_any_tokenizer_with_the_id_attributes_works(tokenizer, objective):
  dc = config(objective)
  ours = next(data.make_dataset(dc, tokenizer, split='train', batch_size=4))
  theirs = next(data.make_dataset(dc, MinimalTokenizer(tokenizer), split='train', batch_size=4))
  for k in ours:  # same documents and packing; masking may draw other random ids
    if k not in ('inputs',):
      np.testing.assert_array_equal(ours[k], theirs[k], err_msg=k)
  if objective == 'mlm':
    assert not tokenizer.special[theirs['targets'][theirs['loss_weights'] > 0]].any()
    dc = dc.replace(whole_word_mask=True)
    with pytest.raises(ValueError, match='whole_word_mask needs word boundaries'):
      data.make_dataset(dc, MinimalTokenizer(tokenizer), split='train', batch_size=4)


def test_a_position_in_changed_files_is_refused(tokenizer, tmp_path):
  """The same data.files glob over other files: the saved position would continue in other
  documents (the split's count of documents and their bytes are part of the position)."""
  def write(name, n, words='with a few words in it'):
    (tmp_path / name).write_text(''.join(
        json.dumps({'text': f'{name} document {i} {words}'}) + '\n' for i in range(n)))
  write('a.jsonl', 40)
  dc = config('clm', files=str(tmp_path / '*.jsonl'), validation_fraction=0.0)
  it = data.make_dataset(dc, tokenizer, split='train', batch_size=2)
  take(it, 2)
  state = it.get_state()
  assert state['documents'] == 40 and state['bytes'] > 40 * 30
  older = {k: v for k, v in state.items() if k not in ('documents', 'bytes')}  # saved before
  data.make_dataset(dc, tokenizer, split='train', batch_size=2).set_state(older)
  write('b.jsonl', 5)
  grown = data.make_dataset(dc, tokenizer, split='train', batch_size=2)
  with pytest.raises(ValueError, match="split 'train' had 40 documents .* has 45 documents"):
    grown.set_state(state)
  (tmp_path / 'b.jsonl').unlink()
  write('a.jsonl', 40, words='rewritten with other words, as a re-filtered shard would be')
  rewritten = data.make_dataset(dc, tokenizer, split='train', batch_size=2)
  with pytest.raises(ValueError, match=r'40 documents .*[0-9,]+ bytes'):
    rewritten.set_state(state)


def test_a_sentinel_spelled_in_a_document_is_not_the_objectives_sentinel(tokenizer, tmp_path):
  """'<extra_id_0>' in a document is a piece of a tokenizer trained here (and of T5's Hugging
  Face tokenizer); kept, span corruption's inputs held two <extra_id_0> and the target could
  not say which span it fills. Pre-training text maps it to <unk>, or drops it where the
  tokenizer has none or its <unk> is itself special (seqio spells it out as plain text)."""
  doc = 'T5 writes a masked span as <extra_id_0> in its inputs.'
  raw = tokenizer.encode_batch([doc])[0]
  sentinel = tokenizer.sentinel_id(0)
  assert raw.count(sentinel) == 1
  (tmp_path / 'd.jsonl').write_text(json.dumps({'text': doc}) + '\n')
  dc = config('clm', files=str(tmp_path / 'd.jsonl'), validation_fraction=0.0, num_streams=1)
  unk_is_eos = MinimalTokenizer(tokenizer)   # GPT-2 folders saved by transformers: unk = EOS
  unk_is_eos.unk_id = tokenizer.eos_id
  for tok, expected in [(tokenizer, [tokenizer.unk_id if i == sentinel else i for i in raw]),
                        (MinimalTokenizer(tokenizer), [i for i in raw if i != sentinel]),
                        (unk_is_eos, [i for i in raw if i != sentinel])]:
    b = next(data.make_dataset(dc, tok, split='train', batch_size=1, repeat=False))
    assert list(b['inputs'][0][b['segment_ids'][0] == 1]) == expected
  dc = config('span_corruption', files=str(tmp_path / 'd.jsonl'), validation_fraction=0.0,
              num_streams=1)
  b = next(data.make_dataset(dc, tokenizer, split='train', batch_size=1, repeat=False))
  assert (b['encoder_input_tokens'][0] == sentinel).sum() == 1    # the one span corruption put
  assert (b['decoder_target_tokens'][0] == sentinel).sum() == 1


def test_span_masking_batches_and_the_loss_only_on_their_spans(tokenizer):
  """data.masking=span: spans inside one document of each packed row, never [CLS] / [SEP] /
  padding, ~15% of the tokens; the MLM loss is the cross-entropy of those positions alone."""
  bs = take(data.make_dataset(config('mlm', masking='span'), tokenizer, split='train',
                              batch_size=16), 4)
  sel = np.concatenate([b['loss_weights'] for b in bs]) > 0
  tgt, inp, seg = (np.concatenate([b[k] for b in bs]) for k in ('targets', 'inputs',
                                                                  'segment_ids'))
  assert not tokenizer.special[tgt[sel]].any() and (inp[~sel] == tgt[~sel]).all()
  assert 0.13 < sel.sum() / (~tokenizer.special[tgt] & (seg > 0)).sum() < 0.17
  runs = 0
  for row_sel, row_seg in zip(sel, seg, strict=True):
    edges = np.flatnonzero(np.diff(np.concatenate([[0], row_sel.astype(int), [0]])))
    for start, end in zip(edges[::2], edges[1::2], strict=True):   # each run of selected
      assert len(set(row_seg[start:end])) == 1, (start, end)       # ... in one document
      runs += 1
  assert sel.sum() / runs > 2.0          # spans, not single tokens (mean 3.8, runs may touch)
  with pytest.raises(ValueError, match="config.data.masking='word'; expected one of"):
    config('mlm', masking='word')
  with pytest.raises(ValueError, match='masking=span needs objective mlm'):
    config('clm', masking='span')
  # The loss: a tiny BERT's summed cross-entropy over the selected positions, nothing else.
  batch = {k: v for k, v in bs[0].items()}
  cfg = modeling.tiny('bert', vocab_size=tokenizer.vocab_size, max_len=64)
  params = modeling.init(cfg, length=64)
  model = modeling.build(cfg)
  sums = task.loss_sums(model, params, batch)
  logits = np.asarray(modeling.forward(cfg, params, batch['inputs'],
                                       token_type_ids=batch['token_type_ids'],
                                       segment_ids=batch['segment_ids'],
                                       positions=batch['positions']), np.float64)
  shifted = logits - logits.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  picked = np.take_along_axis(log_probs, batch['targets'][..., None], -1)[..., 0]
  weights = batch['loss_weights']
  np.testing.assert_allclose(float(sums['lm']), -(picked * weights).sum(), rtol=1e-4)
  assert float(sums['lm_weight']) == weights.sum() == (weights > 0).sum()
