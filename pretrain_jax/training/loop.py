"""train_and_evaluate(config, workdir): the training loop, top to bottom.

Side effects (files, logs, signals, checkpoints) happen here; the step itself is pure.
"""
import functools
import json
import math
import os
import signal

import jax
import numpy as np

from pretrain_jax import paths
from pretrain_jax.models import family_of
from pretrain_jax.models.attention import implementation_notes
from pretrain_jax.training import agreement
from pretrain_jax.training import checkpoint as ckpt_lib
from pretrain_jax.training import evaluate as eval_lib
from pretrain_jax.training import lock as lock_lib
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import optimizer as opt_lib
from pretrain_jax.training import profiler as profiler_lib
from pretrain_jax.training import metrics as metrics_lib
from pretrain_jax.training import state as state_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training import workdir as workdir_lib
from pretrain_jax.training.config import RunConfig


def open_datasets(run: RunConfig, datasets=None, workdir=None, tokenizer=None):
  """(train iterator, eval iterator or None, tokenizer path) of this host's share of the batch.

  `datasets(split=, batch_size=, process_index=, process_count=, repeat=)` replaces
  pretrain_jax.data (tests pass synthetic data); by default the source is opened and the
  tokenizer loaded (with a `workdir`: the run's one prepared copy and, with no data.tokenizer,
  the workdir's one tokenizer: workdir_lib.shared_source / shared_tokenizer) and checked
  against the model's vocabulary. A `tokenizer` given is used as it is: the caller loaded it
  from `config.data.tokenizer` and checked that its ids fit the model (pretrain-jax train: a
  Hugging Face tokenizer directory, which this layer does not read).
  """
  tokenizer_path = ''
  d, model_cfg = run.data, run.model
  if datasets is None:
    from pretrain_jax import data  # pylint: disable=g-import-not-at-top  (pulls in tensorflow)
    source = workdir_lib.shared_source(d, workdir) if workdir is not None else None
    if tokenizer is None:
      tokenizer = (workdir_lib.shared_tokenizer(d, workdir, source) if workdir is not None
                   else data.load_tokenizer(d))
      if tokenizer.vocab_size != model_cfg.vocab_size:
        raise ValueError(f'config.model.vocab_size={model_cfg.vocab_size} but the tokenizer '
                         f'has {tokenizer.vocab_size} pieces; set --config.model.vocab_size='
                         f'{tokenizer.vocab_size}')
    datasets = functools.partial(data.make_dataset, d, tokenizer, source=source)
    tokenizer_path = getattr(tokenizer, 'path', '') or d.tokenizer
  host_batch = run.train.batch_size // jax.process_count()
  kw = dict(batch_size=host_batch, process_index=jax.process_index(),
            process_count=jax.process_count(), model_max_len=model_cfg.max_len)
  # Validation reads the split once, in order, as pretrain-jax evaluate does (the same batches,
  # so the same numbers): with data streams a repeating small split would carry documents of
  # its next epoch into the first batches.
  # No evaluation (train.eval_every <= 0): no validation split is opened, so a corpus without
  # one (data.validation_fraction=0) trains.
  evaluates = run.train.eval_every > 0
  return (datasets(split=d.train_split, repeat=True, **kw),
          datasets(split=d.eval_split, repeat=False, **kw) if evaluates else None,
          tokenizer_path)


def _accuracy(metrics: dict):
  """The headline accuracy: a classifier's (class_accuracy) where there is one, else the LM's."""
  return metrics.get('class_accuracy', metrics.get('lm_accuracy'))


def global_batch(batch: dict, sharding) -> dict:
  """This host's numpy batch -> one global jax.Array per key, split over the batch axes."""
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in batch.items()}


