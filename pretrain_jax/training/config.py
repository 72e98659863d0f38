"""The train, mesh and lora sections of a config, as frozen dataclasses (pretrain_jax/sections.py).

Each field's comment is its documentation. Checks that read two sections are called where both
are known: mesh.check_config, loop.check_objective, data.check_lengths. No JAX here: configs/
and the commands' flags import this module before a command's flags are checked.
"""
import dataclasses
from typing import Any, ClassVar, NamedTuple

from pretrain_jax.data.config import DataConfig
from pretrain_jax.sections import Section

OPTIMIZERS = ('adamw', 'adafactor')
SCHEDULES = ('cosine', 'linear', 'rsqrt', 'constant')
MESH_AXES = ('data', 'fsdp', 'tensor')
FLOAT32_MAX = 3.4028234663852886e38   # numpy.finfo(numpy.float32).max
# LoRA's target names -> the Dense2D modules each adapts (the names every family's layers use)
TARGETS = {'q': ('query',), 'k': ('key',), 'v': ('value',), 'o': ('out',),
           'mlp': ('wi', 'wi_0', 'wi_1', 'wo')}


@dataclasses.dataclass(frozen=True)
class TrainConfig(Section):
  """config.train: the optimisation and the loop's cadences."""
  SECTION: ClassVar[str] = 'train'

  batch_size: int                   # global batch (sequences per step, summed over all hosts)
  steps: int                        # total optimizer steps
  learning_rate: float              # peak learning rate
  warmup_steps: int                 # linear warmup from 0 to the peak
  schedule: str = 'cosine'          # after warmup: 'cosine', 'linear', 'rsqrt' or 'constant'
  final_lr_fraction: float = 0.1    # cosine/linear decay ends at this share of the peak
  optimizer: str = 'adamw'          # 'adamw' or 'adafactor'
  adam_b1: float = 0.9              # AdamW first-moment decay
  adam_b2: float = 0.999            # AdamW second-moment decay (0.95 is common for GPTs)
  weight_decay: float = 0.01        # decoupled; never on norms, biases or embedding scales
  grad_clip: float = 1.0            # global-norm clip; 0 disables
  microbatches: int = 1             # gradient accumulation: batch_size splits into this many
  z_loss: float = 0.0               # coefficient of log(Z)^2 in the loss (0 disables)
  fused_loss: bool = True           # LM head + cross-entropy with their gradients made in the
                                    # forward pass, a chunk at a time (training/fused_loss.py):
                                    # no (B, T, V) logits kept, no matmul recomputed; False =
                                    # autodiff of the head's logits (the reference)
  loss_chunk_len: int = 0           # positions per chunk of the LM head + cross-entropy: fused,
                                    # 0 = fused_loss.CHUNK_LEN (128); autodiff, recomputed in
                                    # the backward pass, 0 = the whole sequence at once
  max_predictions_per_seq: int = -1  # LM head only on this many loss-weighted positions per
                                    # row (exact: a fuller row runs them all); -1 = the MLM
                                    # objective's bound (128 of 512), 0 = every position
  fp8: bool = False                 # dense layers in fp8 (ops/fp8.py); NVIDIA GPUs of
                                    # compute capability >= 8.9 only (H100, L4, ...)
  seed: int = 0                     # parameter init and dropout randomness
  prng_impl: str = 'threefry2x32'   # dropout key's PRNG (jax.random.key impl); 'philox4x32'
                                    # is cheaper on XLA:CPU, one device only; 'rbg', ...
  log_every: int = 10               # steps between progress lines / TensorBoard scalars
  eval_every: int = 100             # steps between validation losses (0 disables)
  eval_batches: int = 4             # batches per validation loss (0 = the whole split)
  checkpoint_every: int = 100       # steps between checkpoints, > 0 (a final one is always
                                    # saved: a value >= steps saves only at the end)
  keep_checkpoints: int = 3         # checkpoints kept on disk; 0 keeps all
  async_checkpoints: bool = True    # write checkpoints in the background while training goes on
  checkpoint_timeout_sec: int = 1200  # several hosts: how long orbax's commit barriers wait for
                                    # a host whose save failed before every host stops with it
  allow_config_change: str = ''     # resume: comma-separated keys that may differ from the
                                    # workdir's config.json (workdir.ALLOWABLE_KEYS)
  peak_tflops: float = 0.0          # per-device peak for the MFU estimate; 0 = guess from device
  profile_steps: int = 0            # jax.profiler trace of this many steps (0: none)
  profile_start_step: int = 0       # ... after this step (never the first, compiling one)
  freeze_backbone: bool = False     # train only the active heads' parameters (a linear probe)

  def validate(self) -> None:
    self.check(self.batch_size > 0, 'batch_size', 'a positive number of sequences')
    self.check(self.steps > 0, 'steps', 'a positive number of steps')
    # The schedule and the update run in float32: a larger rate becomes inf there.
    self.check(0 < self.learning_rate <= FLOAT32_MAX, 'learning_rate',
               f'a rate > 0 that float32 holds (<= {FLOAT32_MAX:.4g})')
    self.check(self.warmup_steps >= 0, 'warmup_steps', 'a number of steps >= 0')
    self.check(self.schedule in SCHEDULES, 'schedule', f'one of {SCHEDULES}')
    self.check(self.schedule not in ('cosine', 'linear') or 0 <= self.final_lr_fraction <= 1,
               'final_lr_fraction', f'a value in [0, 1] (the {self.schedule} decay ends at that '
               'fraction of train.learning_rate)')
    self.check(self.optimizer in OPTIMIZERS, 'optimizer', f'one of {OPTIMIZERS}')
    for name in ('adam_b1', 'adam_b2'):
      self.check(0 <= getattr(self, name) < 1, name, 'a value in [0, 1)')
    for name in ('weight_decay', 'z_loss', 'grad_clip'):
      self.check(getattr(self, name) >= 0, name, 'a number >= 0 (0 turns it off)')
    self.check(self.microbatches > 0, 'microbatches', 'a positive number of microbatches')
    self.check(self.loss_chunk_len >= 0, 'loss_chunk_len',
               'a number of positions >= 0 (0 = all at once)')
    self.check(self.max_predictions_per_seq >= -1, 'max_predictions_per_seq',
               '-1 (the MLM bound), 0 (every position) or a positive number of positions per '
               'row')
    self.check(self.log_every > 0, 'log_every', 'a positive number of steps '
               '(train.log_every >= train.steps logs only the last step)')
    self.check(self.checkpoint_every > 0, 'checkpoint_every', 'a positive number of steps (a '
               'final checkpoint is always saved: train.checkpoint_every >= train.steps saves '
               'only at the end)')
    self.check(self.eval_batches >= 0, 'eval_batches',
               '>= 0 batches per evaluation (0 = the whole split)')
    self.check(self.keep_checkpoints >= 0, 'keep_checkpoints', '>= 0 (0 keeps all)')
    self.check(self.checkpoint_timeout_sec > 0, 'checkpoint_timeout_sec',
               "a positive number of seconds (orbax's default is 1200)")
    for name in ('profile_steps', 'profile_start_step'):
      self.check(getattr(self, name) >= 0, name,
                 'a number of steps >= 0 (train.profile_steps=0 traces nothing)')


