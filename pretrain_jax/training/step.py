"""The pure train and eval steps, and their jitted, sharded versions.

The dropout key is `fold_in(key(seed), state.step)`, so a resumed run repeats an uninterrupted
one bit for bit. Microbatches differentiate `total_loss(their sums, the FULL batch's
denominators)`, whose gradients add up to exactly the full batch's.
"""
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pretrain_jax import ops
from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.ops import backends
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import optimizer as opt_lib
from pretrain_jax.training import state as state_lib
from pretrain_jax.training import task
from pretrain_jax.training.config import TrainConfig


def split_microbatches(batch: dict, microbatches: int) -> dict:
  """(B, ...) -> (M, B/M, ...), microbatch m holding rows m, m+M, ...: strided rows keep each
  device's (contiguous) rows on it, an equal share in every microbatch."""
  def split(x):
    x = x.reshape((x.shape[0] // microbatches, microbatches) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)
  return jax.tree.map(split, batch)


def max_predictions(t: TrainConfig, data) -> int:   # -1 resolved by the data's objective
  return data.max_predictions(t.max_predictions_per_seq)


def make_train_step(model, tx, schedule, *, seed: int, microbatches: int = 1, mesh=None,
                    prng_impl=None, merge=None, **loss_kw):
  """The pure train step of `model` (deterministic=False); `loss_kw` go to task.loss_sums.
  `merge(params, frozen) -> the model's params` (LoRA: training/lora.py): the step is then
  (state, batch, frozen) and differentiates the state's params only.

  `prng_impl` names the dropout key's PRNG (None: JAX's default). philox's mulhi has no
  multi-process or sharded lowering, so it is refused on more than one device.
  """
  try:
    jax.random.key(seed, impl=prng_impl)
  except ValueError as e:
    raise ValueError(f'train.prng_impl={prng_impl!r}: {e}') from None
  split = (f'across {jax.process_count()} processes' if jax.process_count() > 1 else
           f'on a batch split over {mesh.size} devices' if mesh is not None and mesh.size > 1
           else '')
  if prng_impl and prng_impl.startswith('philox') and split:
    raise ValueError(f'train.prng_impl={prng_impl!r} does not compile {split}; use '
                     'threefry2x32 there')

  def loss_fn(params, batch, denoms, rng, frozen):
    full = params if merge is None else merge(params, frozen)
    sums = task.loss_sums(model, full, batch, rngs={'dropout': rng}, **loss_kw)
    return task.total_loss(sums, denoms), sums

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def accumulate(params, batch, denoms, rng, frozen):
    micro = split_microbatches(batch, microbatches)
    if mesh is not None:
      micro = jax.lax.with_sharding_constraint(micro, NamedSharding(
          mesh, P(None, mesh_lib.BATCH_AXES)))
    first = jax.tree.map(lambda x: x[0], micro)
    (_, sums), grads = jax.eval_shape(grad_fn, params, first, denoms, rng, frozen)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (grads, sums))

    def body(carry, inputs):
      index, mb = inputs
      (_, sums), grads = grad_fn(params, mb, denoms, jax.random.fold_in(rng, index), frozen)
      return jax.tree.map(jnp.add, carry, (grads, sums)), None

    (grads, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(microbatches), micro))
    return grads, sums

  def train_step(state, batch, frozen=None):
    denoms = task.denominators(model.cfg, batch)              # from the FULL global batch
    rng = jax.random.fold_in(jax.random.key(seed, impl=prng_impl), state.step)
    if microbatches == 1:
      (_, sums), grads = grad_fn(state.params, batch, denoms, rng, frozen)
    else:
      grads, sums = accumulate(state.params, batch, denoms, rng, frozen)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = task.metrics_from_sums(sums, denoms)
    # (the counts too: a logged row's MCC / F1 are of its steps' summed counts)
    metrics.update({k: v for k, v in sums.items() if k.endswith('_confusion')})
    # state_finite is of the UPDATED state, so the loop never saves one a finite loss hides.
    metrics.update(grad_norm=optax.tree.norm(grads), learning_rate=schedule(state.step),
                   state_finite=ops.all_finite((params, opt_state)))
    metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return train_step


def make_eval_step(model, loss_chunk_len: int = 0, max_predictions: int = 0, merge=None,
                   fused_loss: bool = True):
  """(params, batch) -> (sums with lm_top5, denominators) of a deterministic `model`; with
  `merge` (make_train_step's) (params, batch, frozen)."""
  def eval_step(params, batch, frozen=None):
    params = params if merge is None else merge(params, frozen)
    return (task.loss_sums(model, params, batch, loss_chunk_len=loss_chunk_len,
                           max_predictions=max_predictions, top5=True, fused_loss=fused_loss),
            task.denominators(model.cfg, batch))
  return eval_step


