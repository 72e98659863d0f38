r"""One fp32 train step: Hugging Face's Flax model (transformers 4.57) vs pretrain_jax's, per
family.

  HF_FLAX_SITE=/tmp/hf_flax python scripts/benchmark_hf_flax.py --family t5|gpt|bert
      [--rounds 20] [--steps 1] [--warmup 4] [--dropout] [--our_attention_dropout RATE]
      [--hf_optimizer same|adam] [--hf_loss int|onehot] [--hf_metrics | --no-hf_metrics]
      [--nsp] [--our_max_predictions N] [--tiny] [--parity] [--parity_only]


INSTALLING THE HF SIDE. The repo pins transformers 5.x, which has no Flax models any more, so
transformers 4.57 is installed OUTSIDE the venv with pip's --target and put first on sys.path
(below); the venv's jax / flax / optax are used by both sides:

  .venv/bin/python -m pip install --target /tmp/hf_flax --no-deps \
      transformers==4.57.6 huggingface_hub==0.36.2 tokenizers==0.22.2
  (exactly those three, in the directory $HF_FLAX_SITE names; their other requirements - numpy,
  safetensors, regex, pyyaml, requests, filelock, tqdm, packaging - come from the venv, which
  already has them for transformers 5; drop --no-deps if an import fails). No weights are
  downloaded: every HF model is built from a config with random init (_do_init=False +
  init_weights). HF Flax T5 needs a jnp.clip shim on jax >= 0.7 (patch_hf_t5).

MODELS (both sides built from configs/bench_<family>.py; --tiny shrinks both alike):
  t5   FlaxT5ForConditionalGeneration: 4 + 4 layers, d_model 512, 8 x 64 heads, d_ff 2048 ReLU
       (v1.0), vocab 32128, enc 256 / dec 64 tokens, batch 8; LM head tied to the shared
       embedding with the d_model**-0.5 rescale on both sides.
  gpt  FlaxGPT2LMHeadModel (GPT2Config n_layer 4, n_embd 512, n_head 8, n_inner 2048,
       n_positions 256, vocab 32128, layer_norm_epsilon 1e-5, activation gelu_new = our
       gelu_tanh, tied head); 256 tokens, batch 8; loss on every position (weights all 1).
  bert FlaxBertForMaskedLM (BertConfig 4 layers, hidden 512, 8 heads, intermediate 2048, gelu
       (erf), max_position_embeddings 256, type_vocab 2, layer_norm_eps 1e-12, tied decoder +
       bias); 256 tokens, batch 8. configs/bench_bert.py has NSP OFF (model.nsp = data.nsp =
       False) and train.max_predictions_per_seq = 0, so OUR MLM head runs on all 256
       positions exactly as HF's does, and both losses are the cross-entropy on the ~15% masked
       positions only (loss_weights), summed / sum(weights). --our_max_predictions -1 runs
       ours as the product trains by default instead: the MLM head on the masked positions
       only (step.max_predictions; the same loss, a fifth of the head's FLOPs). With --nsp (or
       a config with NSP) HF is FlaxBertForPreTraining and both sides add the NSP
       cross-entropy (pooler + 2-way classifier on [CLS]) averaged over rows.

Both steps are jitted with the train state donated and take the SAME device-resident synthetic
batch (pretrain_jax.perf.benchmark.synthetic_batch: Zipf ids, segment ids all ones) and the SAME
optimizer (by default the one pretrain_jax builds from its config, set here to AdamW with
weight_decay 0 = Adam, lr 1e-4 constant, no clipping; --hf_optimizer adam gives HF plain
optax.adam instead). Dropout is off on both (rates 0; HF deterministic=True) unless --dropout:
then 0.1 on both. HF: dropout_rate (t5) / embd_pdrop + resid_pdrop + attn_pdrop (gpt) /
hidden_dropout_prob + attention_probs_dropout_prob (bert) = 0.1, train mode with a dropout rng
drawn with the same PRNG impl as ours. Ours: model.dropout_rate = 0.1 and attention-probability
dropout --our_attention_dropout, default = our config's own value (t5: 0.0; gpt, bert: 0.1).
HF's attention dropout draws ONE (1, 1, T, S) mask broadcast over batch and heads (flax
dot_product_attention_weights, broadcast_dropout=True) with jax.random.bernoulli (32 random bits
per element); ours draws a full (B, N, T, S) mask with 16 random bits per element (ops/cpu.py).

Work that differs between the two steps (beyond dropout masks, see above), at the bench shapes:
  all  ours adds an all-masked-row guard in attention (out * any(mask)), a z-loss term
       multiplied by 0 (log Z^2 summed), perplexity / learning-rate metrics: elementwise, small.
       Ours splits q/k/v into three matmuls; HF GPT-2 fuses them (c_attn, same FLOPs).
  gpt, bert  ours looks positions (and BERT token types) up by a ONE-HOT MATMUL (OneHotEmbed:
       (B*T, max_len) x (max_len, E), and the same again for the table's gradient: ~0.5 GFLOP
       each way at 8 x 256, max_len 256, E 512, under 1% of the step); HF gathers.
  gpt  HF combines the causal and padding masks into a (B, 1, T, T) float bias via lax.select;
       ours a boolean mask into jnp.where: same size, elementwise.
  bert HF's BERT stack is called with head_mask=None (no per-head multiply), as HF's own
       training scripts effectively do (the wrapper's all-ones head_mask is an XLA no-op).
  t5   the same sublayers and dropout sites; HF drops attention probabilities with one
       (1, 1, T, S) mask, ours (when enabled) with a full one.
Parameter counts match exactly for all three (gpt: no lm_head kernel on either side when tied;
bert without NSP: no pooler on either side); the record has both counts and any difference.
Inits differ (ours: GPT-2's (2L)**-0.5 residual-output scaling, wpe std 0.01; HF: plain
normal(0.02)), which changes the losses' values but not the work.

--parity (cheap with --tiny) copies OUR initial parameters into HF's layout (t5: heads
flattened; gpt: q/k/v concatenated into c_attn, Conv1D kernels transposed;
bert: heads flattened), asserts the trees match in structure AND shapes, and compares the
deterministic logits and the losses of the two loss functions on the benchmark batch;
--parity_only prints that and stops.

Timing is interleaved: after compiling and warming up both, each round times --steps steps
of HF then --steps steps of ours (block_until_ready after every step) and records the median
ms/step of each. The default, one step each over 20 rounds, pairs every step of ours with
an HF step taken seconds before it: this class of shared 2-core machine drifts by several
percent within minutes, and the ratio's quartiles (in the record) show how much. The last
stdout line is one JSON record.

Both run in one process with glibc malloc as every pretrain_jax script sets it
(cli/process.py: a step's buffers come back from the heap, 0 minor page faults per step;
each round records both sides' faults per step). PRETRAIN_JAX_MALLOC=default gives both
glibc's defaults instead (docs/performance.md has what that costs).
"""
import os
import sys

