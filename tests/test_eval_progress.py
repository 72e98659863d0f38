"""Progress lines: pretrain-jax evaluate over a long split (it printed nothing until the end) and
the train loop's."""
import io

import numpy as np
import pytest

from pretrain_jax.run import metrics as metrics_lib
from pretrain_jax.training import evaluate as eval_lib


def _step(params, batch):
  del params
  sums = {'lm': np.float32(batch['loss_sum']), 'lm_z_loss': np.float32(0),
          'lm_correct': np.float32(1)}
  return sums, {'lm': np.float32(4)}


def test_progress_lines_carry_the_running_loss_rate_and_eta():
  ticks = iter([0.0, 10.0, 15.0, 20.0, 35.0])   # the clock at start, then after each batch
  out = io.StringIO()
  progress = metrics_lib.Progress(total=4, every_s=10.0, out=out, clock=lambda: next(ticks))
  batches = [{'loss_sum': s} for s in (8.0, 4.0, 12.0, 0.0)]
  metrics = eval_lib.evaluate(_step, None, iter(batches), 4, progress=progress)
  lines = out.getvalue().splitlines()
  # a line 10 s or more after the previous one: t=10 (loss 8/4), t=20 (24/12), t=35 (24/16);
  # not t=15
  assert lines == ['eval 1/4 batches | loss 2.0000 | 0.1 batches/s | eta 0:00:30',
                   'eval 3/4 batches | loss 2.0000 | 0.1 batches/s | eta 0:00:06',
                   'eval 4/4 batches | loss 1.5000 | 0.1 batches/s | eta 0:00:00']
  assert metrics['batches'] == 4 and metrics['loss'] == 1.5


def test_a_whole_split_has_no_eta():
  out = io.StringIO()
  progress = metrics_lib.Progress(total=0, every_s=0.0, out=out, clock=iter([0.0, 2.0]).__next__)
  eval_lib.evaluate(_step, None, iter([{'loss_sum': 6.0}]), 0, progress=progress)
  assert out.getvalue() == 'eval 1 batches | loss 1.5000 | 0.5 batches/s\n'


def test_train_progress_says_how_much_of_the_throughput_is_padding():
  scalars = dict(loss=2.5, learning_rate=1e-3, grad_norm=0.5, tokens_per_sec=12345.6, mfu=0.25,
                 eta_sec=3725, non_padding_fraction=0.4213)
  assert metrics_lib.progress_line(7, 100, scalars) == (
      'step 7/100 | loss 2.5000 | lr 1.00e-03 | gnorm 0.50 | 12,346 tok/s (42% not padding) | '
      'mfu 25.0% | eta 1:02:05')
  packed = dict(scalars, non_padding_fraction=0.998)
  assert '12,346 tok/s | mfu' in metrics_lib.progress_line(7, 100, packed)


def test_train_eta_is_the_runs_wall_pace_with_its_evaluations_and_saves():
  """Step time leaves evaluations and saves out (throughput); the ETA did too, and so came
  short by all the evaluations still to run. It is now the wall pace since the first step."""
  now = [0.0]
  clock = metrics_lib.StepClock(clock=lambda: now[0])
  clock.stepped(np.float32(0))          # the first (compiling) step ends at t=0
  for _ in range(4):                    # 4 steps of 1 s
    now[0] += 1.0
    clock.stepped(None)
  assert clock.lap() == 1.0 and clock.eta(10) == 10.0
  now[0] += 6.0                         # an evaluation of 6 s
  clock.pause()
  for _ in range(4):
    now[0] += 1.0
    clock.stepped(None)
  assert clock.lap() == 1.0             # throughput: steps only
  assert clock.eta(10) == 10 * 14.0 / 8  # 8 steps took 14 s of wall time
  assert clock.mean_step_time() == 1.0


def test_interval_mean_of_a_huge_loss_logs_an_infinite_perplexity():
  """math.exp overflowed (OverflowError, a crash) where jnp.exp gave inf: a finite but
  diverging loss must still be logged, and check_finite stop the run when it is not finite."""
  rows = [dict(loss=1000.0, lm_loss=1000.0, lm_perplexity=float('inf'), learning_rate=0.1,
               grad_norm=3.0, state_finite=1.0)] * 2
  out = metrics_lib.interval_mean(rows)
  assert out['lm_perplexity'] == float('inf') and out['loss'] == 1000.0
  small = metrics_lib.interval_mean([dict(rows[0], lm_loss=1.0), dict(rows[0], lm_loss=3.0)])
  assert small['lm_perplexity'] == pytest.approx(np.exp(2.0))


def test_interval_rows_compute_mcc_and_f1_from_the_summed_confusion():
  """Two steps, each of one class only (their own MCC 0, as evaluation defines it): the row's
  MCC is that of the interval's counts, here every example right (1.0), not the steps' mean."""
  base = dict(loss=0.5, learning_rate=0.1, grad_norm=1.0, state_finite=1.0, class_loss=0.5,
              class_accuracy=1.0, class_mcc=0.0, class_f1=0.0)
  rows = [dict(base, class_confusion=np.array([[3.0, 0.0], [0.0, 0.0]], np.float32)),
          dict(base, class_confusion=np.array([[0.0, 0.0], [0.0, 5.0]], np.float32))]
  out = metrics_lib.interval_mean(rows)
  assert out['class_mcc'] == pytest.approx(1.0) and out['class_f1'] == pytest.approx(1.0)
  assert 'class_confusion' not in out and out['class_accuracy'] == 1.0
  # Against a reference: sklearn's formulas on 3 right of class 0, 1 wrong and 4 right of 1.
  rows[1]['class_confusion'] = np.array([[0.0, 1.0], [0.0, 4.0]], np.float32)
  out = metrics_lib.interval_mean(rows)
  tp, tn, fp, fn = 4.0, 3.0, 1.0, 0.0
  mcc = (tp * tn - fp * fn) / np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
  assert out['class_mcc'] == pytest.approx(mcc, rel=1e-6)
  assert out['class_f1'] == pytest.approx(2 * tp / (2 * tp + fp + fn), rel=1e-6)
