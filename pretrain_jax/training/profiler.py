"""A `jax.profiler` trace of a few train steps, written where TensorBoard finds it.

`train.profile_steps=N` traces N steps (default 0: none), starting after step
`train.profile_start_step` or after this run's first step, whichever is later (the first step
compiles; a trace of it is mostly compiler). The trace goes to
`<workdir>/tensorboard/plugins/profile/<time>/`: `<host>.xplane.pb` (TensorBoard's Profile tab,
`pip install tensorboard-plugin-profile`) and `perfetto_trace.json.gz` (ui.perfetto.dev, nothing
to install). On a gs:// workdir it is written locally and copied there when the trace stops.
Only process 0 traces (one host's view, as one host's progress line).
"""
import tempfile

import jax

from pretrain_jax import paths


def check_config(t) -> None:
  """Refuses profile values the loop cannot use (before anything is written)."""
  for key in ('profile_steps', 'profile_start_step'):
    value = t.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
      raise ValueError(f'train.{key}={value!r}; expected a number of steps >= 0 '
                       '(train.profile_steps=0 traces nothing)')


class StepProfiler:
  """Starts the trace before its first step and stops it once its last step has finished."""

  def __init__(self, t, workdir: str, start: int, line):
    self.steps = t.get('profile_steps', 0)
    self.after = max(t.get('profile_start_step', 0), start + 1)   # never the compiling step
    self.enabled = self.steps > 0 and jax.process_index() == 0 and self.after < t.steps
    self.target = paths.join(paths.absolute(workdir), 'tensorboard')
    self.local, self.last = None, self.after
    self.line = line
    if self.steps > 0 and jax.process_index() == 0 and not self.enabled:
      line(f'note: train.profile_steps={self.steps} traces nothing: the trace would start after '
           f'step {self.after}, and this run ends at train.steps={t.steps}')

  @property
  def active(self) -> bool:
    return self.local is not None

  def before(self, step: int) -> None:
    """Called with the number of steps done before the next one runs."""
    if self.enabled and not self.active and step == self.after:
      self.local = (tempfile.mkdtemp(prefix='pretrain_jax-profile-')
                    if paths.is_remote(self.target) else self.target)
      jax.profiler.start_trace(self.local, create_perfetto_trace=True)

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
    try:
      jax.block_until_ready(outputs)          # the traced steps' device work, not just dispatch
    finally:
      jax.profiler.stop_trace()
      local, self.local, self.enabled = self.local, None, False
    if local != self.target:
      try:
        paths.copy_tree(local, self.target)
      except Exception as e:  # pylint: disable=broad-exception-caught
        self.line(f'warning: the profile could not be copied to {self.target} ({e}); it is '
                  f'kept in {local}')   # (a trace is not worth stopping a run for)
        return
      paths.rmtree(local)
    self.line(f'profile of steps {self.after + 1}..{self.last} written to '
              f'{paths.join(self.target, "plugins", "profile")} (TensorBoard\'s Profile tab, '
              'or perfetto_trace.json.gz at ui.perfetto.dev)')