class StopRequest:
  """SIGTERM (Cloud TPU preemption notice) or Ctrl-C (SIGINT) sets a flag the loop polls after
  each step: it saves that step and stops. A second SIGTERM is ignored until the save is
  complete; a second Ctrl-C raises KeyboardInterrupt: no save of the current step (one already
  being written still completes). A SIGINT the process was started ignoring (`nohup ... &`)
  stays ignored."""

  def __init__(self):
    self.requested, self.name, self._lagged = False, None, agreement.Lagged()
    signals = [signal.SIGTERM] + ([signal.SIGINT] if signal.getsignal(signal.SIGINT)
                                  is not signal.SIG_IGN else [])
    self._previous = {s: signal.signal(s, self._handler) for s in signals}

  def _handler(self, signum, frame):
    del frame
    name = signal.Signals(signum).name
    if self.requested:  # stays installed until the final save is complete
      if signum == signal.SIGINT:
        raise KeyboardInterrupt
      os.write(2, f'{name} again: save in progress; ignoring it\n'.encode())
      return
    self.requested, self.name = True, name
    if signum == signal.SIGINT:
      os.write(2, b'Ctrl-C: saving after this step, then stopping (Ctrl-C again: stop now, '
                  b'without this save)\n')

  def agreed(self) -> bool:
    """True on every process, after the same step, when any process got the signal (on several,
    agreement.Lagged.LAG steps after it)."""
    flags = self._lagged.agree([self.requested])
    if flags is None or not flags.any():
      return False
    self.requested = True                 # (another process's notice: this one stops too)
    return True

  def close(self):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)


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


def check_objective(model_cfg, objective: str, data_nsp: bool = False) -> None:
  """Refuses a data.objective the model does not train with: a bidirectional encoder given
  next-token targets would read each target in its own input; and NSP on one side only (data
  pairs with no head to train, or a head that never sees a label)."""
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


def train_and_evaluate(config, workdir: str, *, datasets=None, data=None, init_params=None,
                       evaluators=(), tokenizer_path: str = '', tokenizer=None) -> dict:
  """Trains `config` in `workdir` (resuming from its newest good checkpoint); returns a summary.

  One trainer per workdir (lock.hold); an incompatible config is refused before
  anything in the workdir changes. Fine-tuning (pretrain_jax/finetune) passes
  `init_params(fresh_params) -> params` (the checkpoint's weights put into a fresh state; not
  used when resuming) and `evaluators`: callables params -> dict of metrics added to each
  evaluation (T5's exact match by decoding), and with its `datasets` the `tokenizer_path` of
  their sentencepiece model, which the workdir keeps a copy of (as a pre-training run's), and
  `data`, its data section read (a TaskDataConfig; default DataConfig.from_config(config.data)).
  `tokenizer`: one loaded from config.data.tokenizer by the caller (see open_datasets).
  Every section is built and checked here, before the workdir is touched."""
  run = RunConfig.from_config(config, data)
  workdir_lib.check_not_foreign(workdir)
  with lock_lib.hold(workdir, run.train.steps) as check_held:
    return _train_and_evaluate(config, run, workdir, datasets=datasets, init_params=init_params,
                               evaluators=evaluators, check_held=check_held,
                               tokenizer_path=tokenizer_path, tokenizer=tokenizer)


def check_same_config(config) -> None:
  """Refuses a multi-process run whose processes were given different configs (a flag or a
  config file that differs on one host): each would train with its own, e.g. its own learning
  rate on its replica of the weights, and nothing else compares them on a fresh workdir."""
  if jax.process_count() == 1:
    return
  everyone = [workdir_lib.flatten(c)
              for c in agreement.gather_json(json.loads(config.to_json()))]
  missing = '<absent>'
  for i, other in enumerate(everyone[1:], 1):
    keys = sorted(k for k in set(everyone[0]) | set(other)
                  if everyone[0].get(k, missing) != other.get(k, missing))
    if keys:
      shown = '; '.join(f'{k}: {everyone[0].get(k, missing)!r} on process 0, '
                        f'{other.get(k, missing)!r} on process {i}' for k in keys[:5])
      raise ValueError(f'the processes of this run were given different configs ({shown}); '
                       'expected the same command, flags and config file on every host')


