"""Hugging Face state dict <-> our parameter tree, as exact numpy copies.

Each family is a list of `Rule`s: one HF tensor <-> one or more of our leaves, with a pair of
reshapes that are exact inverses (transposes, reshapes, splits: no arithmetic). Import checks
every shape against the model's own (jax.eval_shape) and reports missing or unexpected tensors
by name; tied copies that HF sometimes saves twice (LM heads, T5's embed_tokens) must equal the
tensor they are tied to.

Layouts: torch Linear weight is (out, in), our kernels (in, out); attention kernels are
(E, N, H) for q/k/v and (N, H, E) for the output; GPT-2's Conv1D is already (in, out) and its
fused c_attn (E, 3E) is q|k|v along the output axis.
"""
import dataclasses
import re
from typing import Callable, Sequence

import flax.linen as nn
import jax
import numpy as np

from pretrain_jax.models.config import ModelConfig
from pretrain_jax.models.describe import abstract_variables

# Non-parameter buffers some checkpoints carry; they hold no weights.
IGNORED = (re.compile(r'.*embeddings\.position_ids$'), re.compile(r'.*\.attn\.(masked_)?bias$'),
           re.compile(r'.*EncDecAttention\.relative_attention_bias\.weight$'))
STACKS = {'bert': (('layer',),), 'gpt': (('h',),),
          't5': (('encoder', 'layers'), ('decoder', 'layers'))}


@dataclasses.dataclass(frozen=True)
class Rule:
  hf: str                                 # HF tensor name
  ours: Sequence[str]                     # our leaf paths, 'a/b/kernel'
  to_ours: Callable = None                # hf array -> tuple of our arrays
  to_hf: Callable = None                  # our arrays -> hf array


def copy(hf, ours):
  return Rule(hf, (ours,), lambda w: (w,), lambda w: w)


def linear(hf_prefix, ours, bias=True):
  """torch Linear (out, in) -> DenseGeneral kernel (in, out) [+ bias]."""
  rules = [Rule(hf_prefix + '.weight', (ours + '/kernel',), lambda w: (w.T,), lambda k: k.T)]
  if bias:
    rules.append(copy(hf_prefix + '.bias', ours + '/bias'))
  return rules


def heads_in(cfg, hf_prefix, ours, bias=True):
  """Linear (N*H, E) -> (E, N, H); bias (N*H,) -> (N, H)."""
  n, h = cfg.num_heads, cfg.head_dim
  rules = [Rule(hf_prefix + '.weight', (ours + '/kernel',),
                lambda w: (w.T.reshape(w.shape[1], n, h),), lambda k: k.reshape(k.shape[0], -1).T)]
  if bias:
    rules.append(Rule(hf_prefix + '.bias', (ours + '/bias',), lambda b: (b.reshape(n, h),),
                      lambda b: b.reshape(-1)))
  return rules


def heads_out(cfg, hf_prefix, ours, bias=True):
  """Linear (E, N*H) -> (N, H, E)."""
  n, h = cfg.num_heads, cfg.head_dim
  rules = [Rule(hf_prefix + '.weight', (ours + '/kernel',),
                lambda w: (w.T.reshape(n, h, w.shape[0]),), lambda k: k.reshape(n * h, -1).T)]
  if bias:
    rules.append(copy(hf_prefix + '.bias', ours + '/bias'))
  return rules


def norm(hf_prefix, ours, bias=True):
  rules = [copy(hf_prefix + '.weight', ours + '/scale')]
  if bias:
    rules.append(copy(hf_prefix + '.bias', ours + '/bias'))
  return rules


def bert_rules(cfg: ModelConfig):
  e = 'bert.embeddings.'
  rules = [copy(e + 'word_embeddings.weight', 'word_embeddings/embedding'),
           copy(e + 'position_embeddings.weight', 'position_embeddings/embedding'),
           copy(e + 'token_type_embeddings.weight', 'token_type_embeddings/embedding'),
           *norm(e + 'LayerNorm', 'embeddings_norm')]
  for i in range(cfg.num_layers):
    hf, ours = f'bert.encoder.layer.{i}.', f'layer_{i}/'
    for name in ('query', 'key', 'value'):
      rules += heads_in(cfg, hf + 'attention.self.' + name, ours + 'attention/' + name)
    rules += heads_out(cfg, hf + 'attention.output.dense', ours + 'attention/out')
    rules += norm(hf + 'attention.output.LayerNorm', ours + 'attention_norm')
    rules += linear(hf + 'intermediate.dense', ours + 'mlp/wi')
    rules += linear(hf + 'output.dense', ours + 'mlp/wo')
    rules += norm(hf + 'output.LayerNorm', ours + 'output_norm')
  rules += linear('cls.predictions.transform.dense', 'mlm_transform/dense')
  rules += norm('cls.predictions.transform.LayerNorm', 'mlm_transform/norm')
  rules.append(copy('cls.predictions.bias', 'mlm_bias'))
  if cfg.nsp:
    rules += linear('bert.pooler.dense', 'pooler') + linear('cls.seq_relationship', 'nsp')
  return rules


