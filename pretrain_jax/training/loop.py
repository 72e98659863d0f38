"""train_and_evaluate(config, workdir): the training loop, top to bottom.

Side effects (files, logs, signals, checkpoints) happen here; the step itself is pure.
"""
import functools
import math
import os
import signal
import time

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from pretrain_jax.models import ModelConfig, build
from pretrain_jax.training import checkpoint as ckpt_lib
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import metrics as metrics_lib
from pretrain_jax.training import optimizer as opt_lib
from pretrain_jax.training import state as state_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training import workdir as workdir_lib

def open_datasets(config, datasets=None):
  """(train iterator, eval iterator, tokenizer path) of this host's share of the batch.

  `datasets(split=, batch_size=, process_index=, process_count=, repeat=)` replaces
  pretrain_jax.data (tests pass synthetic data); by default the tokenizer is loaded and
  checked against the model's vocabulary.
  """
  tokenizer_path = ''
  if datasets is None:
    from pretrain_jax import data  # pylint: disable=g-import-not-at-top  (pulls in tensorflow)
    tokenizer = data.load_tokenizer(config.data)
    if tokenizer.vocab_size != config.model.vocab_size:
      raise ValueError(f'config.model.vocab_size={config.model.vocab_size} but the tokenizer '
                       f'has {tokenizer.vocab_size} pieces; set --config.model.vocab_size='
                       f'{tokenizer.vocab_size}')
    datasets = functools.partial(data.make_dataset, config.data, tokenizer)
    tokenizer_path = getattr(tokenizer, 'path', '') or config.data.tokenizer
  host_batch = config.train.batch_size // jax.process_count()
  kw = dict(batch_size=host_batch, process_index=jax.process_index(),
            process_count=jax.process_count(), repeat=True, model_max_len=config.model.max_len)
  return (datasets(split=config.data.train_split, **kw),
          datasets(split=config.data.eval_split, **kw), tokenizer_path)


def global_batch(batch: dict, sharding) -> dict:
  """This host's numpy batch -> one global jax.Array per key, split over the batch axes."""
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in batch.items()}


class StopRequest:
  """SIGTERM (Cloud TPU preemption notice) sets a flag the loop polls after each step."""

  def __init__(self):
    self.requested = False
    self._previous = signal.signal(signal.SIGTERM, self._handler)

  def _handler(self, signum, frame):
    del signum, frame
    if self.requested:  # stays installed until the final save is complete
      os.write(2, b'SIGTERM again: save in progress; ignoring it\n')
    self.requested = True

  def agreed(self) -> bool:
    """True on every process when any process got the signal (a collective if multi-host)."""
    if jax.process_count() == 1:
      return self.requested
    return bool(np.any(multihost_utils.process_allgather(np.asarray(self.requested))))

  def close(self):
    signal.signal(signal.SIGTERM, self._previous)


def check_finite(history: list) -> None:
  """Raises at the first step whose loss, gradients, learning rate or UPDATED state is not
  finite (the loss and grad norm describe the state before the update)."""
  for step, m in history:
    bad = [f'{name} {m[key]}' for key, name in [('loss', 'loss'), ('grad_norm', 'grad norm'),
                                                ('learning_rate', 'learning rate')]
           if not math.isfinite(m[key])]
    if not m.get('state_finite', 1.0):
      bad.append('updated params/optimizer state')
    if bad:
      raise FloatingPointError(
          f'non-finite training at step {step}: {", ".join(bad)}; stopping without saving '
          '(the last good checkpoint is kept). Try a lower train.learning_rate, '
          'train.grad_clip > 0 or float32 compute')


def evaluate(eval_step, params, eval_iter, start_state, num_batches, sharding) -> dict:
  """Validation metrics over `num_batches` batches (the same ones every time)."""
  eval_iter.set_state(start_state)
  totals = None
  for _ in range(num_batches):
    sums = jax.device_get(eval_step(params, global_batch(next(eval_iter), sharding)))
    totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
  return {k: float(v) for k, v in step_lib.metrics_from_sums(*totals).items()}


def train_and_evaluate(config, workdir: str, *, datasets=None) -> dict:
  """Trains `config` in `workdir` (resuming from its newest good checkpoint); returns a summary.

  One trainer per workdir (workdir_lib.hold); an incompatible config is refused before
  anything in the workdir changes."""
  workdir_lib.check_cadence(config.train)
  with workdir_lib.hold(workdir, config.train.steps):
    return _train_and_evaluate(config, workdir, datasets=datasets)


