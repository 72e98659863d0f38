"""train_and_evaluate(config, workdir): the training loop, top to bottom. Side effects (files,
logs, signals, checkpoints) happen here; the step is pure. Faults: docs/training.md's table."""
import contextlib
import functools
import json
import math
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pretrain_jax import data, paths
from pretrain_jax.models import cost, family_of
from pretrain_jax.run import agreement, listing
from pretrain_jax.run import checkpoint as ckpt_lib
from pretrain_jax.run import lock as lock_lib
from pretrain_jax.run import metrics as metrics_lib
from pretrain_jax.run import profiler as profiler_lib
from pretrain_jax.run import workdir as workdir_lib
from pretrain_jax.run.notes import implementation_notes
from pretrain_jax.training import evaluate as eval_lib
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import optimizer as opt_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training.config import RunConfig


def open_datasets(run: RunConfig, datasets, workdir: str, tokenizer=None):
  """(train iterator, eval iterator or None, tokenizer path) of this host's share of the batch.
  `datasets(split=, batch_size=, ..., repeat=)` replaces pretrain_jax.data; a `tokenizer` given
  was loaded and checked by the caller (a Hugging Face one); else the workdir's is used."""
  d, tokenizer_path = run.data, ''
  if datasets is None:
    source = workdir_lib.shared_source(d, workdir)
    if tokenizer is None:
      tokenizer = workdir_lib.shared_tokenizer(d, workdir, source)
      if tokenizer.vocab_size != run.model.vocab_size:
        raise ValueError(f'config.model.vocab_size={run.model.vocab_size} but the tokenizer '
                         f'has {tokenizer.vocab_size} pieces; set --config.model.vocab_size='
                         f'{tokenizer.vocab_size}')
    datasets = functools.partial(data.make_dataset, d, tokenizer, source=source)
    tokenizer_path = getattr(tokenizer, 'path', '') or d.tokenizer
  kw = dict(batch_size=run.train.batch_size // jax.process_count(),
            process_index=jax.process_index(), process_count=jax.process_count(),
            model_max_len=run.model.max_len)
  # Validation reads its split once, in order, as pretrain-jax evaluate does; with no evaluation
  # none is opened, so a corpus without one trains.
  return (datasets(split=d.train_split, repeat=True, **kw),
          datasets(split=d.eval_split, repeat=False, **kw) if run.train.eval_every > 0 else None,
          tokenizer_path)


def _accuracy(metrics: dict):
  """The headline accuracy: a classifier's (class_accuracy) where there is one, else the LM's."""
  return metrics.get('class_accuracy', metrics.get('lm_accuracy'))


def global_batch(batch: dict, sharding) -> dict:
  """This host's numpy batch -> one global jax.Array per key, split over the batch axes."""
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in batch.items()}


class StopRequest:
  """SIGTERM (a preemption notice) or Ctrl-C sets a flag the loop polls after each step: it saves
  that step and stops. A second SIGTERM is ignored until the save is complete; a second Ctrl-C
  raises KeyboardInterrupt. A SIGINT the process was started ignoring (`nohup`) stays ignored."""

  def __init__(self):
    self.requested, self.name, self._lagged = False, None, agreement.Lagged()
    signals = [signal.SIGTERM] + ([signal.SIGINT] if signal.getsignal(signal.SIGINT)
                                  is not signal.SIG_IGN else [])
    self._previous = {s: signal.signal(s, self._handler) for s in signals}

  def _handler(self, signum, frame):
    del frame
    name = signal.Signals(signum).name
    if not self.requested:
      self.requested, self.name = True, name
      if signum == signal.SIGINT:
        os.write(2, b'Ctrl-C: saving after this step, then stopping (Ctrl-C again: stop now, '
                    b'without this save)\n')
    elif signum == signal.SIGINT:
      raise KeyboardInterrupt
    else:                       # installed until the final save is complete
      os.write(2, f'{name} again: save in progress; ignoring it\n'.encode())

  def agreed(self) -> bool:
    """True on every process after the same step once any process got the signal (on several,
    agreement.Lagged.LAG steps after it); another process's notice stops this one too."""
    flags = self._lagged.agree([self.requested])
    agreed = flags is not None and bool(flags.any())
    self.requested |= agreed
    return agreed

  def close(self):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)


