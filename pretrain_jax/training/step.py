"""The pure train and eval steps, and their jitted, sharded versions.

`train_step(state, batch) -> (state, metrics)` is a pure function of its inputs: dropout
randomness is `fold_in(key(seed), state.step)`, so a resumed run repeats an uninterrupted one
bit for bit. `metrics['state_finite']` is 1.0 when the UPDATED params and optimizer state are
all finite (the loss and grad norm describe the state before the update), so the loop never
saves a state that a finite loss hides. Gradient accumulation sums microbatch gradients of
`total_loss(sums_microbatch, denominators_of_the_full_batch)`, which adds up to exactly the
full-batch loss (the denominators are fixed), so M microbatches match one big batch.
"""
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import optimizer as opt_lib
from pretrain_jax.training import state as state_lib
from pretrain_jax.training import task
from pretrain_jax.training.config import TrainConfig
from pretrain_jax.tuning import backends


def split_microbatches(batch: dict, microbatches: int) -> dict:
  """(B, ...) -> (M, B/M, ...) where microbatch m holds rows m, m+M, m+2M, ...

  Strided rows keep every data shard's rows on its own device: the rows a device holds are
  contiguous, and each microbatch takes an equal share of them.
  """
  def split(x):
    x = x.reshape((x.shape[0] // microbatches, microbatches) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)
  return jax.tree.map(split, batch)


def max_predictions(t: TrainConfig, data) -> int:
  """train.max_predictions_per_seq resolved by the data section (a DataConfig: -1 = the MLM
  objective's bound for data.seq_len, 0 = every position for the other objectives)."""
  return data.max_predictions(t.max_predictions_per_seq)


def make_train_step(model, tx, schedule, *, seed: int, microbatches: int = 1,
                    z_loss: float = 0.0, mesh=None, prng_impl=None, loss_chunk_len: int = 0,
                    max_predictions: int = 0, freeze_backbone: bool = False):
  """The pure train step for `model` (built with deterministic=False for dropout).

  `prng_impl` names the dropout key's PRNG (`jax.random.key(seed, impl=...)`); None = JAX's
  default (threefry2x32). On CPU, 'philox4x32' draws dropout masks much faster, but its
  `chlo.mulhi` has no multi-process lowering (jax 0.10: "failed to legalize mhlo.unknown"),
  so it is refused when jax.process_count() > 1. `loss_chunk_len` > 0 runs the LM head and
  cross-entropy that many positions at a time; `max_predictions` > 0 runs the head only on
  that many weighted positions per row (both: task.loss_sums). `freeze_backbone` stops the
  gradient at the hidden states (a linear probe; pair it with optimizer.train_only).
  """
  family = family_of(model.cfg)
  try:
    jax.random.key(seed, impl=prng_impl)
  except ValueError as e:
    raise ValueError(f'train.prng_impl={prng_impl!r}: {e}') from None
  if prng_impl and prng_impl.startswith('philox') and jax.process_count() > 1:
    raise ValueError(f'train.prng_impl={prng_impl!r} does not compile across '
                     f'{jax.process_count()} processes; use threefry2x32 (or rbg) there')
  if prng_impl and prng_impl.startswith('philox') and mesh is not None and mesh.size > 1:
    raise ValueError(f'train.prng_impl={prng_impl!r} does not compile on a batch split over '
                     f'{mesh.size} devices (jax 0.10: its mulhi has no sharded lowering); use '
                     'threefry2x32 there')

  def loss_fn(params, batch, denoms, rng):
    sums = task.loss_sums(model, params, batch, rngs={'dropout': rng}, z_loss=z_loss,
                          loss_chunk_len=loss_chunk_len, max_predictions=max_predictions,
                          freeze_backbone=freeze_backbone)
    return task.total_loss(sums, denoms), sums

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def accumulate(params, batch, denoms, rng):
    micro = split_microbatches(batch, microbatches)
    if mesh is not None:
      micro = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, NamedSharding(
          mesh, P(None, mesh_lib.BATCH_AXES, *([None] * (x.ndim - 2))))), micro)
    first = jax.tree.map(lambda x: x[0], micro)
    _, sums_shape = jax.eval_shape(loss_fn, params, first, denoms, rng)
    zeros = (jax.tree.map(jnp.zeros_like, params),
             jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape))

    def body(carry, inputs):
      index, mb = inputs
      (_, sums), grads = grad_fn(params, mb, denoms, jax.random.fold_in(rng, index))
      return jax.tree.map(jnp.add, carry, (grads, sums)), None

    (grads, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(microbatches), micro))
    return grads, sums

  def train_step(state, batch):
    denoms = task.denominators(family, batch)                 # from the FULL global batch
    rng = jax.random.fold_in(jax.random.key(seed, impl=prng_impl), state.step)
    if microbatches == 1:
      (_, sums), grads = grad_fn(state.params, batch, denoms, rng)
    else:
      grads, sums = accumulate(state.params, batch, denoms, rng)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = task.metrics_from_sums(sums, denoms)
    # (the counts too: a logged row's MCC / F1 are of its steps' summed counts)
    metrics.update({k: v for k, v in sums.items() if k.endswith('_confusion')})
    metrics.update(grad_norm=optax.tree.norm(grads), learning_rate=schedule(state.step),
                   state_finite=model.cfg.tuning.all_finite((params, opt_state)))
    metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return train_step