# transformers 4.57.6, huggingface_hub 0.36, tokenizers 0.22 (see the docstring), then the repo
sys.path.insert(0, os.environ.get('HF_FLAX_SITE', '/tmp/hf_flax'))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# First: glibc malloc as every script sets it (above), before numpy's import starts a thread.
from pretrain_jax import cli

# isort: split
import argparse
import importlib
import json
import resource
import statistics
import time
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.traverse_util import flatten_dict

from pretrain_jax.data.config import DataConfig
from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.ops import backends
from pretrain_jax.perf import benchmark
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import optimizer as opt_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training import task
from pretrain_jax.training.config import MeshConfig, TrainConfig

FAMILIES = ('t5', 'gpt', 'bert')


def patch_hf_t5(modeling):
  """jax >= 0.7 removed jnp.clip's a_min/a_max keywords (now min/max); HF's Flax T5 uses
  `jnp.clip(x, a_max=...)` in _relative_position_bucket. Give that module a jnp whose clip
  takes the old keywords; jax.numpy itself is untouched (our model never sees the shim)."""
  def clip(x, min=None, max=None, *, a_min=None, a_max=None):
    return jnp.clip(x, min=a_min if min is None else min, max=a_max if max is None else max)
  shim = types.ModuleType('jnp_shim')
  shim.__dict__.update({k: getattr(jnp, k) for k in dir(jnp) if not k.startswith('__')})
  shim.clip = clip
  modeling.jnp = shim