def check_finite(history: list, set_aside=lambda step: '') -> None:
  """Raises at the first (step, metrics) whose loss, gradients, learning rate or updated state is
  not finite. The loss and grad norm are those of the state before the update, step - 1: a
  checkpoint of it trains to NaN, so `set_aside(step - 1)` moves it out of the way first and
  says what it did (a good checkpoint is one whose next loss is finite)."""
  for step, m in history:
    bad = [f'{name} {m[key]}' for key, name in [('loss', 'loss'), ('grad_norm', 'grad norm'),
                                                ('learning_rate', 'learning rate')]
           if not math.isfinite(m[key])]
    if not m.get('state_finite', 1.0):
      bad.append('updated params/optimizer state')
    if bad:
      diverged = not (math.isfinite(m['loss']) and math.isfinite(m['grad_norm']))
      moved = set_aside(step - 1) if diverged else ''
      raise FloatingPointError(
          f'non-finite training at step {step}: {", ".join(bad)}; stopping without saving'
          f'{moved or " (the last good checkpoint is kept)"}. Try a lower train.learning_rate, '
          'train.grad_clip > 0 or float32 compute')


def check_objective(model_cfg, objective: str, data_nsp: bool = False) -> None:
  """Refuses a data.objective the model does not train with (a bidirectional encoder given
  next-token targets would read each target in its input), and NSP on one side only."""
  if bool(data_nsp) != bool(model_cfg.nsp):
    raise ValueError(f'config.data.nsp={bool(data_nsp)} but config.model.nsp='
                     f'{bool(model_cfg.nsp)}; expected both True (NSP pairs and the NSP head) '
                     'or both False')
  expected = family_of(model_cfg).pretrain_objective(model_cfg)
  if objective != expected:
    stack = f'{model_cfg.family}' + ('' if model_cfg.causal else ' (causal=False)')
    raise ValueError(f'config.data.objective={objective!r} but a {stack} model pre-trains '
                     f'with {expected!r}; set --config.data.objective={expected} or use the '
                     'config of the family that objective trains')


def check_same_config(config) -> None:
  """Refuses a multi-process run whose processes were given different configs: each would train
  with its own (e.g. its learning rate on its replica), and on a fresh workdir nothing else
  compares them. (One process: gather_json gives no others.)"""
  first, *others = agreement.gather_json(json.loads(config.to_json()))
  for i, other in enumerate(others, 1):
    shown = [f'{k}: {a!r} on process 0, {b!r} on process {i}'
             for k, a, b in workdir_lib.differing(first, other)]
    if shown:
      raise ValueError(f'the processes of this run were given different configs '
                       f'({"; ".join(shown[:5])}); expected the same command, flags and config '
                       'file on every host')


@contextlib.contextmanager
def stop_on_unreadable_data(checkpointer, step: int):
  """A data read that failed for good (data.DataReadError: its client's retries spent) ends the
  run in one line: the file, the step, and the checkpoint the same command resumes from."""
  try:
    yield
  except data.DataReadError as e:
    if jax.process_count() == 1:   # (on several, a peer may be in a step, not in an agreement)
      with contextlib.suppress(Exception):   # a failed save is its own line (close)
        checkpointer.wait()
    try:   # (the storage that failed the read may fail the listing too)
      done = ckpt_lib.complete_steps(checkpointer.workdir)
      newest = f'step {done[-1]}' if done else 'none'
    except Exception as listing_failed:
      newest = f'unknown (listing it failed too: {type(listing_failed).__name__})'
    raise data.DataReadError(
        f'{e}; stopped training after step {step}. The newest complete checkpoint is {newest}: '
        'once the data can be read, rerun the same command to resume from it') from e


def close_at_end(iterator):
  """An ExitStack exit for a data iterator. A multi-process run that raised leaves it open: its
  process leaves at once (cli._exit), and waiting for the prefetch thread's read would let a
  peer's exit take the coordination service down under this process, which then aborts."""
  def close(exc_type, exc, tb):
    del exc, tb
    if exc_type is None or jax.process_count() == 1:
      iterator.close()
  return close