def _train_and_evaluate(config, run: RunConfig, workdir: str, *, datasets=None, init_params=None,
                        evaluators=(), check_held=lambda step: None,
                        tokenizer_path: str = '', tokenizer=None) -> dict:
  t, model_cfg = run.train, run.model
  mesh = mesh_lib.make_mesh(run.mesh)
  mesh_lib.check_config(t, model_cfg, mesh, jax.process_count())
  check_same_config(config)
  steps = step_lib.make_steps(model_cfg, t, mesh, max_predictions=step_lib.max_predictions(
      t, run.data), init_length=run.data.seq_len)

  if datasets is None:
    check_objective(model_cfg, run.data.objective, run.data.nsp)
  newest = (ckpt_lib.complete_steps(workdir) or [None])[-1]
  workdir_lib.check_config(config, paths.absolute(workdir),   # before any data are prepared
                           untrained=newest == ckpt_lib.WEIGHTS_ONLY_STEP)
  train_iter, eval_iter, opened = open_datasets(run, datasets, workdir, tokenizer)
  tokenizer_path = opened or tokenizer_path
  eval_start = eval_iter.get_state() if eval_iter is not None else None
  previous = workdir_lib.read_config(workdir) if newest is not None else None
  # Checked now, recorded once the state and data position restore: a refused resume leaves
  # config.json as it was, so the original command still resumes.
  workdir_lib.write_config(config, workdir, tokenizer_path, newest, is_writer=False)

  # State: restored from the latest checkpoint (onto this mesh), else created in its shards.
  checkpointer = ckpt_lib.Checkpointer(workdir, keep=t.keep_checkpoints,
                                       async_save=t.async_checkpoints,
                                       timeout_sec=t.checkpoint_timeout_sec)
  state = None
  if newest not in (None, ckpt_lib.WEIGHTS_ONLY_STEP):
    state, data_state = checkpointer.restore(steps.abstract_state)   # (None: only step 0 left)
  if state is not None:
    train_iter.set_state(data_state)
    restored = f'restored step {int(state.step)} from {ckpt_lib.checkpoint_dir(workdir)}'
  else:
    restored = None
    state = steps.create_state(t.seed)
    if ckpt_lib.WEIGHTS_ONLY_STEP in checkpointer.all_steps():   # an import: its weights, and
      state = state.replace(params=checkpointer.restore_params(  # this run's optimizer state
          steps.abstract_state.params, ckpt_lib.WEIGHTS_ONLY_STEP))
      restored = (f'starting from the weights of checkpoint 0 in '
                  f'{ckpt_lib.checkpoint_dir(workdir)} with a fresh optimizer state')
    elif init_params is not None:
      state = state.replace(params=jax.device_put(init_params(state.params),
                                                  steps.state_shardings.params))
  config = workdir_lib.write_config(config, workdir, tokenizer_path, newest,
                                    is_writer=jax.process_index() == 0)
  # From the restored step, or 0: a run that died before its first checkpoint logged steps this
  # one logs again.
  writer = metrics_lib.MetricWriter(workdir, resume_step=int(state.step))
  start = int(state.step)
  if restored:
    writer.line(restored)
  if start == t.steps:   # the restored step, not the newest listed (a damaged one falls back)
    writer.line(f'{workdir} is already at train.steps={t.steps}: nothing to train')
  note = start and opt_lib.schedule_change(t, previous['train']['steps'] if previous else None,
                                           start)
  if note:
    writer.line(note)
  warning = opt_lib.warmup_warning(t)
  if warning:
    writer.line(warning)
  writer.line(f'{model_cfg.family}: {state_lib.count_params(state.params):,} parameters, '
              f'mesh {dict(mesh.shape)}, steps {start}..{t.steps}')
  for note in implementation_notes(model_cfg):   # attention paths other than the config says
    writer.line(note)

  batch_sharding = steps.batch_sharding
  peak_flops = metrics_lib.peak_flops_per_device(t.peak_tflops) * jax.device_count()

  profiler = profiler_lib.StepProfiler(t, workdir, start, writer.line)
  stop = StopRequest()
  history, window, last, eval_metrics = [], [], {}, {}   # window: the steps since the last row
  clock = metrics_lib.StepClock()
  step = start
  try:
    while step < t.steps:
      batch = global_batch(next(train_iter), batch_sharding)
      if step == start:
        tokens_per_step, flops_per_step = metrics_lib.batch_cost(
            model_cfg, batch, steps.max_predictions, t.freeze_backbone)
      profiler.before(step)
      state, metrics = steps.train_step(state, batch)
      step += 1
      checkpointer.poll(step)                    # a failed background save stops the run now
      history.append((step, metrics))
      clock.stepped(metrics)
      if profiler.after_step(step, metrics) or profiler.active:
        clock.pause()                            # traced steps are not training throughput
      stopping = stop.agreed()
      log_now = step % t.log_every == 0 or step == t.steps or stopping
      eval_now = t.eval_every > 0 and (step % t.eval_every == 0 or step == t.steps)
      save_now = step % t.checkpoint_every == 0 or step == t.steps or stopping
      if log_now or eval_now or save_now:
        history = [(s, jax.device_get(m)) for s, m in history]
        check_finite(history)                   # never log or save past a NaN
        checkpointer.check()
        window += [m for _, m in history]
        history = []
      if log_now:
        last, window = metrics_lib.interval_mean(window), []
        step_time = clock.lap()                  # None after the first (compiling) step, or
                                                 # traced ones (paused)
        if step_time:
          last.update(step_time_sec=step_time, tokens_per_sec=tokens_per_step / step_time,
                      mfu=flops_per_step / step_time / peak_flops,
                      eta_sec=clock.eta(t.steps - step))
          # tokens_per_sec counts every position the step computes (MFU's terms); this
          # host's share of them that is not padding says how much of it is text
          real = getattr(train_iter, 'real_fraction', None)
          if real is not None:
            last['non_padding_fraction'] = real
        writer.write(step, last)
        writer.line(metrics_lib.progress_line(step, t.steps, last))
      if eval_now:
        eval_iter.set_state(eval_start)          # the same batches every time
        eval_metrics = eval_lib.evaluate(
            steps.eval_step, state.params,
            (global_batch(b, batch_sharding) for b in eval_iter), t.eval_batches)
        for evaluator in evaluators:
          eval_metrics.update(evaluator(state.params))
        writer.write(step, eval_metrics, prefix='eval')
        writer.line(f'step {step}/{t.steps} | eval loss {eval_metrics["loss"]:.4f} | '
                    f'accuracy {_accuracy(eval_metrics):.3f}')
      if save_now:
        check_held(step)
        try:                    # gs:// buffers rows: those up to a checkpoint outlive a kill -9
          writer.flush()
        except Exception as e:  # pylint: disable=broad-exception-caught  (the save matters more)
          writer.line(f'warning: metrics not written before saving step {step} ({e}); saving')
        checkpointer.save(step, state, train_iter.get_state())
      if eval_now or save_now:
        clock.pause()                            # not training throughput
      if stopping:
        checkpointer.wait()                      # announce only a complete checkpoint
        writer.line(f'{stop.name or "SIGTERM"}: saved step {step}; exiting')
        break
  finally:
    try:
      checkpointer.close()                       # waits for the last asynchronous save
    finally:
      try:
        profiler.stop()                          # (a run that ended inside the traced steps)
      finally:
        stop.close()                             # only now: a second SIGTERM must not kill it
        writer.close()

  step_time = clock.mean_step_time()
  return {'family': model_cfg.family, 'workdir': workdir, 'start_step': start, 'step': step,
          'steps': t.steps, 'preempted': stop.requested and step < t.steps,
          'stop_requested': stop.requested,
          'train_loss': last.get('loss'), 'eval_loss': eval_metrics.get('loss'),
          'eval_accuracy': _accuracy(eval_metrics), 'eval_metrics': eval_metrics,
          'tokens_per_sec': tokens_per_step / step_time if step_time else None,
          'non_padding_fraction': getattr(train_iter, 'real_fraction', None),
          'step_time_sec': step_time, 'params': state_lib.count_params(state.params),
          'checkpoint_steps': checkpointer.all_steps()}