def parse_args():
  p = cli.argument_parser(__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument('--family', choices=FAMILIES, default='t5')
  p.add_argument('--rounds', type=int, default=20)
  p.add_argument('--steps', type=int, default=1, help='timed steps per model per round')
  p.add_argument('--warmup', type=int, default=4, help='untimed steps of each after compiling')
  p.add_argument('--dropout', action='store_true', help='dropout 0.1 on both sides')
  p.add_argument('--our_attention_dropout', type=float, default=None,
                 help="ours: attention-probability dropout under --dropout (default: our "
                      "config's value: t5 0, gpt/bert 0.1)")
  p.add_argument('--hf_optimizer', choices=('same', 'adam'), default='same',
                 help="'same': the optax chain pretrain_jax builds (AdamW, wd 0); "
                      "'adam': optax.adam(lr)")
  p.add_argument('--hf_loss', choices=('int', 'onehot'), default='int',
                 help="'int': softmax_cross_entropy_with_integer_labels; 'onehot': "
                      "softmax_cross_entropy(logits, one_hot(labels)) as HF's run_*_flax")
  p.add_argument('--hf_metrics', action=argparse.BooleanOptionalAction, default=True,
                 help='HF step also computes what ours reports (argmax accuracy, grad norm, '
                      'all-finite check), so both steps do the same extra work')
  p.add_argument('--nsp', action='store_true',
                 help='bert: turn NSP on in both (bench_bert has it off); HF uses '
                      'FlaxBertForPreTraining and adds the NSP loss')
  p.add_argument('--tiny', action='store_true',
                 help='smoke-test shapes: 2 layers, width 64, 4 x 16 heads, mlp 128, vocab 512, '
                      'batch 2 x 32 tokens (t5: 16 decoder tokens)')
  p.add_argument('--parity', action='store_true',
                 help="copy our initial params into HF's layout and compare logits and losses")
  p.add_argument('--parity_only', action='store_true', help='--parity, then stop')
  p.add_argument('--our_max_predictions', type=int, default=None,
                 help="bert: ours' train.max_predictions_per_seq (default: bench_bert's 0, the "
                      "MLM head on all positions as HF's; -1: the product default, the head on "
                      "the masked positions only)")
  p.add_argument('--lr', type=float, default=1e-4)
  p.add_argument('--seed', type=int, default=0)
  args = p.parse_args()
  if args.nsp and args.family != 'bert':
    p.error('--nsp is for --family bert')
  args.parity = args.parity or args.parity_only
  return args


def our_config(args):
  c = importlib.import_module(f'configs.bench_{args.family}').get_config()
  if args.tiny:
    c.model.update(vocab_size=512, num_layers=2, emb_dim=64, num_heads=4, head_dim=16,
                   mlp_dim=128, max_len=32)
    if args.family == 't5':
      c.model.num_decoder_layers = 2
      c.benchmark.target_len = 16
    c.data.seq_len = 32
    c.train.batch_size = 2
  if args.our_max_predictions is not None:
    c.train.max_predictions_per_seq = args.our_max_predictions
  if args.nsp:
    c.model.nsp = True
    c.data.nsp = True
  rate = 0.1 if args.dropout else 0.0
  attention_rate = (c.model.attention_dropout_rate if args.our_attention_dropout is None
                    else args.our_attention_dropout)
  c.model.update(dropout_rate=rate, attention_dropout_rate=attention_rate if args.dropout else 0.0)
  c.train.update(optimizer='adamw', weight_decay=0.0, grad_clip=0.0, schedule='constant',
                 warmup_steps=0, learning_rate=args.lr, seed=args.seed)
  return c


def build_ours(config):
  mesh = mesh_lib.make_mesh(MeshConfig.from_config(config.mesh))
  model_cfg = ModelConfig.from_config(config.model)
  t, data = TrainConfig.from_config(config.train), DataConfig.from_config(config.data)
  trainer = step_lib.make_steps(model_cfg, t, mesh, max_predictions=step_lib.max_predictions(
      t, data), init_length=data.seq_len)
  state = trainer.create_state(t.seed)
  return model_cfg, trainer, state


# --------------------------------------------------------------------------- HF models

def hf_model(config, args):
  """(HF config, FlaxPreTrainedModel built with _do_init=False, forward) where
  forward(module, params, batch, deterministic, rngs) -> (lm_logits, nsp_logits or None)."""
  m = config.model
  hf_drop = 0.1 if args.dropout else 0.0
  if m.family == 't5':
    from transformers import (  # noqa: PLC0415 (after the flag checks)
      FlaxT5ForConditionalGeneration,
      T5Config,
    )
    from transformers.models.t5 import modeling_flax_t5  # noqa: PLC0415 (after the flag checks)
    patch_hf_t5(modeling_flax_t5)
    hf_cfg = T5Config(vocab_size=m.vocab_size, d_model=m.emb_dim, d_kv=m.head_dim,
                      d_ff=m.mlp_dim, num_layers=m.num_layers,
                      num_decoder_layers=m.num_decoder_layers, num_heads=m.num_heads,
                      relative_attention_num_buckets=m.relative_buckets,
                      relative_attention_max_distance=m.relative_max_distance,
                      dropout_rate=hf_drop, layer_norm_epsilon=m.layer_norm_eps,
                      feed_forward_proj='relu', tie_word_embeddings=True, initializer_factor=1.0)
    model = FlaxT5ForConditionalGeneration(hf_cfg, dtype=jnp.float32, _do_init=False)

    def forward(module, params, batch, deterministic, rngs):
      return module.apply({'params': params},
                          input_ids=batch['encoder_input_tokens'],
                          attention_mask=batch['encoder_segment_ids'],
                          decoder_input_ids=batch['decoder_input_tokens'],
                          decoder_attention_mask=batch['decoder_segment_ids'],
                          deterministic=deterministic, rngs=rngs).logits, None  # (B, T, V)
    return hf_cfg, model, forward

  if m.num_heads * m.head_dim != m.emb_dim:
    raise ValueError(f'HF {m.family} needs num_heads * head_dim == emb_dim; got '
                     f'{m.num_heads} x {m.head_dim} != {m.emb_dim}')
  if m.get('position_embedding', 'learned') != 'learned':
    raise ValueError('HF GPT-2 / BERT have learned positions only')

  if m.family == 'gpt':
    from transformers import (  # noqa: PLC0415 (after the flag checks)
      FlaxGPT2LMHeadModel,
      GPT2Config,
    )
    act = {'gelu_tanh': 'gelu_new', 'gelu': 'gelu', 'relu': 'relu'}[m.activation]
    if not m.get('tie_embeddings', True):
      raise ValueError('HF FlaxGPT2LMHeadModel untied has a lm_head WITHOUT bias; ours has one '
                       '(head_bias): not compared here')
    hf_cfg = GPT2Config(vocab_size=m.vocab_size, n_positions=m.max_len, n_embd=m.emb_dim,
                        n_layer=m.num_layers, n_head=m.num_heads, n_inner=m.mlp_dim,
                        activation_function=act, resid_pdrop=hf_drop, embd_pdrop=hf_drop,
                        attn_pdrop=hf_drop, layer_norm_epsilon=m.layer_norm_eps,
                        initializer_range=0.02, tie_word_embeddings=True)
    model = FlaxGPT2LMHeadModel(hf_cfg, dtype=jnp.float32, _do_init=False)

    def forward(module, params, batch, deterministic, rngs):
      return module.apply({'params': params}, batch['inputs'], batch['segment_ids'],
                          batch['positions'], deterministic=deterministic,
                          rngs=rngs).logits, None
    return hf_cfg, model, forward

  from transformers import (  # noqa: PLC0415 (after the flag checks)
    BertConfig,
    FlaxBertForMaskedLM,
    FlaxBertForPreTraining,
  )
  act = {'gelu': 'gelu', 'gelu_tanh': 'gelu_new', 'relu': 'relu'}[m.activation]
  nsp = bool(m.get('nsp', False))
  hf_cfg = BertConfig(vocab_size=m.vocab_size, hidden_size=m.emb_dim,
                      num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                      intermediate_size=m.mlp_dim, hidden_act=act,
                      hidden_dropout_prob=hf_drop, attention_probs_dropout_prob=hf_drop,
                      max_position_embeddings=m.max_len, type_vocab_size=m.type_vocab_size,
                      layer_norm_eps=m.layer_norm_eps, initializer_range=0.02,
                      tie_word_embeddings=bool(m.get('tie_embeddings', True)))
  cls = FlaxBertForPreTraining if nsp else FlaxBertForMaskedLM
  model = cls(hf_cfg, dtype=jnp.float32, _do_init=False)

  def forward(module, params, batch, deterministic, rngs):
    out = module.apply({'params': params}, batch['inputs'], batch['segment_ids'],
                       batch['token_type_ids'], batch['positions'], None,  # head_mask
                       deterministic=deterministic, rngs=rngs)
    if nsp:
      return out.prediction_logits, out.seq_relationship_logits
    return out.logits, None
  return hf_cfg, model, forward


def build_hf(config, args, tx):
  hf_cfg, model, forward = hf_model(config, args)
  params = jax.jit(model.init_weights, static_argnums=1)(jax.random.PRNGKey(args.seed), (1, 1))
  params = jax.tree.map(jnp.asarray, dict(params))
  module = model.module
  prng_impl = config.train.get('prng_impl') or None
  deterministic = not args.dropout
  family = family_of(config.model.family)

  def loss_fn(params, batch, rng, deterministic=deterministic):
    rngs = {} if deterministic else {'dropout': rng}
    logits, nsp_logits = forward(module, params, batch, deterministic, rngs)
    labels, weights = batch[family.target_key], batch[family.weight_key]
    if args.hf_loss == 'onehot':
      nll = optax.softmax_cross_entropy(logits, jax.nn.one_hot(labels, logits.shape[-1]))
    else:
      nll = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    denom = jnp.maximum(jnp.sum(weights), 1.0)
    loss = jnp.sum(nll * weights) / denom
    aux = {}
    if args.hf_metrics:
      aux['accuracy'] = jnp.sum((jnp.argmax(logits, -1) == labels) * weights) / denom
    if nsp_logits is not None:
      nsp_labels = batch['nsp_labels']
      nsp_w = (nsp_labels >= 0).astype(jnp.float32)
      nsp_denom = jnp.maximum(jnp.sum(nsp_w), 1.0)
      nsp_nll = optax.softmax_cross_entropy_with_integer_labels(nsp_logits,
                                                                jnp.maximum(nsp_labels, 0))
      aux['nsp_loss'] = jnp.sum(nsp_nll * nsp_w) / nsp_denom
      loss = loss + aux['nsp_loss']
      if args.hf_metrics:
        aux['nsp_accuracy'] = jnp.sum((jnp.argmax(nsp_logits, -1) == nsp_labels) * nsp_w
                                      ) / nsp_denom
    return loss, aux

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  base_key = jax.random.key(args.seed, impl=prng_impl)

  def train_step(state, batch):
    params, opt_state, step = state
    (loss, aux), grads = grad_fn(params, batch, jax.random.fold_in(base_key, step))
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    metrics = dict(aux, loss=loss)
    if args.hf_metrics:
      all_finite = backends.for_platform(jax.devices()[0].platform).all_finite
      metrics.update(grad_norm=optax.tree.norm(grads),
                     state_finite=all_finite((params, opt_state)).astype(jnp.float32))
    return (params, opt_state, step + 1), metrics

  state = (params, jax.jit(tx.init)(params), jnp.zeros((), jnp.int32))
  hf = types.SimpleNamespace(cfg=hf_cfg, module=module, forward=forward, loss_fn=loss_fn)
  return hf, jax.jit(train_step, donate_argnums=(0,)), state


# --------------------------------------------------------------------------- parity

def _heads_in(a):   # ours (E, N, H) [+ bias (N, H)] -> HF Dense (E, N*H)
  e = a['kernel'].shape[0]
  out = {'kernel': a['kernel'].reshape(e, -1)}
  if 'bias' in a:
    out['bias'] = a['bias'].reshape(-1)
  return out


def _heads_out(a):  # ours (N, H, E) -> HF Dense (N*H, E)
  out = {'kernel': a['kernel'].reshape(-1, a['kernel'].shape[-1])}
  if 'bias' in a:
    out['bias'] = a['bias']
  return out


def t5_to_hf(p, m):
  """Our T5 params -> FlaxT5ForConditionalGeneration's (v1.0 ReLU, tied)."""
  if m.activation != 'relu' or not m.tie_embeddings:
    raise NotImplementedError('parity mapping covers T5 v1.0 (relu, tied) only')
  def attn(a):
    return {n: {'kernel': f(a[o])['kernel']} for n, o, f in
            (('q', 'query', _heads_in), ('k', 'key', _heads_in),
             ('v', 'value', _heads_in), ('o', 'out', _heads_out))}
  def ff(b):
    return {'DenseReluDense': {'wi': dict(b['mlp']['wi']), 'wo': dict(b['mlp']['wo'])},
            'layer_norm': {'weight': b['pre_mlp_norm']['scale']}}
  hp = {'shared': {'embedding': p['shared']['embedding']},
        'encoder': {'block': {},
                    'final_layer_norm': {'weight': p['encoder']['final_norm']['scale']}},
        'decoder': {'block': {},
                    'final_layer_norm': {'weight': p['decoder']['final_norm']['scale']}}}
  def self_attention(stack, i, block, attention, norm):
    sa = attn(block[attention])
    if i == 0:  # HF keeps the stack's relative-position table in its first block
      sa['relative_attention_bias'] = {'embedding': p[stack]['relpos_bias']['rel_embedding']}
    return {'SelfAttention': sa, 'layer_norm': {'weight': block[norm]['scale']}}
  for i in range(m.num_layers):
    b = p['encoder'][f'layers_{i}']
    hp['encoder']['block'][str(i)] = {'layer': {
        '0': self_attention('encoder', i, b, 'attention', 'pre_attention_norm'), '1': ff(b)}}
  for i in range(m.num_decoder_layers or m.num_layers):
    b = p['decoder'][f'layers_{i}']
    hp['decoder']['block'][str(i)] = {'layer': {
        '0': self_attention('decoder', i, b, 'self_attention', 'pre_self_attention_norm'),
        '1': {'EncDecAttention': attn(b['encoder_decoder_attention']),
              'layer_norm': {'weight': b['pre_cross_attention_norm']['scale']}},
        '2': ff(b)}}
  return hp


def gpt_to_hf(p, m):
  """Our GPT params -> FlaxGPT2LMHeadModel's: q/k/v concatenated into c_attn; HF's Conv1D keeps
  its kernel as (out, in), so every dense kernel is transposed."""
  def t(d):
    return {'kernel': d['kernel'].T, 'bias': d['bias']}
  blocks = {}
  for i in range(m.num_layers):
    b = p[f'h_{i}']
    q, k, v = (_heads_in(b['attn'][n]) for n in ('query', 'key', 'value'))
    blocks[str(i)] = {
        'ln_1': dict(b['ln_1']), 'ln_2': dict(b['ln_2']),
        'attn': {'c_attn': {'kernel': jnp.concatenate([q['kernel'], k['kernel'], v['kernel']], 1).T,
                            'bias': jnp.concatenate([q['bias'], k['bias'], v['bias']])},
                 'c_proj': t(_heads_out(b['attn']['out']))},
        'mlp': {'c_fc': t(b['mlp']['wi']), 'c_proj': t(b['mlp']['wo'])}}
  return {'transformer': {'wte': dict(p['wte']), 'wpe': dict(p['wpe']), 'h': blocks,
                          'ln_f': dict(p['ln_f'])}}


def bert_to_hf(p, m):
  """Our BERT params -> FlaxBertForMaskedLM's (FlaxBertForPreTraining's with NSP)."""
  layers = {}
  for i in range(m.num_layers):
    b = p[f'layer_{i}']
    a = b['attention']
    layers[str(i)] = {
        'attention': {'self': {n: _heads_in(a[n]) for n in ('query', 'key', 'value')},
                      'output': {'dense': _heads_out(a['out']),
                                 'LayerNorm': dict(b['attention_norm'])}},
        'intermediate': {'dense': dict(b['mlp']['wi'])},
        'output': {'dense': dict(b['mlp']['wo']), 'LayerNorm': dict(b['output_norm'])}}
  bert = {'embeddings': {'word_embeddings': dict(p['word_embeddings']),
                         'position_embeddings': dict(p['position_embeddings']),
                         'token_type_embeddings': dict(p['token_type_embeddings']),
                         'LayerNorm': dict(p['embeddings_norm'])},
          'encoder': {'layer': layers}}
  predictions = {'bias': p['mlm_bias'],
                 'transform': {'dense': dict(p['mlm_transform']['dense']),
                               'LayerNorm': dict(p['mlm_transform']['norm'])}}
  if not m.tie_embeddings:
    predictions['decoder'] = {'kernel': p['mlm_decoder']['kernel']}
  out = {'bert': bert, 'cls': {'predictions': predictions}}
  if m.nsp:
    bert['pooler'] = {'dense': dict(p['pooler'])}
    out['cls']['seq_relationship'] = dict(p['nsp'])
  return out


def parity(model_cfg, our_params, hf, hf_params, batch):
  """Our params mapped into HF's layout: tree + shape check, then logits and losses."""
  p = jax.tree.map(jnp.asarray, nn.meta.unbox(our_params))
  mapped = {'t5': t5_to_hf, 'gpt': gpt_to_hf, 'bert': bert_to_hf}[model_cfg.family](p, model_cfg)
  def shapes(tree):
    return jax.tree.map(lambda x: tuple(x.shape), dict(tree))
  ref, got = shapes(hf_params), shapes(mapped)
  if ref != got:
    fr, fg = flatten_dict(ref), flatten_dict(got)
    diff = {'/'.join(k): (fr.get(k), fg.get(k))
            for k in set(fr) | set(fg) if fr.get(k) != fg.get(k)}
    raise AssertionError(f'HF tree (shape) vs mapped ours: {diff}')
  family = family_of(model_cfg)
  ours = build(model_cfg.replace(deterministic=True, decode=False))
  args, kwargs = family.model_inputs(batch)
  out = jax.jit(lambda p: ours.apply({'params': p}, *args, **kwargs))(p)
  our_logits, our_nsp = (out if model_cfg.family == 'bert' else (out, None))
  hf_logits, hf_nsp = jax.jit(lambda q: hf.forward(hf.module, q, batch, True, {}))(mapped)
  our_loss = jax.jit(lambda p: task.total_loss(task.loss_sums(ours, p, batch),
                                               task.denominators(family, batch)))(p)
  hf_loss = jax.jit(lambda q: hf.loss_fn(q, batch, None, deterministic=True)[0])(mapped)
  rec = {'mapped_tree_matches': True,
         'max_abs_logit_diff': float(jnp.max(jnp.abs(our_logits - hf_logits))),
         'max_abs_logit': float(jnp.max(jnp.abs(our_logits))),
         'ours_loss': float(our_loss), 'hf_loss': float(hf_loss),
         'abs_loss_diff': float(abs(our_loss - hf_loss))}
  if our_nsp is not None:
    rec['max_abs_nsp_logit_diff'] = float(jnp.max(jnp.abs(our_nsp - hf_nsp)))
  return rec


# --------------------------------------------------------------------------- timing

def compile_and_warm(step, state, batch, warmup):
  start = time.perf_counter()
  compiled = step.lower(state, batch).compile()
  compile_s = time.perf_counter() - start
  metrics = None
  for _ in range(warmup):
    state, metrics = compiled(state, batch)
  if metrics is None:  # --warmup 0: no loss before the timed steps (null in the record)
    return compiled, state, compile_s, None
  jax.block_until_ready((state, metrics))
  return compiled, state, compile_s, float(metrics['loss'])


def minor_faults():
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_steps(compiled, state, batch, n):
  """(state, seconds per step, last loss, minor page faults per step)."""
  times, faults = [], minor_faults()
  for _ in range(n):
    start = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  jax.block_until_ready(state)
  return state, times, float(metrics['loss']), (minor_faults() - faults) / n


def count(tree):
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree)))


