"""The pure train and eval steps, and their jitted, sharded versions.

`train_step(state, batch) -> (state, metrics)` is a pure function of its inputs: dropout
randomness is `fold_in(key(seed), state.step)`, so a resumed run repeats an uninterrupted one
bit for bit. `metrics['state_finite']` is 1.0 when the UPDATED params and optimizer state are
all finite (the loss and grad norm describe the state before the update), so the loop never
saves a state that a finite loss hides. Gradient accumulation sums microbatch gradients of
`total_loss(sums_microbatch, denominators_of_the_full_batch)`, which adds up to exactly the
full-batch loss (the denominators are fixed), so M microbatches match one big batch.
"""
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from pretrain_jax import task
from pretrain_jax.objectives import mlm
from pretrain_jax.training import mesh as mesh_lib


def split_microbatches(batch: dict, microbatches: int) -> dict:
  """(B, ...) -> (M, B/M, ...) where microbatch m holds rows m, m+M, m+2M, ...

  Strided rows keep every data shard's rows on its own device: the rows a device holds are
  contiguous, and each microbatch takes an equal share of them.
  """
  def split(x):
    x = x.reshape((x.shape[0] // microbatches, microbatches) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)
  return jax.tree.map(split, batch)


def max_predictions(config) -> int:
  """train.max_predictions_per_seq resolved: -1 = the MLM objective's bound for data.seq_len
  (objectives.mlm.max_predictions_per_seq; 0 = every position for the other objectives)."""
  value = config.train.get('max_predictions_per_seq', 0)
  if value == -1:
    d = config.data
    return mlm.max_predictions_per_seq(d.seq_len, d.mlm_probability) if d.objective == 'mlm' \
        else 0
  if not isinstance(value, int) or value < 0:
    raise ValueError(f'train.max_predictions_per_seq={value!r}; expected -1 (the MLM bound), '
                     '0 (every position) or a positive number of positions per row')
  return value


def metrics_from_sums(sums: dict, denoms: dict) -> dict:
  """Summed loss terms -> averages (the same arithmetic for train and eval)."""
  lm_weight = jnp.maximum(denoms['lm'], 1.0)
  out = {'loss': task.total_loss(sums, denoms), 'lm_loss': sums['lm'] / lm_weight,
         'lm_accuracy': sums['lm_correct'] / lm_weight, 'z_loss': sums['lm_z_loss'] / lm_weight}
  if 'nsp' in sums:
    nsp_weight = jnp.maximum(denoms['nsp'], 1.0)
    out.update(nsp_loss=sums['nsp'] / nsp_weight, nsp_accuracy=sums['nsp_correct'] / nsp_weight)
  return out


def all_finite(tree) -> jax.Array:
  """() bool: every floating-point leaf of `tree` is free of NaN/inf (one fused reduction)."""
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def make_train_step(model, tx, schedule, *, seed: int, microbatches: int = 1,
                    z_loss: float = 0.0, mesh=None, prng_impl=None, loss_chunk_len: int = 0,
                    max_predictions: int = 0):
  """The pure train step for `model` (built with deterministic=False for dropout).

  `prng_impl` names the dropout key's PRNG (`jax.random.key(seed, impl=...)`); None = JAX's
  default (threefry2x32). On CPU, 'philox4x32' draws dropout masks 5x faster, but its
  `chlo.mulhi` has no multi-process lowering (jax 0.10: "failed to legalize mhlo.unknown"),
  so it is refused when jax.process_count() > 1. `loss_chunk_len` > 0 runs the LM head and
  cross-entropy that many positions at a time; `max_predictions` > 0 runs the head only on
  that many weighted positions per row (both: task.loss_sums).
  """
  family = model.cfg.family
  try:
    jax.random.key(seed, impl=prng_impl)
  except ValueError as e:
    raise ValueError(f'train.prng_impl={prng_impl!r}: {e}') from None
  if prng_impl and prng_impl.startswith('philox') and jax.process_count() > 1:
    raise ValueError(f'train.prng_impl={prng_impl!r} does not compile across '
                     f'{jax.process_count()} processes; use threefry2x32 (or rbg) there')

  def loss_fn(params, batch, denoms, rng):
    sums = task.loss_sums(model, params, batch, rngs={'dropout': rng}, z_loss=z_loss,
                          loss_chunk_len=loss_chunk_len, max_predictions=max_predictions)
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
    metrics = metrics_from_sums(sums, denoms)
    metrics.update(grad_norm=optax.tree.norm(grads), learning_rate=schedule(state.step),
                   state_finite=all_finite((params, opt_state)))
    metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return train_step


def make_eval_step(model, loss_chunk_len: int = 0, max_predictions: int = 0):
  """eval_step(params, batch) -> (sums, denominators) with a deterministic model."""
  family = model.cfg.family

  def eval_step(params, batch):
    return (task.loss_sums(model, params, batch, loss_chunk_len=loss_chunk_len,
                           max_predictions=max_predictions),
            task.denominators(family, batch))
  return eval_step


def batch_shardings(mesh, batch_shapes: dict) -> dict:
  return {k: mesh_lib.batch_sharding(mesh, len(v.shape)) for k, v in batch_shapes.items()}


def jit_train_step(train_step, state_shardings, mesh, batch_shapes: dict):
  """jax.jit with explicit shardings; the old state is donated (updated in place)."""
  replicated = NamedSharding(mesh, P())
  return jax.jit(train_step, in_shardings=(state_shardings, batch_shardings(mesh, batch_shapes)),
                 out_shardings=(state_shardings, replicated), donate_argnums=(0,))


def jit_eval_step(eval_step, param_shardings, mesh, batch_shapes: dict):
  return jax.jit(eval_step, in_shardings=(param_shardings, batch_shardings(mesh, batch_shapes)),
                 out_shardings=NamedSharding(mesh, P()))
