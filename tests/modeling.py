"""Tiny models and whole configs, and runs of them, shared by test modules."""
import functools
import gzip
import json
import os

import flax.linen as nn
import jax
import ml_collections

from configs import common
from configs import finetune as finetune_config
from pretrain_jax import paths
from pretrain_jax.data import corpus
from pretrain_jax.data.config import DataConfig
from pretrain_jax.finetune import run as run_lib
from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.run import checkpoint
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import optimizer as opt_lib
from pretrain_jax.training import state as state_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training import synthetic
from pretrain_jax.training.config import MeshConfig, TrainConfig

VOCAB = 97


def tiny(family: str, **kw) -> ModelConfig:
  base = dict(family=family, vocab_size=VOCAB, num_layers=2, emb_dim=32, num_heads=4,
              head_dim=8, mlp_dim=64, max_len=32, dropout_rate=0.0,
              attention_dropout_rate=0.0)
  if family == 'gpt':
    base.update(activation='gelu_tanh', layer_norm_eps=1e-5)
  if family == 't5':
    base.update(position_embedding='relative', activation='gated-gelu', layer_norm_eps=1e-6,
                tie_embeddings=False)
  base.update(kw)
  return ModelConfig(**base)


def init(cfg: ModelConfig, length: int = 8, seed: int = 0):
  """The model's parameters, initialised as the train state's are: one jitted program
  (training.state.run_once; eagerly, the init ran its forward pass an op at a time)."""
  args, kwargs = family_of(cfg).model_inputs(family_of(cfg).init_batch(length))
  return state_lib.run_once(
      lambda key: nn.unbox(build(cfg).init(key, *args, **kwargs)['params']),
      jax.random.key(seed))


def tokens(shape, seed=1):
  return jax.random.randint(jax.random.key(seed), shape, 3, VOCAB)


@functools.cache
def _apply(cfg):
  """build(cfg).apply, jitted once per config: one compile per input shape, where the eager
  apply compiled each operation of the model on its own."""
  return jax.jit(lambda params, *args, **kw: build(cfg).apply({'params': params}, *args, **kw))


def forward(cfg, params, *args, **kw):
  """The LM logits (BERT's first output; its NSP logits are dropped)."""
  out = _apply(cfg)(params, *args, **kw)
  return out[0] if isinstance(out, tuple) else out


def tiny_finetune_config(init: str):
  """A 2-step full fine-tune of `init` on 8 sentences of the embedded word_order task."""
  c = finetune_config.get_config()
  c.init, c.task.name, c.mode = init, 'word_order', 'full'
  c.data.seq_len = 32
  c.task.update(max_train_examples=8, max_eval_examples=8)
  c.train.update(batch_size=4, steps=2, warmup_steps=1, log_every=1, eval_every=2,
                 checkpoint_every=2)
  return c


def two_step_finetune(init: str, workdir: str) -> dict:
  return run_lib.finetune(tiny_finetune_config(init), workdir)


SEQ = 16   # tiny_config's sequence length


def tiny_config(family: str, **train) -> ml_collections.ConfigDict:
  """A whole config (model/data/train/mesh) of a 2-layer, emb 32, vocab 128 model."""
  c = ml_collections.ConfigDict()
  c.model = ml_collections.ConfigDict(dict(
      family=family, vocab_size=128, num_layers=2, emb_dim=32, num_heads=4, head_dim=8,
      mlp_dim=64, max_len=SEQ, dropout_rate=0.0, attention_dropout_rate=0.0,
      position_embedding='relative' if family == 't5' else 'learned',
      activation='gated-gelu' if family == 't5' else 'gelu', tie_embeddings=family != 't5'))
  c.data = common.data_config({'gpt': 'clm', 'bert': 'mlm', 't5': 'span_corruption'}[family],
                              SEQ)
  c.train = common.train_config(batch_size=8, steps=20, learning_rate=1e-2)
  c.train.update(dict(dict(warmup_steps=2, log_every=1, eval_every=0, checkpoint_every=100,
                           eval_batches=1), **train))
  c.mesh = common.mesh_config()
  return c