def _train_and_evaluate(config, workdir: str, *, datasets=None) -> dict:
  t = config.train
  max_predictions = step_lib.max_predictions(config)  # LM head positions per row (0 = all)
  mesh = mesh_lib.make_mesh(config.mesh)
  mesh_lib.check_config(config, mesh, jax.process_count())
  model_cfg = ModelConfig.from_config(config.model)
  train_model = build(model_cfg.replace(deterministic=False))
  eval_model = build(model_cfg.replace(deterministic=True))
  schedule, tx = opt_lib.make_schedule(t), opt_lib.make_optimizer(t)

  train_iter, eval_iter, tokenizer_path = open_datasets(config, datasets)
  eval_start = eval_iter.get_state()
  config = workdir_lib.write_config(config, workdir, tokenizer_path,
                                    (ckpt_lib.complete_steps(workdir) or [None])[-1],
                                    is_writer=jax.process_index() == 0)
  writer = metrics_lib.MetricWriter(workdir)

  # State: restored from the latest checkpoint (onto this mesh), else created in its shards.
  abstract, init_state = state_lib.abstract_state(
      eval_model, tx, mesh, state_lib.init_batch(model_cfg.family, config.data.seq_len))
  shardings = state_lib.shardings_of(abstract)
  checkpointer = ckpt_lib.Checkpointer(workdir, keep=t.keep_checkpoints,
                                       async_save=t.async_checkpoints)
  if checkpointer.latest_step() is not None:
    state, data_state = checkpointer.restore(abstract)
    train_iter.set_state(data_state)
    writer.line(f'restored step {int(state.step)} from {ckpt_lib.checkpoint_dir(workdir)}')
  else:
    state = jax.jit(init_state, out_shardings=shardings)(jax.random.key(t.seed))
  start = int(state.step)
  writer.line(f'{model_cfg.family}: {state_lib.count_params(state.params):,} parameters, '
              f'mesh {dict(mesh.shape)}, steps {start}..{t.steps}')

  batch_sharding = NamedSharding(mesh, P(mesh_lib.BATCH_AXES))  # dim 0 of every batch array
  train_step = jax.jit(
      step_lib.make_train_step(train_model, tx, schedule, seed=t.seed,
                               microbatches=t.microbatches, z_loss=t.z_loss, mesh=mesh,
                               prng_impl=t.get('prng_impl'),
                               loss_chunk_len=t.get('loss_chunk_len', 0),
                               max_predictions=max_predictions),
      in_shardings=(shardings, batch_sharding),
      out_shardings=(shardings, NamedSharding(mesh, P())), donate_argnums=(0,))
  eval_step = jax.jit(step_lib.make_eval_step(eval_model, t.get('loss_chunk_len', 0),
                                             max_predictions),
                      in_shardings=(shardings.params, batch_sharding),
                      out_shardings=NamedSharding(mesh, P()))
  peak_flops = metrics_lib.peak_flops_per_device(t.peak_tflops) * jax.device_count()

  stop = StopRequest()
  history, last, eval_metrics = [], {}, {}
  window_start, window_steps, train_time, timed_steps = None, 0, 0.0, 0
  step = start
  try:
    while step < t.steps:
      batch = global_batch(next(train_iter), batch_sharding)
      if step == start:
        tokens_per_step, flops_per_step = metrics_lib.batch_cost(
            model_cfg, batch, max_predictions)
      state, metrics = train_step(state, batch)
      step += 1
      history.append((step, metrics))
      if window_start is None:  # the clock starts after the first step
        jax.block_until_ready(metrics)
        window_start = time.perf_counter()
      else:
        window_steps += 1
      stopping = stop.agreed()
      log_now = step % t.log_every == 0 or step == t.steps or stopping
      eval_now = t.eval_every > 0 and (step % t.eval_every == 0 or step == t.steps)
      save_now = step % t.checkpoint_every == 0 or step == t.steps or stopping
      if log_now or eval_now or save_now:
        history = [(s, jax.device_get(m)) for s, m in history]
        check_finite(history)                   # never log or save past a NaN
        checkpointer.check()                    # a failed background save stops the run
        last = {k: float(v) for k, v in history[-1][1].items()}
        history = []
      if log_now:
        if window_steps:  # none right after the first (compiling) step
          elapsed = time.perf_counter() - window_start
          step_time = elapsed / window_steps
          train_time, timed_steps = train_time + elapsed, timed_steps + window_steps
          last.update(step_time_sec=step_time, tokens_per_sec=tokens_per_step / step_time,
                      mfu=flops_per_step / step_time / peak_flops,
                      eta_sec=(t.steps - step) * step_time)
        writer.write(step, last)
        writer.line(metrics_lib.progress_line(step, t.steps, last))
        window_start, window_steps = time.perf_counter(), 0
      if eval_now:
        eval_metrics = evaluate(eval_step, state.params, eval_iter, eval_start,
                                t.eval_batches, batch_sharding)
        writer.write(step, eval_metrics, prefix='eval')
        writer.line(f'step {step}/{t.steps} | eval loss {eval_metrics["loss"]:.4f} | '
                    f'accuracy {eval_metrics["lm_accuracy"]:.3f}')
      if save_now:
        checkpointer.save(step, state, train_iter.get_state())
      if eval_now or save_now:
        window_start = time.perf_counter()     # not training throughput
      if stopping:
        checkpointer.wait()                      # announce only a complete checkpoint
        writer.line(f'SIGTERM: saved step {step}; exiting')
        break
  finally:
    try:
      checkpointer.close()                       # waits for the last asynchronous save
    finally:
      stop.close()                               # only now: a second SIGTERM must not kill it
      writer.close()

  step_time = train_time / timed_steps if timed_steps else None
  return {'family': model_cfg.family, 'workdir': workdir, 'start_step': start, 'step': step,
          'steps': t.steps, 'preempted': stop.requested and step < t.steps,
          'train_loss': last.get('loss'), 'eval_loss': eval_metrics.get('loss'),
          'eval_accuracy': eval_metrics.get('lm_accuracy'),
          'tokens_per_sec': tokens_per_step / step_time if step_time else None,
          'step_time_sec': step_time, 'params': state_lib.count_params(state.params),
          'checkpoint_steps': checkpointer.all_steps()}
