"""train.profile_steps: a `jax.profiler` trace of a few train steps under
`<workdir>/tensorboard/plugins/profile/` (docs/training.md#profiling-a-run). Only process 0
traces; on a gs:// workdir it traces locally and copies the trace there when it stops.
"""
import tempfile

import jax
from etils import epath

from pretrain_jax import paths


class StepProfiler:
  """Starts the trace before step `after` + 1 (never the first, compiling step) and stops it once
  its last step has finished. One trace per (re)start, none in a window a resume has passed; a
  trace that fails is a warning and training goes on."""

  def __init__(self, t, workdir: str, start: int, line):
    self.steps, self.after = t.profile_steps, max(t.profile_start_step, start + 1)
    self.target = paths.resolve(workdir) / 'tensorboard'
    self.local, self.last, self.line = None, self.after, line
    passed = t.profile_start_step and start >= t.profile_start_step + self.steps
    self.enabled = self.steps > 0 and jax.process_index() == 0 and not passed
    if self.enabled and self.after >= t.steps:
      self.enabled = False
      line(f'note: train.profile_steps={self.steps} traces nothing: the trace would start after '
           f'step {self.after}, and this run ends at train.steps={t.steps}')

  @property
  def active(self) -> bool:
    return self.local is not None

  def before(self, step: int) -> None:
    """Called with the number of steps done before the next one runs."""
    if not self.enabled or step != self.after:
      return
    self.enabled = False
    local = (epath.Path(tempfile.mkdtemp(prefix='pretrain_jax-profile-'))
             if paths.is_remote(self.target) else self.target)
    try:
      jax.profiler.start_trace(str(local), create_perfetto_trace=True)
      self.local = local
    except Exception as e:  # not worth a run
      self.line(f'warning: the profile could not start ({type(e).__name__}: {e}); training on')

  def after_step(self, step: int, outputs) -> bool:
    """Called with the steps done and the last step's outputs: True when it stops the trace."""
    if self.active:
      self.last = step
      if step >= self.after + self.steps:
        self.stop(outputs)
        return True
    return False

  def stop(self, outputs=None) -> None:
    if not self.active:
      return
    local, self.local, steps = self.local, None, f'steps {self.after + 1}..{self.last}'
    try:
      try:
        jax.block_until_ready(outputs)        # the traced steps' device work, not just dispatch
      finally:
        jax.profiler.stop_trace()
      if local != self.target:
        paths.copy_tree(local, self.target)
        local.rmtree()
    except Exception as e:  # a trace is not worth a run
      self.line(f'warning: the profile of {steps} was not written to {self.target} '
                f'({type(e).__name__}: {e}); anything written is in {local}')
      return
    self.line(f'profile of {steps} written to {self.target / "plugins" / "profile"} '
              '(TensorBoard\'s Profile tab, or perfetto_trace.json.gz at ui.perfetto.dev)')