def small(config, steps=6):
  """`config` (a configs/tiny_*.py one) shrunk to a 1-layer model on 4 rows of 64 tokens that
  trains `steps` steps, evaluating and saving once at the end."""
  config.model.update(num_layers=1, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64,
                      max_len=64)
  config.data.seq_len = 64
  config.train.update(batch_size=4, steps=steps, warmup_steps=1, log_every=steps,
                      eval_every=steps, eval_batches=1, checkpoint_every=steps)
  return config


def setup(config, devices=None):
  """(state, jitted step, mesh) for `config` on `devices` (default: the first device)."""
  mesh = mesh_lib.make_mesh(MeshConfig.from_config(config.mesh), devices or jax.devices()[:1])
  cfg, t = ModelConfig.from_config(config.model), TrainConfig.from_config(config.train)
  mesh_lib.check_config(t, cfg, mesh)
  tx, schedule = opt_lib.make_optimizer(t), opt_lib.make_schedule(t)
  abstract, init_state = state_lib.abstract_state(build(cfg), tx, mesh,
                                                 family_of(cfg.family).init_batch(SEQ))
  state = state_lib.run_once(init_state, jax.random.key(0),
                             out_shardings=state_lib.shardings_of(abstract))
  step = step_lib.make_train_step(build(cfg.replace(deterministic=False)), tx, schedule,
                                  seed=0, microbatches=t.microbatches, mesh=mesh,
                                  loss_chunk_len=t.loss_chunk_len, fused_loss=t.fused_loss,
                                  max_predictions=step_lib.max_predictions(
                                      t, DataConfig.from_config(config.data)))
  return state, jax.jit(step, donate_argnums=(0,)), mesh


def batches(config, n, fixed=False):
  """`n` synthetic batches of `config` (SEQ tokens a row)."""
  data = synthetic.SyntheticDataset(
      config.model.family, vocab_size=config.model.vocab_size, seq_len=SEQ,
      batch_size=config.train.batch_size, fixed=fixed,
      nsp=ModelConfig.from_config(config.model).nsp)
  return [next(data) for _ in range(n)]


class Wrapped:
  """A dataset whose `hook(n, batch)` runs when its n-th batch (1-based) is drawn."""

  def __init__(self, inner, hook):
    self.inner, self.hook, self.drawn = inner, hook, 0

  def __iter__(self):
    return self

  def __next__(self):
    self.drawn += 1
    batch = next(self.inner)
    return self.hook(self.drawn, batch)

  def get_state(self):
    return self.inner.get_state()

  def set_state(self, state):
    self.inner.set_state(state)


def datasets_with_hook(config, hook):
  """Synthetic datasets of `config` whose train split runs `hook` (see Wrapped)."""
  base = synthetic.synthetic_datasets(config)

  def datasets(*, split, **kw):
    data = base(split=split, **kw)
    return Wrapped(data, hook) if split == config.data.train_split else data
  return datasets


def data_files(workdir, step) -> list:
  """The array data files of a checkpoint's state, largest first."""
  root = os.path.join(checkpoint.checkpoint_dir(str(workdir)), str(step), 'state')
  files = [os.path.join(r, f) for r, _, fs in os.walk(root) for f in fs
           if os.path.basename(r) == 'd' and 'ocdbt.process_' in r]
  return sorted(files, key=os.path.getsize, reverse=True)


def upload_corpus(root: str) -> str:
  """The embedded corpus as a .jsonl, a .json.gz and a .txt file under `root`; their glob."""
  docs = corpus.embedded_documents()
  third = len(docs) // 3
  paths.write_atomic(f'{root}/a.jsonl', ''.join(json.dumps({'text': d}) + '\n'
                                                for d in docs[:third]))
  paths.write_atomic(f'{root}/b.json.gz', gzip.compress(''.join(
      json.dumps({'text': d}) + '\n' for d in docs[third:2 * third]).encode()))
  paths.write_atomic(f'{root}/c.txt', '\n\n'.join(d.replace('\n\n', '\n')
                                                  for d in docs[2 * third:]))
  return f'{root}/*'