def gpt_rules(cfg: ModelConfig):
  n, h = cfg.num_heads, cfg.head_dim
  rules = [copy('transformer.wte.weight', 'wte/embedding'),
           copy('transformer.wpe.weight', 'wpe/embedding'), *norm('transformer.ln_f', 'ln_f')]
  qkv = tuple(f'attn/{name}' for name in ('query', 'key', 'value'))
  for i in range(cfg.num_layers):
    hf, ours = f'transformer.h.{i}.', f'h_{i}/'
    rules += norm(hf + 'ln_1', ours + 'ln_1') + norm(hf + 'ln_2', ours + 'ln_2')
    rules.append(Rule(hf + 'attn.c_attn.weight', tuple(ours + p + '/kernel' for p in qkv),
                      lambda w: tuple(p.reshape(w.shape[0], n, h) for p in np.split(w, 3, 1)),
                      lambda *ks: np.concatenate([k.reshape(k.shape[0], -1) for k in ks], 1)))
    rules.append(Rule(hf + 'attn.c_attn.bias', tuple(ours + p + '/bias' for p in qkv),
                      lambda b: tuple(p.reshape(n, h) for p in np.split(b, 3)),
                      lambda *bs: np.concatenate([b.reshape(-1) for b in bs])))
    rules.append(Rule(hf + 'attn.c_proj.weight', (ours + 'attn/out/kernel',),
                      lambda w: (w.reshape(n, h, w.shape[1]),), lambda k: k.reshape(n * h, -1)))
    rules.append(copy(hf + 'attn.c_proj.bias', ours + 'attn/out/bias'))
    for conv, dense in (('c_fc', 'wi'), ('c_proj', 'wo')):  # Conv1D is already (in, out)
      rules += [copy(f'{hf}mlp.{conv}.weight', f'{ours}mlp/{dense}/kernel'),
                copy(f'{hf}mlp.{conv}.bias', f'{ours}mlp/{dense}/bias')]
  return rules


def _t5_mlp(cfg, hf, ours):
  wis = ('wi_0', 'wi_1') if cfg.activation.startswith('gated') else ('wi',)
  rules = []
  for name in wis + ('wo',):
    rules += linear(f'{hf}DenseReluDense.{name}', f'{ours}mlp/{name}', bias=False)
  return rules


def _t5_attention(cfg, hf, ours):
  rules = []
  for hf_name, name in (('q', 'query'), ('k', 'key'), ('v', 'value')):
    rules += heads_in(cfg, f'{hf}.{hf_name}', f'{ours}/{name}', bias=False)
  return rules + heads_out(cfg, f'{hf}.o', f'{ours}/out', bias=False)


def t5_rules(cfg: ModelConfig):
  rules = [copy('shared.weight', 'shared/embedding')]
  for stack, num in (('encoder', cfg.num_layers), ('decoder', cfg.decoder_layers)):
    rules.append(copy(f'{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight',
                      f'{stack}/relpos_bias/rel_embedding'))
    rules += norm(f'{stack}.final_layer_norm', f'{stack}/final_norm', bias=False)
    for i in range(num):
      hf, ours = f'{stack}.block.{i}.layer.', f'{stack}/layers_{i}/'
      if stack == 'encoder':
        rules += _t5_attention(cfg, hf + '0.SelfAttention', ours + 'attention')
        rules += norm(hf + '0.layer_norm', ours + 'pre_attention_norm', bias=False)
        rules += _t5_mlp(cfg, hf + '1.', ours)
        rules += norm(hf + '1.layer_norm', ours + 'pre_mlp_norm', bias=False)
      else:
        rules += _t5_attention(cfg, hf + '0.SelfAttention', ours + 'self_attention')
        rules += norm(hf + '0.layer_norm', ours + 'pre_self_attention_norm', bias=False)
        rules += _t5_attention(cfg, hf + '1.EncDecAttention', ours + 'encoder_decoder_attention')
        rules += norm(hf + '1.layer_norm', ours + 'pre_cross_attention_norm', bias=False)
        rules += _t5_mlp(cfg, hf + '2.', ours)
        rules += norm(hf + '2.layer_norm', ours + 'pre_mlp_norm', bias=False)
  if not cfg.tie_embeddings:
    rules += linear('lm_head', 'decoder/lm_head', bias=False)
  return rules


RULES = {'bert': bert_rules, 'gpt': gpt_rules, 't5': t5_rules}
# Tensors HF may save as copies of another: (copy, original). Import accepts them when equal.
TIED = {'bert': (('cls.predictions.decoder.weight', 'bert.embeddings.word_embeddings.weight'),
                 ('cls.predictions.decoder.bias', 'cls.predictions.bias')),
        'gpt': (('lm_head.weight', 'transformer.wte.weight'),),
        't5': (('encoder.embed_tokens.weight', 'shared.weight'),
               ('decoder.embed_tokens.weight', 'shared.weight'),
               ('lm_head.weight', 'shared.weight'))}