@dataclasses.dataclass(frozen=True)
class MeshConfig(Section):
  """config.mesh: the device mesh's axis sizes (training/mesh.py)."""
  SECTION: ClassVar[str] = 'mesh'

  data: int = -1                    # pure data parallelism; -1 = all devices left over
  fsdp: int = 1                     # parameters and optimizer state sharded over this axis
  tensor: int = 1                   # heads / mlp / vocab split over this axis

  @property
  def sizes(self) -> dict:
    return {axis: getattr(self, axis) for axis in MESH_AXES}

  def validate(self) -> None:
    sizes = list(self.sizes.values())
    if any(s == 0 or s < -1 for s in sizes) or sizes.count(-1) > 1:
      raise ValueError(f'config.mesh {self.sizes}: expected positive sizes and at most one -1')


@dataclasses.dataclass(frozen=True)
class LoraConfig(Section):
  """config.lora of a fine-tune in mode 'lora' (training/lora.py applies it)."""
  SECTION: ClassVar[str] = 'lora'

  rank: int = 8                     # r: the rank of each update A @ B
  alpha: float = 16.0               # the update is scaled by alpha / rank
  targets: str = 'q,k,v,o,mlp'      # comma-separated: attention q, k, v, o and the MLP's
                                    # kernels (wi / wi_0 / wi_1 / wo) of every layer
  learning_rate: float = 1e-3       # the peak rate of a LoRA fine-tune (the factors start at
                                    # zero update and take a larger one than full fine-tuning);
                                    # 0 = train.learning_rate
  base: str = ''                    # filled in: the exact checkpoint the adapter was trained on
  base_fingerprint: str = ''        # filled in: lora.fingerprint() of its frozen weights

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  @property
  def target_names(self) -> tuple:
    return tuple(t.strip() for t in self.targets.split(',') if t.strip())

  def validate(self) -> None:
    self.check(self.rank >= 1, 'rank', 'a positive rank')
    self.check(self.alpha > 0, 'alpha', 'a positive scale numerator (the update is '
               'alpha / rank * A @ B)')
    names = self.target_names
    self.check(bool(names) and all(t in TARGETS for t in names) and len(set(names)) == len(names),
               'targets', f'distinct comma-separated names of {", ".join(TARGETS)}')
    self.check(self.learning_rate >= 0, 'learning_rate',
               '0 (train.learning_rate) or a positive rate')


class RunConfig(NamedTuple):
  """The sections a pre-training run reads, built once from its ConfigDict."""
  model: Any          # models.ModelConfig
  train: TrainConfig
  mesh: MeshConfig
  data: Any           # DataConfig, or a fine-tune's TaskDataConfig

  @classmethod
  def from_config(cls, config, data=None) -> 'RunConfig':
    """`data`: the data section already read (a fine-tune's); default config.data."""
    # (imported here: configs/ import this module, the model section imports jax)
    from pretrain_jax.models.config import ModelConfig  # noqa: PLC0415 (JAX)
    run = cls(ModelConfig.from_config(config.model), TrainConfig.from_config(config.train),
              MeshConfig.from_config(config.mesh),
              DataConfig.from_config(config.data) if data is None else data)
    # Checked before the model is built: initialising it traces a row of seq_len, whose dense
    # mask alone would not fit in memory for a seq_len far past max_len.
    if run.data.seq_len > run.model.max_len:
      raise ValueError(f'config.data.seq_len={run.data.seq_len} is longer than the model holds '
                       f'(max_len={run.model.max_len})')
    return run
