"""`load_pretrained(path)`: any checkpoint as one object with a Hugging Face-style call.

  model = pretrain_jax.load_pretrained('runs/tiny/gpt')          # a training workdir (latest)
  model = pretrain_jax.load_pretrained('runs/tiny/gpt/checkpoints/300')  # one checkpoint
  model = pretrain_jax.load_pretrained('bert-base-uncased/')     # a Hugging Face directory
  logits = model(input_ids, attention_mask=mask)                 # (B, T, V)

`attention_mask` (1 = real token, 0 = padding) becomes the models' segment ids; positions
count real tokens only, so left- and right-padded rows both work.
"""
import dataclasses
import functools
import os
from typing import Any, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from pretrain_jax.models import ModelConfig, build


class BertOutput(NamedTuple):
  logits: jax.Array                 # (B, T, V) masked-LM logits
  nsp_logits: Optional[jax.Array]   # (B, 2) next-sentence logits (0 = IsNext), if trained


def _segments_and_positions(input_ids, attention_mask):
  mask = (jnp.ones_like(input_ids) if attention_mask is None
          else jnp.asarray(attention_mask)).astype(jnp.int32)
  positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
  return mask, positions


@dataclasses.dataclass
class Pretrained:
  """A loaded model: `.config` (ml_collections), `.model_config`, `.params`, `.tokenizer`."""
  config: ml_collections.ConfigDict
  model_config: ModelConfig
  params: Any
  tokenizer: Any
  step: Optional[int] = None

  @property
  def family(self) -> str:
    return self.model_config.family

  @functools.cached_property
  def _apply(self):
    model = build(self.model_config.replace(deterministic=True, decode=False))
    return jax.jit(lambda params, args, kwargs: model.apply({'params': params}, *args, **kwargs))

  def __call__(self, input_ids, decoder_input_ids=None, *, attention_mask=None,
               token_type_ids=None, decoder_attention_mask=None):
    """GPT: logits (B, T, V). BERT: BertOutput(logits, nsp_logits). T5: logits (B, T_dec, V)."""
    input_ids = jnp.asarray(input_ids, jnp.int32)
    if input_ids.ndim != 2:
      raise ValueError(f'input_ids of shape {input_ids.shape}; expected (batch, length)')
    seg, pos = _segments_and_positions(input_ids, attention_mask)
    if self.family == 't5':
      if decoder_input_ids is None:
        raise ValueError('T5 needs decoder_input_ids (targets shifted right, starting with 0)')
      decoder_input_ids = jnp.asarray(decoder_input_ids, jnp.int32)
      dseg, dpos = _segments_and_positions(decoder_input_ids, decoder_attention_mask)
      return self._apply(self.params, (input_ids, decoder_input_ids), dict(
          encoder_segment_ids=seg, decoder_segment_ids=dseg, encoder_positions=pos,
          decoder_positions=dpos))
    if decoder_input_ids is not None:
      raise ValueError(f'decoder_input_ids given to a {self.family} model; only T5 takes them')
    if self.family == 'bert':
      types = jnp.zeros_like(input_ids) if token_type_ids is None else jnp.asarray(
          token_type_ids, jnp.int32)
      mlm, nsp = self._apply(self.params, (input_ids,),
                             dict(token_type_ids=types, segment_ids=seg, positions=pos))
      return BertOutput(mlm, nsp)
    return self._apply(self.params, (input_ids,), dict(segment_ids=seg, positions=pos))


def _split_checkpoint_path(path: str):
  """'W/checkpoints/300' -> (W, 300); a workdir -> (W, None)."""
  path = os.path.abspath(path.rstrip('/'))
  parent, name = os.path.split(path)
  if name.isdigit() and os.path.basename(parent) == 'checkpoints':
    return os.path.dirname(parent), int(name)
  return path, None


def load_pretrained(path: str, step: Optional[int] = None, **model_overrides) -> Pretrained:
  """Load a training workdir (latest or `step`), one of its checkpoints, or a HF directory.

  `model_overrides` are ModelConfig fields (e.g. dtype=jnp.bfloat16, attention_impl='xla').
  """
  from pretrain_jax import hf  # pylint: disable=g-import-not-at-top
  if not os.path.isdir(path):
    raise FileNotFoundError(f'{path!r} is not a directory; expected a training workdir, a '
                            'checkpoint directory or a Hugging Face model directory')
  if hf.is_hf_dir(path):
    cfg, params, tokenizer = hf.load_hf(path, **model_overrides)
    config = ml_collections.ConfigDict({'model': cfg.to_dict()})
    return Pretrained(config, cfg, jax.tree.map(jnp.asarray, params), tokenizer)
  from pretrain_jax import data  # pylint: disable=g-import-not-at-top
  from pretrain_jax.training import checkpoint  # pylint: disable=g-import-not-at-top
  workdir, path_step = _split_checkpoint_path(path)
  config, params, step = checkpoint.restore_params(workdir, step if step is not None
                                                   else path_step)
  cfg = ModelConfig.from_config(config.model).replace(**model_overrides)
  if os.path.isdir(config.data.tokenizer or ''):  # an imported HF tokenizer (WordPiece / BPE)
    tokenizer = hf.load_tokenizer(config.data.tokenizer, cfg.family)
  else:
    tokenizer = data.load_tokenizer(config.data)
  return Pretrained(config, cfg, nn.unbox(params), tokenizer, step)