def normalize_names(family: str, state_dict: dict) -> dict:
  """Old spellings -> current ones: LayerNorm gamma/beta, GPT2Model without 'transformer.'."""
  out = {}
  for name, value in state_dict.items():
    name = re.sub(r'LayerNorm\.gamma$', 'LayerNorm.weight', name)
    name = re.sub(r'LayerNorm\.beta$', 'LayerNorm.bias', name)
    if family == 'gpt' and not name.startswith(('transformer.', 'lm_head.')):
      name = 'transformer.' + name
    out[name] = value
  return out


def _leaf_shapes(cfg: ModelConfig) -> dict:
  params = nn.unbox(abstract_variables(cfg.replace(scan_layers=False, remat='none'))['params'])
  return {path: tuple(leaf.shape) for path, leaf in flatten(params).items()}


def hf_to_params(cfg: ModelConfig, state_dict: dict) -> dict:
  """HF tensors (name -> numpy array) -> our params (nested dicts of float32 numpy arrays).

  Raises KeyError naming a missing tensor, ValueError naming a tensor with the wrong shape,
  an unexpected tensor, or a tied copy that differs from its original.
  """
  sd = normalize_names(cfg.family, state_dict)
  if cfg.family == 't5' and not cfg.tie_embeddings and 'lm_head.weight' not in sd:
    # an unscaled head tied to `shared` (transformers 5 always ties): ours keeps a copy
    sd['lm_head.weight'] = sd.get('shared.weight')
  expected = _leaf_shapes(cfg)
  rules = RULES[cfg.family](cfg)
  used = set()
  flat = {}
  for rule in rules:
    if rule.hf not in sd:
      raise KeyError(f'the checkpoint has no tensor {rule.hf!r}, which {cfg.family} '
                     f'parameter(s) {list(rule.ours)} need')
    w = np.asarray(sd[rule.hf])
    want = _hf_shape(rule, expected)
    if tuple(w.shape) != want:
      raise ValueError(f'tensor {rule.hf!r} has shape {tuple(w.shape)}; expected {want} for '
                       f'{list(rule.ours)} of the model config.json describes')
    for path, value in zip(rule.ours, rule.to_ours(w)):
      flat[path] = np.ascontiguousarray(value, dtype=np.float32)
    used.add(rule.hf)
  for dup, original in TIED[cfg.family]:
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
  for rule in RULES[cfg.family](cfg):
    arrays = [np.asarray(flat[p], dtype=np.float32) for p in rule.ours]
    out[rule.hf] = np.ascontiguousarray(rule.to_hf(*arrays))
  return out


def _hf_shape(rule: Rule, expected: dict) -> tuple:
  """The HF shape a rule needs, from our expected shapes run through to_hf."""
  zeros = [np.zeros(expected[p], np.float32) for p in rule.ours]
  return tuple(rule.to_hf(*zeros).shape)


def flatten(tree, prefix='') -> dict:
  out = {}
  for key, value in tree.items():
    path = f'{prefix}{key}'
    if isinstance(value, dict) or hasattr(value, 'items'):
      out.update(flatten(value, path + '/'))
    else:
      out[path] = value
  return out


def unflatten(flat: dict) -> dict:
  tree = {}
  for path, value in flat.items():
    node = tree
    *parents, leaf = path.split('/')
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return tree


def _stack_parent(params, path):
  node = params
  for p in path[:-1]:
    node = node[p]
  return node


def stack_layers(cfg: ModelConfig, params: dict) -> dict:
  """`{name}_0 .. {name}_{L-1}` -> `{name}` with a leading layer axis (the nn.scan layout)."""
  params = unflatten(flatten(params))  # a copy we may edit
  for path in STACKS[cfg.family]:
    parent = _stack_parent(params, path)
    name = path[-1]
    count = len([k for k in parent if re.fullmatch(rf'{name}_\d+', k)])
    layers = [parent.pop(f'{name}_{i}') for i in range(count)]
    parent[name] = jax.tree.map(lambda *xs: np.stack(xs), *layers)
  return params


def unstack_layers(cfg: ModelConfig, params: dict) -> dict:
  """Inverse of `stack_layers`."""
  params = unflatten(flatten(params))
  for path in STACKS[cfg.family]:
    parent = _stack_parent(params, path)
    name = path[-1]
    stacked = parent.pop(name)
    count = jax.tree.leaves(stacked)[0].shape[0]
    for i in range(count):
      parent[f'{name}_{i}'] = jax.tree.map(lambda x, i=i: np.asarray(x[i]), stacked)
  return params