def trainer_tx(config):
  return opt_lib.make_optimizer(TrainConfig.from_config(config.train))


def main():
  args = parse_args()
  import transformers  # noqa: PLC0415 (after the flag checks)

  config = our_config(args)
  model_cfg, trainer, our_state = build_ours(config)
  tx = (trainer_tx(config) if args.hf_optimizer == 'same' else optax.adam(args.lr))
  hf, hf_step, hf_state = build_hf(config, args, tx)

  batch_np = benchmark.synthetic_batch(config)
  our_batch = {k: jax.device_put(v, trainer.batch_sharding) for k, v in batch_np.items()}
  hf_batch = {k: jax.device_put(v) for k, v in batch_np.items()}
  hf_params, ours_params = count(hf_state[0]), count(our_state.params)

  parity_rec = None
  if args.parity:
    parity_rec = parity(model_cfg, our_state.params, hf, hf_state[0], hf_batch)
    print(json.dumps({'parity': parity_rec}), file=sys.stderr, flush=True)
    if args.parity_only:
      print(json.dumps({'family': args.family, 'tiny': args.tiny, 'parity': parity_rec,
                        'hf_params': hf_params, 'ours_params': ours_params}), flush=True)
      return

  hf_compiled, hf_state, hf_compile_s, hf_loss0 = compile_and_warm(hf_step, hf_state, hf_batch,
                                                                   args.warmup)
  our_compiled, our_state, our_compile_s, our_loss0 = compile_and_warm(
      trainer.train_step, our_state, our_batch, args.warmup)

  rounds = []
  for _ in range(args.rounds):
    hf_state, hf_times, hf_loss, hf_faults = time_steps(hf_compiled, hf_state, hf_batch,
                                                        args.steps)
    our_state, our_times, our_loss, our_faults = time_steps(our_compiled, our_state, our_batch,
                                                            args.steps)
    hf_ms, our_ms = 1e3 * statistics.median(hf_times), 1e3 * statistics.median(our_times)
    rounds.append({'hf_ms': round(hf_ms, 2), 'ours_ms': round(our_ms, 2),
                   'ratio_ours_over_hf': round(our_ms / hf_ms, 4),
                   'hf_faults_per_step': hf_faults, 'ours_faults_per_step': our_faults})
    print(json.dumps({'round': len(rounds), **rounds[-1]}), file=sys.stderr, flush=True)

  record = {
      'family': args.family,
      'rounds': rounds,
      'median_hf_ms': round(statistics.median(r['hf_ms'] for r in rounds), 2),
      'median_ours_ms': round(statistics.median(r['ours_ms'] for r in rounds), 2),
      'median_ratio_ours_over_hf': round(statistics.median(r['ratio_ours_over_hf']
                                                           for r in rounds), 4),
      'ratio_quartiles': [round(q, 4) for q in statistics.quantiles(
          [r['ratio_ours_over_hf'] for r in rounds], n=4)] if len(rounds) > 1 else None,
      'hf_compile_s': round(hf_compile_s, 2), 'ours_compile_s': round(our_compile_s, 2),
      'malloc': os.environ.get('PRETRAIN_JAX_MALLOC') or 'tuned',
      'hf_loss': [None if hf_loss0 is None else round(hf_loss0, 4), round(hf_loss, 4)],
      'ours_loss': [None if our_loss0 is None else round(our_loss0, 4), round(our_loss, 4)],
      'hf_params': hf_params, 'ours_params': ours_params,
      'param_diff_ours_minus_hf': ours_params - hf_params,
      'dropout': 0.1 if args.dropout else 0.0,
      'ours_attention_dropout': model_cfg.attention_dropout_rate,
      'prng_impl': config.train.get('prng_impl'),
      'steps_per_round': args.steps, 'warmup': args.warmup,
      'hf_optimizer': args.hf_optimizer, 'hf_loss_fn': args.hf_loss, 'hf_metrics': args.hf_metrics,
      'tied_lm_head': bool(model_cfg.tie_embeddings),
      'hf_model': type(hf.module).__name__.replace('Module', ''),
      'tiny': args.tiny,
  }
  if args.family == 't5':
    record.update(batch=int(batch_np['encoder_input_tokens'].shape[0]),
                  encoder_len=int(batch_np['encoder_input_tokens'].shape[1]),
                  decoder_len=int(batch_np['decoder_target_tokens'].shape[1]))
  else:
    record.update(batch=int(batch_np['inputs'].shape[0]), seq_len=int(batch_np['inputs'].shape[1]),
                  loss_positions_per_step=int(batch_np['loss_weights'].sum()))
  if args.family == 'bert':
    record.update(nsp=bool(model_cfg.nsp), ours_max_predictions_per_seq=trainer.max_predictions)
  if parity_rec is not None:
    record['parity'] = parity_rec
  record.update({'transformers': transformers.__version__, 'jax': jax.__version__,
                 'device': jax.devices()[0].device_kind, 'num_devices': jax.device_count()})
  print(json.dumps(record), flush=True)


if __name__ == '__main__':
  main()