class Steps(NamedTuple):
  """What the train loop, the benchmark and the experiments need to train one config."""
  train_step: Callable     # jitted (state, batch) -> (state, metrics); the state is donated
  eval_step: Callable      # jitted (params, batch) -> (sums, denominators)
  abstract_state: Any      # TrainState of ShapeDtypeStructs carrying their shardings
  init_state: Callable     # PRNG key -> TrainState (see create_state)
  batch_sharding: NamedSharding  # of every batch array (first dimension over the batch axes)
  max_predictions: int     # LM head positions per row (0 = every position)
  scan_steps: Callable     # jitted (state, batches (K, B, ...)) -> (state, metrics (K,)): K
                           # train steps in one dispatch, the same as K calls of train_step
  model_config: ModelConfig  # the config the steps compute: its dtype resolved for the mesh

  @property
  def state_shardings(self):
    return state_lib.shardings_of(self.abstract_state)

  def create_state(self, seed: int):     # a fresh TrainState, created in its shards
    return state_lib.run_once(self.init_state, jax.random.key(seed),
                              out_shardings=self.state_shardings)

  def state_from(self, params):    # step 0 from these weights (an import's), fresh optimizer
    # (no weights drawn only to be replaced: their initializers are most of an init's compile)
    return state_lib.run_once(functools.partial(self.init_state, None), params,
                              out_shardings=self.state_shardings)


def make_steps(model_cfg: ModelConfig, t: TrainConfig, mesh, *, max_predictions: int = 0,
               init_length: int = 8, adapter=None) -> Steps:
  """The one path from a model and a `config.train` section to jitted, sharded steps.

  `init_length`: the length of the batch that sizes the parameters (they do not depend on it).
  The ops form (ops/__init__.py) and the compute dtype of `model.dtype='auto'`
  (ModelConfig.resolved) are chosen here, once, from the mesh's devices: every program the
  steps trace, the state's init included, computes them (Steps.model_config is the resolved
  config).
  `adapter` (a lora.Adapter): the state trains `adapter.trainable(fresh params, rng)` alone and
  every step reads `adapter.merge(params, frozen)`, the frozen weights placed once with their
  shardings and passed to each call.
  """
  form = backends.for_device(mesh.devices.flat[0], t.fp8)
  model_cfg = model_cfg.resolved(mesh.devices.flat[0])
  tx, schedule = opt_lib.make_optimizer(t), opt_lib.make_schedule(t)
  if t.freeze_backbone:                 # a linear probe: only the active heads' parameters
    heads = family_of(model_cfg).active_heads(model_cfg)
    names = tuple(n for h in heads for n in h.params)
    if not names:
      raise ValueError(f'train.freeze_backbone=True but this {model_cfg.family} model has no '
                       'head to train; expected model.num_classes > 0 (bert/gpt)')
    tx = opt_lib.train_only(tx, names)
  eval_model = build(model_cfg.replace(deterministic=True, decode=False))
  init_batch = family_of(model_cfg).init_batch(init_length, model_cfg.nsp)
  merge = adapter.merge if adapter is not None else None
  with ops.using(form):
    abstract, init_state = state_lib.abstract_state(
        eval_model, tx, mesh, init_batch, adapter.trainable if adapter is not None else None)
  shardings = state_lib.shardings_of(abstract)
  train_step = ops.bind(form, make_train_step(
      build(model_cfg.replace(deterministic=False, decode=False)), tx, schedule, seed=t.seed,
      microbatches=t.microbatches, z_loss=t.z_loss, mesh=mesh, prng_impl=t.prng_impl or None,
      loss_chunk_len=t.loss_chunk_len, max_predictions=max_predictions,
      freeze_backbone=t.freeze_backbone, fused_loss=t.fused_loss, merge=merge))
  eval_step = ops.bind(form, make_eval_step(eval_model, t.loss_chunk_len, max_predictions,
                                            merge, t.fused_loss))

  def scan(state, b, *frozen):        # K steps over (K, B, ...) batches
    return jax.lax.scan(lambda s, x: train_step(s, x, *frozen), state, b)
  frozen, extra = (), ()
  if adapter is not None:
    with ops.using(form):
      frozen_shardings = state_lib.split_shardings(
          state_lib.param_shardings(eval_model, mesh, init_batch), adapter.frozen)
    frozen, extra = (jax.device_put(adapter.frozen, frozen_shardings),), (frozen_shardings,)

  def jit(fn, first, rows, **kw):     # every batch array is split over the batch axes
    jitted = jax.jit(mesh_lib.traced_in(mesh, fn),
                     in_shardings=(first, NamedSharding(mesh, rows)) + extra, **kw)
    return (lambda a, b: jitted(a, b, *frozen)) if frozen else jitted
  rows, replicated = P(mesh_lib.BATCH_AXES), NamedSharding(mesh, P())
  train = dict(out_shardings=(shardings, replicated), donate_argnums=(0,))  # updated in place
  return Steps(jit(train_step, shardings, rows, **train),
               jit(eval_step, shardings.params, rows, out_shardings=replicated), abstract,
               ops.bind(form, init_state), NamedSharding(mesh, rows), max_predictions,
               jit(scan, shardings, P(None, mesh_lib.BATCH_AXES), **train), model_cfg)
