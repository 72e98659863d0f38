"""Learning-rate schedules and optimizers (optax), from `config.train` (a checked TrainConfig)."""
import jax
import jax.numpy as jnp
import optax

from pretrain_jax.training.config import TrainConfig


def make_schedule(t: TrainConfig) -> optax.Schedule:
  """Linear warmup from 0 to `learning_rate` over `warmup_steps`, then `schedule`: cosine /
  linear decay to `final_lr_fraction * learning_rate` at `steps`, T5's rsqrt
  (`learning_rate * sqrt(warmup_steps / step)`) or constant."""
  peak, warmup = float(t.learning_rate), int(t.warmup_steps)
  end = peak * float(t.final_lr_fraction)
  decay_steps = max(int(t.steps) - warmup, 1)
  if t.schedule == 'cosine':
    decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=end / peak)
  elif t.schedule == 'linear':
    decay = optax.linear_schedule(peak, end, decay_steps)
  elif t.schedule == 'rsqrt':
    def decay(step):
      return peak * jax.lax.rsqrt(jnp.maximum(step + warmup, 1.0) / max(warmup, 1))
  else:
    decay = optax.constant_schedule(peak)
  if warmup == 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def warmup_warning(t: TrainConfig):
  """The warning for a run that is all warmup (a lowered train.steps keeps the config's
  warmup: the learning rate never reaches its peak), or None."""
  if t.warmup_steps >= t.steps > 0:
    return (f'warning: train.warmup_steps={t.warmup_steps} >= train.steps={t.steps}: the whole '
            'run is warmup and the learning rate peaks at '
            f'{float(make_schedule(t)(t.steps - 1)):.3g}, not the configured '
            f'{t.learning_rate} (lower --config.train.warmup_steps)')
  return None


def schedule_change(t: TrainConfig, old_steps, step: int):
  """The notice for a resume that changes train.steps under a decay that ends there (cosine,
  linear), or None."""
  if old_steps in (None, t.steps) or t.schedule not in ('cosine', 'linear'):
    return None
  old = t.replace(steps=int(old_steps))
  before, after = (f'{float(make_schedule(s)(step)):.3g}' for s in (old, t))
  change = f'goes {before} -> {after}' if before != after else f'stays {before}' + (
      ' (still in warmup)' if step < t.warmup_steps else '')
  return (f'note: train.steps {old_steps} -> {t.steps} moves the end of the {t.schedule} decay: '
          f'the learning rate at step {step} {change}')


def decay_mask(params):
  """True where weight decay applies: kernels and embedding tables, not norms or biases."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: not jax.tree_util.keystr(path[-1:], simple=True).endswith(('bias', 'scale')),
      params)


def make_optimizer(t: TrainConfig) -> optax.GradientTransformation:
  """Global-norm clip (if grad_clip > 0), then AdamW or Adafactor; the optimizer state takes
  the parameters' dtype (fp32 under mixed precision)."""
  schedule = make_schedule(t)
  if t.optimizer == 'adamw':
    tx = optax.adamw(schedule, b1=float(t.adam_b1), b2=float(t.adam_b2),
                     eps=1e-8, weight_decay=float(t.weight_decay), mask=decay_mask)
  else:
    # T5's Adafactor: factored second moments, update clipping at 1, parameter-scale updates.
    tx = optax.adafactor(schedule, weight_decay_rate=float(t.weight_decay) or None,
                         weight_decay_mask=decay_mask)
  if t.grad_clip > 0:
    tx = optax.chain(optax.clip_by_global_norm(float(t.grad_clip)), tx)
  return tx


def train_only(tx: optax.GradientTransformation, names: tuple) -> optax.GradientTransformation:
  """`tx` on the top-level parameters in `names` (a probe's head); the others get a zero update
  and no optimizer state."""
  def labels(params):
    missing = sorted(set(names) - set(params))
    if missing:
      raise ValueError(f'trainable parameters {missing} are not in the model; expected some '
                       f'of {sorted(params)}')
    return {k: jax.tree.map(lambda _, k=k: 'train' if k in names else 'frozen', v)
            for k, v in params.items()}
  return optax.multi_transform({'train': tx, 'frozen': optax.set_to_zero()}, labels)
