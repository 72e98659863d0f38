"""Tiny model configs and helpers shared by the model tests."""
import functools

import flax.linen as nn
import jax

from configs import finetune as finetune_config
from pretrain_jax.finetune import run as run_lib
from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.training import state

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
  return state.run_once(
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
