"""A sentencepiece model (the project's tokenizer) as Hugging Face `tokenizers` files.

BERT and GPT-2 runs trained with the project's sentencepiece tokenizer export it as a
tokenizer.json (a `tokenizers` Unigram model: sentencepiece's pieces and scores, its
normalizer's precompiled charsmap, the Metaspace word boundary) plus a tokenizer_config.json
naming the special tokens, so `transformers.PreTrainedTokenizerFast(tokenizer_file=...)` and
hf/tokenizers.py give the project's ids. Unigram and char models convert with the same pieces,
scores and normalization (char pieces are single characters, so any segmentation is the same).
One difference remains for unigram models: where two segmentations score exactly the same,
`tokenizers`' Viterbi breaks the tie differently from sentencepiece's (a run of 27 '=' as
16 + 11 instead of 11 + 16 pieces; 1 of 66 corpus texts in a check), so such a text gets other
ids than in pre-training (both are valid segmentations of the same score). A BPE model would
need its merges rebuilt and is not converted.
"""
import json

import tokenizers
from sentencepiece import sentencepiece_model_pb2 as sp_model
from tokenizers import decoders, normalizers, pre_tokenizers, processors

from pretrain_jax import paths

UNIGRAM, CHAR = 1, 4  # sentencepiece TrainerSpec.ModelType
NEVER = -1e9  # score of control and unused pieces: sentencepiece never produces them from text


def tokenizer_files(model_path: str, roles: dict, bert_template: bool = False) -> dict:
  """{file name: bytes} of the HF tokenizer equal to the sentencepiece model at `model_path`;
  empty when it cannot be converted. `roles` maps tokenizer_config keys ('pad_token', ...) to
  the piece that plays them; a role whose piece the model lacks is left out. `bert_template`:
  encoding with special tokens gives BERT's [CLS] A [SEP] (B [SEP]) and token types 0 / 1, as
  the project's BERT inputs are laid out."""
  m = sp_model.ModelProto()
  m.ParseFromString(paths.resolve(model_path).read_bytes())
  if m.trainer_spec.model_type not in (UNIGRAM, CHAR) or m.trainer_spec.byte_fallback:
    return {}
  kinds = sp_model.ModelProto.SentencePiece
  vocab = [(p.piece, NEVER if p.type in (kinds.CONTROL, kinds.UNUSED) else p.score)
           for p in m.pieces]
  index = {p.piece: i for i, p in enumerate(m.pieces)}
  tok = tokenizers.Tokenizer(tokenizers.models.Unigram(vocab, m.trainer_spec.unk_id, False))
  spec = m.normalizer_spec
  steps = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
  if spec.remove_extra_whitespaces:
    steps += [normalizers.Strip(), normalizers.Replace(tokenizers.Regex(' {2,}'), ' ')]
  tok.normalizer = normalizers.Sequence(steps)
  scheme = 'always' if spec.add_dummy_prefix else 'never'
  tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement='▁', prepend_scheme=scheme)
  tok.decoder = decoders.Metaspace(replacement='▁', prepend_scheme=scheme)
  roles = {k: v for k, v in roles.items() if v in index}
  tok.add_special_tokens([tokenizers.AddedToken(v, special=True, normalized=False)
                          for v in dict.fromkeys(roles.values())])
  if bert_template:
    cls, sep = roles['cls_token'], roles['sep_token']
    tok.post_processor = processors.TemplateProcessing(
        single=f'{cls}:0 $A:0 {sep}:0', pair=f'{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1',
        special_tokens=[(cls, index[cls]), (sep, index[sep])])
  config = dict(roles, tokenizer_class='PreTrainedTokenizerFast',
                model_max_length=int(1e30))
  if bert_template:
    config['model_input_names'] = ['input_ids', 'token_type_ids', 'attention_mask']
  return {'tokenizer.json': tok.to_str().encode(),
          'tokenizer_config.json': json.dumps(config, indent=2, sort_keys=True).encode()}
