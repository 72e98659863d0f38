"""Documents -> packed per-host batches, one generator per objective.

Each generator takes the document stream (epoch, doc, tokens) and the token offset to start at
in the first document, and yields (arrays, position) where position = (epoch, doc, offset) is
the first token NOT yet placed in any yielded batch (None once the stream is exhausted). That
position is all a resumed run needs: the stream restarts at (epoch, doc) and the generator at
`offset`, and every random choice is seeded by where it happens (document or batch index), never
by how much was consumed before, so resumed batches are bit-identical.

Document splitting (documents longer than the room left in a row):
- CLM and BERT-without-NSP: a document is cut at the row end and continues in the next row,
  its positions restarting at 0; BERT wraps every piece as [CLS] piece [SEP].
- T5: a document is cut into chunks of `raw_len` tokens; each chunk is span-corrupted and packed
  whole (an (inputs, targets) pair never straddles rows) into the first row of the batch with
  room (first-fit, like seqio's packing window); the batch is done when one does not fit.
- NSP: one [CLS] A [SEP] B [SEP] pair per row (objectives/nsp.py).
"""
import numpy as np

from pretrain_jax.objectives import clm, mlm, nsp, packing, span_corruption

SALT_MLM, SALT_NSP, SALT_SPANS, SALT_PREFIX = 1, 2, 3, 4


def rng_at(*parts) -> np.random.Generator:
  """A generator seeded by a tuple of non-negative ints (where the randomness is used)."""
  return np.random.default_rng([int(p) for p in parts])


def _emitter(batch_size, lengths, features):
  """A factory of empty BatchPackers of this shape."""
  return lambda: packing.BatchPacker(batch_size, lengths, features)


def split_documents(docs, offset: int, *, batch_size: int, seq_len: int, pack: bool, make,
                    overhead: int):
  """Shared loop of CLM and packed BERT: documents cut at row ends.

  `make.prepare(tokens)` gives per-document arrays, `make(arrays, o, n)` the example for the
  document's tokens [o, o+n); `overhead` tokens ([CLS], [SEP]) come with every piece.
  """
  new = _emitter(batch_size, {'': seq_len}, make.features)
  packer, first = new(), True
  for epoch, doc, tokens in docs:
    arrays = make.prepare(tokens)
    length = len(arrays[0])
    o = offset if first else 0
    first = False
    while o < length:
      if packer.room() < overhead + 1 or (not pack and packer.segment):
        if not packer.next_row():
          yield packer.arrays, (epoch, doc, o)
          packer = new()
      n = min(packer.room() - overhead, length - o)
      packer.add(make(arrays, o, n))
      o += n
  if not packer.empty:
    yield packer.arrays, None


class _ClmPieces:
  features = {'inputs': '', 'targets': ''}

  def __init__(self, eos_id):
    self.eos_id = eos_id

  def prepare(self, tokens):
    return clm.clm_pairs(tokens, self.eos_id)

  def __call__(self, arrays, o, n):
    return {'inputs': arrays[0][o:o + n], 'targets': arrays[1][o:o + n]}


class _BertPieces:
  features = {'inputs': ''}

  def __init__(self, cls_id, sep_id):
    self.cls, self.sep = cls_id, sep_id

  def prepare(self, tokens):
    return (tokens,)

  def __call__(self, arrays, o, n):
    return {'inputs': mlm.wrap_cls_sep(arrays[0][o:o + n], self.cls, self.sep)}


def clm_batches(docs, offset, *, batch_size, seq_len, pack, eos_id):
  """Packed CLM batches: inputs, targets, segment_ids, positions (loss weights added later)."""
  make = _ClmPieces(eos_id)
  return split_documents(docs, offset, batch_size=batch_size, seq_len=seq_len, pack=pack,
                         make=make, overhead=0)


def bert_batches(docs, offset, *, batch_size, seq_len, pack, cls_id, sep_id):
  """Packed BERT rows of [CLS] piece [SEP] (MLM corruption is applied per batch later)."""
  make = _BertPieces(cls_id, sep_id)
  return split_documents(docs, offset, batch_size=batch_size, seq_len=seq_len, pack=pack,
                         make=make, overhead=2)


def span_corruption_batches(docs, offset, *, batch_size, seq_len, pack, seed, salt,
                            first_sentinel, eos_id, noise_density, mean_noise_span_length):
  """Packed T5 batches; chunk randomness seeded by (seed, salt, epoch, doc, chunk offset)."""
  raw_len, target_len = span_corruption.target_length(seq_len, noise_density,
                                                      mean_noise_span_length)
  features = {'encoder_input_tokens': 'encoder', 'decoder_target_tokens': 'decoder'}
  new = _emitter(batch_size, {'encoder': seq_len, 'decoder': target_len}, features)
  packer, first = new(), True
  for epoch, doc, tokens in docs:
    o = offset - offset % raw_len if first else 0
    first = False
    for start in range(o, len(tokens), raw_len):
      rng = rng_at(seed, *salt, SALT_SPANS, epoch, doc, start)
      inputs, targets = span_corruption.span_corruption(
          tokens[start:start + raw_len], rng, first_sentinel=first_sentinel, eos_id=eos_id,
          noise_density=noise_density, mean_noise_span_length=mean_noise_span_length)
      example = {'encoder_input_tokens': inputs, 'decoder_target_tokens': targets}
      row = packer.first_fit(example) if pack else packer.empty_row()
      if row is None:  # no row has room: the batch is done, this example opens the next one
        yield span_corruption.with_decoder_inputs(packer.arrays), (epoch, doc, start)
        packer = new()
        row = 0
      packer.add(example, row)
  if not packer.empty:
    yield span_corruption.with_decoder_inputs(packer.arrays), None


def nsp_batches(docs, offset, *, batch_size, seq_len, seed, salt, cls_id, sep_id,
                first_document):
  """One [CLS] A [SEP] B [SEP] per row; NotNext partners come from the next document.

  The final incomplete batch of a finite stream is kept, its empty rows labelled -1 (no
  example: the NSP loss and accuracy count rows with a label >= 0), so evaluation reads the
  whole split whatever the batch size.
  """
  features = {'inputs': '', 'token_type_ids': ''}
  new = _emitter(batch_size, {'': seq_len}, features)
  packer, labels, first = new(), [], True
  epoch_of_last_pair, current_epoch, epoch_start = None, None, None
  for epoch, doc, tokens, partner in nsp.with_partners(docs, first_document):
    if epoch != current_epoch:
      if current_epoch is not None and epoch_start == 0 and epoch_of_last_pair != current_epoch:
        raise ValueError(f'epoch {current_epoch} gave no NSP pair: every document has fewer '
                         'than 2 tokens')
      current_epoch, epoch_start = epoch, doc
    rng = rng_at(seed, *salt, SALT_NSP, epoch, doc)
    pairs = nsp.nsp_pairs(tokens, partner, rng, seq_len - 3)
    start_at = offset if first else 0
    first = False
    for start, a, b, label in pairs:
      epoch_of_last_pair = epoch
      if start < start_at:
        continue
      if packer.segment and not packer.next_row():
        yield dict(packer.arrays, nsp_labels=np.array(labels, np.int32)), (epoch, doc, start)
        packer, labels = new(), []
      packer.add(nsp.nsp_row(a, b, cls_id=cls_id, sep_id=sep_id))
      labels.append(label)
  if labels:
    labels += [-1] * (batch_size - len(labels))
    yield dict(packer.arrays, nsp_labels=np.array(labels, np.int32)), None