def make_eval_step(model, loss_chunk_len: int = 0, max_predictions: int = 0):
  """eval_step(params, batch) -> (sums, denominators) with a deterministic model; the sums
  include top-5 hits (lm_top5)."""
  family = family_of(model.cfg)

  def eval_step(params, batch):
    return (task.loss_sums(model, params, batch, loss_chunk_len=loss_chunk_len,
                           max_predictions=max_predictions, top5=True),
            task.denominators(family, batch))
  return eval_step


def jit_train_step(train_step, state_shardings, mesh):
  """jax.jit with explicit shardings; the old state is donated (updated in place). Every batch
  array is split over the batch axes along its first dimension."""
  batch = NamedSharding(mesh, P(mesh_lib.BATCH_AXES))
  return jax.jit(mesh_lib.traced_in(mesh, train_step), in_shardings=(state_shardings, batch),
                 out_shardings=(state_shardings, NamedSharding(mesh, P())), donate_argnums=(0,))


def jit_scan_steps(train_step, state_shardings, mesh):
  """jax.jit of K train steps in one call: (state, batches (K, B, ...)) -> (state, metrics
  (K,)), a lax.scan over the leading axis. The same steps as K calls of the train step (the
  dropout key folds in state.step), one dispatch and one set of step buffers for all K."""
  batches = NamedSharding(mesh, P(None, mesh_lib.BATCH_AXES))
  return jax.jit(mesh_lib.traced_in(mesh, lambda state, b: jax.lax.scan(train_step, state, b)),
                 in_shardings=(state_shardings, batches),
                 out_shardings=(state_shardings, NamedSharding(mesh, P())), donate_argnums=(0,))


def jit_eval_step(eval_step, param_shardings, mesh):
  batch = NamedSharding(mesh, P(mesh_lib.BATCH_AXES))
  return jax.jit(mesh_lib.traced_in(mesh, eval_step), in_shardings=(param_shardings, batch),
                 out_shardings=NamedSharding(mesh, P()))


class Steps(NamedTuple):
  """What the train loop, the benchmark and the experiments need to train one config."""
  train_step: Callable     # jitted (state, batch) -> (state, metrics); the state is donated
  eval_step: Callable      # jitted (params, batch) -> (sums, denominators)
  abstract_state: Any      # TrainState of ShapeDtypeStructs carrying their shardings
  init_state: Callable     # PRNG key -> TrainState (see create_state)
  batch_sharding: NamedSharding  # of every batch array (first dimension over the batch axes)
  max_predictions: int     # LM head positions per row (0 = every position)
  scan_steps: Callable     # jitted (state, batches (K, B, ...)) -> (state, metrics (K,))

  @property
  def state_shardings(self):
    return state_lib.shardings_of(self.abstract_state)

  def create_state(self, seed: int):
    """A fresh TrainState, created directly in its shards (state.init_in_shards)."""
    return state_lib.init_in_shards(self.init_state, self.state_shardings, seed)


def make_steps(model_cfg: ModelConfig, t: TrainConfig, mesh, *, max_predictions: int = 0,
               init_length: int = 8) -> Steps:
  """The one path from a model and a `config.train` section to jitted, sharded steps.

  `init_length` is the sequence length of the batch that sizes the parameters (any length the
  model accepts; parameters do not depend on it). `train.freeze_backbone` (fine-tuning's
  linear probe) trains only the active heads' parameters (family Head.params). The model's
  tuning is chosen here, once, from the mesh's devices (tuning/backends.py).
  """
  model_cfg = model_cfg.replace(tuning=backends.for_device(mesh.devices.flat[0], t.fp8))
  tx, schedule = opt_lib.make_optimizer(t), opt_lib.make_schedule(t)
  if t.freeze_backbone:
    heads = family_of(model_cfg).active_heads(model_cfg)
    names = tuple(n for h in heads for n in h.params)
    if not names:
      raise ValueError(f'train.freeze_backbone=True but this {model_cfg.family} model has no '
                       'head to train; expected model.num_classes > 0 (bert/gpt)')
    tx = opt_lib.train_only(tx, names)
  eval_model = build(model_cfg.replace(deterministic=True, decode=False))
  abstract, init_state = state_lib.abstract_state(
      eval_model, tx, mesh, family_of(model_cfg).init_batch(init_length, model_cfg.nsp))
  shardings = state_lib.shardings_of(abstract)
  train_step = make_train_step(
      build(model_cfg.replace(deterministic=False, decode=False)), tx, schedule, seed=t.seed,
      microbatches=t.microbatches, z_loss=t.z_loss, mesh=mesh, prng_impl=t.prng_impl or None,
      loss_chunk_len=t.loss_chunk_len, max_predictions=max_predictions,
      freeze_backbone=t.freeze_backbone)
  eval_step = make_eval_step(eval_model, t.loss_chunk_len, max_predictions)
  return Steps(jit_train_step(train_step, shardings, mesh),
               jit_eval_step(eval_step, shardings.params, mesh), abstract, init_state,
               NamedSharding(mesh, P(mesh_lib.BATCH_AXES)), max_predictions,
               jit_scan_steps(train_step, shardings, mesh))
