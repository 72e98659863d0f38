"""Hugging Face state dict <-> our parameter tree, as exact numpy copies.

Each family's record (hf/bert.py, gpt2.py, t5.py) lists its `Rule`s (hf/rules.py): one HF
tensor <-> one or more of our leaves, with a pair of reshapes that are exact inverses. Import
checks every shape against the model's own (jax.eval_shape) and reports missing or unexpected
tensors by name; tied copies that HF sometimes saves twice (LM heads, T5's embed_tokens) must
equal the tensor they are tied to.
"""
import re

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util

from pretrain_jax.hf import families
from pretrain_jax.hf.rules import Rule
from pretrain_jax.models import family_of
from pretrain_jax.models.config import ModelConfig
from pretrain_jax.models.describe import abstract_variables


class MissingTensorError(KeyError, ValueError):
  """A tensor the model config.json describes is not in the checkpoint: a user error
  (ValueError, one `error:` line in the scripts) that is also a KeyError, as it always was."""

  def __str__(self):
    return str(self.args[0]) if self.args else ''


# Non-parameter buffers some checkpoints carry; they hold no weights.
IGNORED = (re.compile(r'.*embeddings\.position_ids$'), re.compile(r'.*\.attn\.(masked_)?bias$'),
           re.compile(r'.*EncDecAttention\.relative_attention_bias\.weight$'))


def normalize_names(family: str, state_dict: dict) -> dict:
  """Old spellings -> current ones: LayerNorm gamma/beta, and the family's own (`rename`:
  GPT2Model without 'transformer.')."""
  rename = families.of(family).rename
  out = {}
  for name, value in state_dict.items():
    name = re.sub(r'LayerNorm\.gamma$', 'LayerNorm.weight', name)
    name = re.sub(r'LayerNorm\.beta$', 'LayerNorm.bias', name)
    out[rename(name)] = value
  return out


def _leaf_shapes(cfg: ModelConfig) -> dict:
  params = nn.unbox(abstract_variables(cfg.replace(scan_layers=False, remat='none'))['params'])
  return {path: tuple(leaf.shape) for path, leaf in flatten(params).items()}


def hf_to_params(cfg: ModelConfig, state_dict: dict) -> dict:
  """HF tensors (name -> numpy array) -> our params (nested dicts of float32 numpy arrays).

  Raises MissingTensorError (a KeyError and a ValueError) naming a missing tensor, ValueError
  naming a tensor with the wrong shape,
  an unexpected tensor, or a tied copy that differs from its original.
  """
  record = families.of(cfg)
  sd = record.complete(cfg, normalize_names(cfg.family, state_dict))
  expected = _leaf_shapes(cfg)
  rules = record.rules(cfg)
  used = set()
  flat = {}
  for rule in rules:
    if rule.hf not in sd:
      layer = re.search(r'\.(?:layer|h|block)\.(\d+)\.', rule.hf)
      count = (f'{cfg.num_layers} encoder and {cfg.decoder_layers} decoder'
               if family_of(cfg).encoder_decoder else str(cfg.num_layers))
      hint = f' (config.json describes {count} layers; the weights hold fewer?)' if layer else ''
      raise MissingTensorError(f'the checkpoint has no tensor {rule.hf!r}, which {cfg.family} '
                               f'parameter(s) {list(rule.ours)} need{hint}')
    w = np.asarray(sd[rule.hf])
    want = _hf_shape(rule, expected)
    if tuple(w.shape) != want:
      raise ValueError(f'tensor {rule.hf!r} has shape {tuple(w.shape)}; expected {want} for '
                       f'{list(rule.ours)} of the model config.json describes')
    for path, value in zip(rule.ours, rule.to_ours(w), strict=True):
      flat[path] = np.ascontiguousarray(value, dtype=np.float32)
    used.add(rule.hf)
  for dup, original in record.tied:
    if dup in sd and dup not in used:
      if sd[dup].shape != sd[original].shape or not np.array_equal(sd[dup], sd[original]):
        raise ValueError(f'tensor {dup!r} differs from {original!r}; our {cfg.family} model '
                         'ties them, so an untied checkpoint cannot be imported')
      used.add(dup)
  unexpected = sorted(n for n in sd if n not in used and not any(p.match(n) for p in IGNORED))
  if unexpected:
    raise ValueError(f'unexpected tensors in the checkpoint (no {cfg.family} parameter takes '
                     f'them): {unexpected[:10]}{" ..." if len(unexpected) > 10 else ""}')
  missing = sorted(set(expected) - set(flat))
  if missing:  # a rule table out of step with the model: a bug here, not in the checkpoint
    raise AssertionError(f'{cfg.family} parameters left unfilled: {missing}')
  params = unflatten(flat)
  return stack_layers(cfg, params) if cfg.scan_layers else params


def params_to_hf(cfg: ModelConfig, params) -> dict:
  """Our params (either layout) -> HF tensors, name -> contiguous float32 numpy array.

  Tied copies are not written (transformers re-ties them on load).
  """
  params = unstack_layers(cfg, params) if cfg.scan_layers else params
  flat = flatten(params)
  expected = _leaf_shapes(cfg)
  for path, shape in expected.items():
    if path not in flat:
      raise KeyError(f'params have no {path!r}; expected a {cfg.family} parameter tree')
    if tuple(np.shape(flat[path])) != shape:
      raise ValueError(f'param {path!r} has shape {tuple(np.shape(flat[path]))}; expected {shape}')
  extra = sorted(set(flat) - set(expected))
  if extra:
    raise ValueError(f'params {extra[:10]} are not part of the {cfg.family} model the config '
                     'describes')
  out = {}
  for rule in families.of(cfg).rules(cfg):
    arrays = [np.asarray(flat[p], dtype=np.float32) for p in rule.ours]
    out[rule.hf] = np.ascontiguousarray(rule.to_hf(*arrays))
  return out


def _hf_shape(rule: Rule, expected: dict) -> tuple:
  """The HF shape a rule needs, from our expected shapes run through to_hf."""
  zeros = [np.zeros(expected[p], np.float32) for p in rule.ours]
  return tuple(rule.to_hf(*zeros).shape)


def flatten(tree) -> dict:
  """{'a/b/kernel': leaf} of a nested dict (FrozenDicts too)."""
  return traverse_util.flatten_dict(tree, sep='/')


def unflatten(flat: dict) -> dict:
  return traverse_util.unflatten_dict(flat, sep='/')


def _stack_parent(params, path):
  node = params
  for p in path[:-1]:
    node = node[p]
  return node


def stack_layers(cfg: ModelConfig, params: dict) -> dict:
  """`{name}_0 .. {name}_{L-1}` -> `{name}` with a leading layer axis (the nn.scan layout)."""
  params = unflatten(flatten(params))  # a copy we may edit
  for path in families.of(cfg).stacks:
    parent = _stack_parent(params, path)
    name = path[-1]
    count = len([k for k in parent if re.fullmatch(rf'{name}_\d+', k)])
    layers = [parent.pop(f'{name}_{i}') for i in range(count)]
    parent[name] = jax.tree.map(lambda *xs: np.stack(xs), *layers)
  return params


def unstack_layers(cfg: ModelConfig, params: dict) -> dict:
  """Inverse of `stack_layers`."""
  params = unflatten(flatten(params))
  for path in families.of(cfg).stacks:
    parent = _stack_parent(params, path)
    name = path[-1]
    stacked = parent.pop(name)
    count = jax.tree.leaves(stacked)[0].shape[0]
    for i in range(count):
      parent[f'{name}_{i}'] = jax.tree.map(lambda x, i=i: np.asarray(x[i]), stacked)
  return params
