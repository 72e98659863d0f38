"""A `jax.profiler` trace of a few train steps, written where TensorBoard finds it.

`train.profile_steps=N` traces N steps (default 0: none), starting after step
`train.profile_start_step` or after this run's first step, whichever is later (the first step
compiles; a trace of it is mostly compiler). The trace goes to
`<workdir>/tensorboard/plugins/profile/<time>/`: `<host>.xplane.pb` (TensorBoard's Profile tab,
`pip install tensorboard-plugin-profile`) and `perfetto_trace.json.gz` (ui.perfetto.dev, nothing
to install). On a gs:// workdir it is written locally and copied there when the trace stops.
Only process 0 traces (one host's view, as one host's progress line). With
`profile_start_step=0` every (re)start of the run traces once; a window that a resume has
passed is not traced again. A trace that fails says so and the run goes on.
"""
import tempfile

import jax

from pretrain_jax import paths
from pretrain_jax.training.config import TrainConfig


class StepProfiler:
  """Starts the trace before its first step and stops it once its last step has finished."""

  def __init__(self, t: TrainConfig, workdir: str, start: int, line):
    self.steps, asked = t.profile_steps, t.profile_start_step
    self.after = max(asked, start + 1)            # never the compiling step
    self.target = paths.join(paths.absolute(workdir), 'tensorboard')
    self.local, self.last, self.line = None, self.after, line
    self.enabled = self.steps > 0 and jax.process_index() == 0
    if not self.enabled:
      return
    if asked and start >= asked + self.steps:     # a resume past the window asked for
      self.enabled = False
    elif self.after >= t.steps:
      self.enabled = False
      line(f'note: train.profile_steps={self.steps} traces nothing: the trace would start after '
           f'step {self.after}, and this run ends at train.steps={t.steps}')

  @property
  def active(self) -> bool:
    return self.local is not None

  def before(self, step: int) -> None:
    """Called with the number of steps done before the next one runs."""
    if not (self.enabled and not self.active and step == self.after):
      return
    self.enabled = False                          # one trace per run
    local = (tempfile.mkdtemp(prefix='pretrain_jax-profile-')
             if paths.is_remote(self.target) else self.target)
    try:
      jax.profiler.start_trace(local, create_perfetto_trace=True)
    except Exception as e:  # pylint: disable=broad-exception-caught  (not worth a run)
      self.line(f'warning: the profile could not start ({type(e).__name__}: {e}); training on')
      return
    self.local = local

  def after_step(self, step: int, outputs) -> bool:
    """Called with the steps done and the last step's outputs: stops after the last one
    (True then)."""
    if self.active:
      self.last = step
      if step >= self.after + self.steps:
        self.stop(outputs)
        return True
    return False

  def stop(self, outputs=None) -> None:
    if not self.active:
      return
    local, self.local = self.local, None
    try:
      try:
        jax.block_until_ready(outputs)        # the traced steps' device work, not just dispatch
      finally:
        jax.profiler.stop_trace()
      if local != self.target:
        paths.copy_tree(local, self.target)
        paths.rmtree(local)
    except Exception as e:  # pylint: disable=broad-exception-caught  (a trace is not worth a run)
      self.line(f'warning: the profile of steps {self.after + 1}..{self.last} was not written '
                f'to {self.target} ({type(e).__name__}: {e}); anything written is in {local}')
      return
    self.line(f'profile of steps {self.after + 1}..{self.last} written to '
              f'{paths.join(self.target, "plugins", "profile")} (TensorBoard\'s Profile tab, '
              'or perfetto_trace.json.gz at ui.perfetto.dev)')