def train_and_evaluate(config, workdir: str, *, datasets=None, data=None, init_params=None,
                       evaluators=(), tokenizer_path: str = '', tokenizer=None,
                       adapter=None) -> dict:
  """Trains `config` in `workdir` (one trainer: lock.hold), resuming from its newest good
  checkpoint; returns a summary. Fine-tuning passes `datasets` and their `tokenizer_path`, `data`
  (its section), `init_params(fresh_params) -> params` (unless resuming) and `evaluators`
  (params -> metrics added to each evaluation). `tokenizer`: see open_datasets. `adapter` (a
  lora.Adapter, step.make_steps): the state holds LoRA factors and a head, not the model."""
  run = RunConfig.from_config(config, data)
  t, model_cfg = run.train, run.model
  workdir_lib.check_not_foreign(workdir)
  with contextlib.ExitStack() as cleanup:   # runs last to first, whatever raised
    check_held = cleanup.enter_context(lock_lib.hold(workdir, t.steps))
    mesh = mesh_lib.make_mesh(run.mesh)
    mesh_lib.check_config(t, model_cfg, mesh, jax.process_count())
    check_same_config(config)
    steps = step_lib.make_steps(model_cfg, t, mesh, max_predictions=step_lib.max_predictions(
        t, run.data), init_length=run.data.seq_len, adapter=adapter)
    model_cfg = steps.model_config            # its compute dtype resolved for the mesh
    if datasets is None:
      check_objective(model_cfg, run.data.objective, run.data.nsp)
    # A step folder the storage would not read counts: no fresh start over checkpoints.
    found = listing.list_steps(ckpt_lib.checkpoint_dir(workdir))
    newest = max([*found.complete, *found.unreadable], default=None)
    workdir_lib.check_config(config, paths.resolve(workdir),   # before any data are prepared
                             untrained=newest == ckpt_lib.WEIGHTS_ONLY_STEP)
    train_iter, eval_iter, opened = open_datasets(run, datasets, workdir, tokenizer)
    for it in (train_iter, eval_iter):   # a prefetch thread ends with its run, not the process
      if callable(getattr(it, 'close', None)):
        cleanup.push(close_at_end(it))
    tokenizer_path = opened or tokenizer_path
    eval_start = eval_iter.get_state() if eval_iter is not None else None
    previous = workdir_lib.read_config(workdir) if newest is not None else None
    # Checked now, written once the state and data position restore: a refused resume leaves
    # config.json as it was, so the original command still resumes.
    workdir_lib.write_config(config, workdir, tokenizer_path, newest, is_writer=False)

    checkpointer = ckpt_lib.Checkpointer(workdir, keep=t.keep_checkpoints,
                                         async_save=t.async_checkpoints,
                                         timeout_sec=t.checkpoint_timeout_sec)
    state, where = None, ckpt_lib.checkpoint_dir(workdir)
    if newest not in (None, ckpt_lib.WEIGHTS_ONLY_STEP):
      state, data_state = checkpointer.restore(steps.abstract_state)   # (None: only step 0 left)
    if state is not None:
      train_iter.set_state(data_state)
      notes = [f'restored step {int(state.step)} from {where}']
    elif newest is not None:   # only an import's step 0 (WEIGHTS_ONLY_STEP): its weights, and
      state = steps.state_from(ckpt_lib.read_params(     # with this run's optimizer state
          where, ckpt_lib.WEIGHTS_ONLY_STEP, steps.abstract_state.params))
      notes = [f'starting from the weights of checkpoint 0 in {where} with a fresh optimizer '
               'state']
    else:
      state, notes = steps.create_state(t.seed), []
      if init_params is not None:
        state = state.replace(params=jax.device_put(init_params(state.params),
                                                    steps.state_shardings.params))
    workdir_lib.write_config(config, workdir, tokenizer_path, newest,
                             is_writer=jax.process_index() == 0)
    start = step = int(state.step)
    # Logs from `start`: a run that died before its first checkpoint logged steps this one logs.
    writer = metrics_lib.MetricWriter(workdir, resume_step=start)
    if start == t.steps:   # the restored step, not the newest listed (a damaged one falls back)
      notes.append(f'{workdir} is already at train.steps={t.steps}: nothing to train')
    old_steps = previous['train']['steps'] if previous else None
    notes += [start and opt_lib.schedule_change(t, old_steps, start), opt_lib.warmup_warning(t),
              f'{model_cfg.family}: {optax.tree_utils.tree_size(state.params):,} parameters'
              + (f' trained, {optax.tree_utils.tree_size(adapter.frozen):,} frozen'
                 if adapter is not None else '') + f', mesh {dict(mesh.shape)}, computing '
              f'in {jnp.dtype(model_cfg.dtype).name}, steps {start}..{t.steps}',
              *implementation_notes(model_cfg)]   # attention paths other than the config says
    for note in filter(None, notes):
      writer.line(note)

    peak_flops = metrics_lib.peak_flops_per_device(t.peak_tflops) * jax.device_count()
    profiler = profiler_lib.StepProfiler(t, workdir, start, writer.line)
    stop, clock = StopRequest(), metrics_lib.StepClock()
    pending, window, last, eval_metrics = [], [], {}, {}   # window: the steps since the last row
    cleanup.callback(writer.close)
    cleanup.callback(stop.close)            # only after the final save: a second SIGTERM waits
    cleanup.callback(profiler.stop)         # (a run that ended inside the traced steps)
    cleanup.push(lambda raised, *_: checkpointer.close(raised is not None))  # the last save
    while step < t.steps:
      with stop_on_unreadable_data(checkpointer, step):
        batch = global_batch(next(train_iter), steps.batch_sharding)
      if step == start:
        tokens_per_step, flops_per_step = cost.batch_cost(
            model_cfg, batch, steps.max_predictions, t.freeze_backbone)
      profiler.before(step)
      state, metrics = steps.train_step(state, batch)
      step += 1
      checkpointer.poll(step)               # a failed background save stops the run now
      pending.append((step, metrics))       # (fetched at the next log, eval or save point)
      clock.stepped(metrics)
      if profiler.after_step(step, metrics) or profiler.active:
        clock.pause()                       # traced steps are not training throughput
      stopping, end = stop.agreed(), step == t.steps
      log_now = end or stopping or step % t.log_every == 0
      eval_now = t.eval_every > 0 and (end or step % t.eval_every == 0)
      save_now = end or stopping or step % t.checkpoint_every == 0
      if log_now or eval_now or save_now:
        pending = jax.device_get(pending)
        check_finite(pending, checkpointer.set_aside_diverged)   # never log or save past a NaN
        checkpointer.check()
        window, pending = window + [m for _, m in pending], []
      if log_now:
        last, window = metrics_lib.interval_mean(window), []
        step_time = clock.lap()             # None after the compiling step or traced ones only
        if step_time:
          last.update(step_time_sec=step_time, tokens_per_sec=tokens_per_step / step_time,
                      mfu=flops_per_step / step_time / peak_flops,
                      eta_sec=clock.eta(t.steps - step))
          # tok/s counts every position the step computes (MFU's terms); this host's share of
          # them that is not padding says how much of it is text.
          real = getattr(train_iter, 'real_fraction', None)
          if real is not None:
            last['non_padding_fraction'] = real
        writer.write(step, last)
        writer.line(metrics_lib.progress_line(step, t.steps, last))
      if eval_now:
        eval_iter.set_state(eval_start)     # the same batches every time
        with stop_on_unreadable_data(checkpointer, step):
          eval_metrics = eval_lib.evaluate(
              steps.eval_step, state.params,
              (global_batch(b, steps.batch_sharding) for b in eval_iter), t.eval_batches)
        for evaluator in evaluators:
          eval_metrics.update(evaluator(state.params))
        writer.write(step, eval_metrics, prefix='eval')
        writer.line(f'step {step}/{t.steps} | eval loss {eval_metrics["loss"]:.4f} | '
                    f'accuracy {_accuracy(eval_metrics):.3f}')
      if save_now:
        check_held(step)
        try:                    # gs:// buffers rows: those up to a checkpoint outlive a kill -9
          writer.flush()
        except Exception as e:  # the save matters more
          writer.line(f'warning: metrics not written before saving step {step} ({e}); saving')
        saved = checkpointer.save(step, state, train_iter.get_state())
      if eval_now or save_now:
        clock.pause()                       # not training throughput
      if stopping:
        checkpointer.wait()                 # announce only a complete checkpoint
        writer.line(f'{stop.name or "SIGTERM"}: {"saved" if saved else "kept checkpoint"} '
                    f'step {step}; exiting')
        break

  step_time = clock.mean_step_time()
  return {'family': model_cfg.family, 'dtype': jnp.dtype(model_cfg.dtype).name,
          'workdir': workdir, 'start_step': start, 'step': step,
          'steps': t.steps, 'preempted': stop.requested and step < t.steps,
          'stop_requested': stop.requested,
          'train_loss': last.get('loss'), 'eval_loss': eval_metrics.get('loss'),
          'eval_accuracy': _accuracy(eval_metrics), 'eval_metrics': eval_metrics,
          'tokens_per_sec': tokens_per_step / step_time if step_time else None,
          'non_padding_fraction': getattr(train_iter, 'real_fraction', None),
          'step_time_sec': step_time,
          'params': optax.tree_utils.tree_size(state.params),
          'checkpoint_steps': ckpt_lib.complete_steps(workdir)}
