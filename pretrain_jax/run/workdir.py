"""The run's files in its workdir: one reader (`read_config`) and one writer (`write_config`).

  config.json                      the config of the latest (re)start (rewritten only on a change)
  config_history/<n>_step<k>.json  every config.json written; k: the checkpoint step it started at
  tokenizer.model                  the run's sentencepiece model (config.json's data.tokenizer)
  prepared_data/                   local files prepared once for every process (shared_source)

Order at start (sections already built and checked): `check_not_foreign`, `lock.hold`,
`check_config` (before any data are opened), then `write_config` once the data and tokenizer
are known (it checks again, then records).
"""
import json

import jax
import jax.numpy as jnp
import ml_collections
from flax import traverse_util

from pretrain_jax import data, paths
from pretrain_jax.data.config import TaskConfig, data_section
from pretrain_jax.models import ModelConfig
from pretrain_jax.models.config import AUTO, auto_dtype
from pretrain_jax.run import agreement
from pretrain_jax.training.config import MeshConfig, TrainConfig

CONFIG_FILE = 'config.json'
TOKENIZER_FILE = 'tokenizer.model'
HISTORY_DIR = 'config_history'

# Keys a resume may change freely: when, how often and how much to train, not what the state is.
FREE_KEYS = ('train.steps', 'train.log_every', 'train.eval_every', 'train.eval_batches',
             'train.checkpoint_every', 'train.keep_checkpoints', 'train.async_checkpoints',
             'train.checkpoint_timeout_sec',
             'train.peak_tflops', 'train.profile_steps', 'train.profile_start_step',
             'train.allow_config_change', 'train.loss_chunk_len', 'train.fused_loss',
             'train.max_predictions_per_seq', 'data.tokenizer', 'data.tfds_data_dir',
             'data.prepared_dir', 'data.num_parallel_calls', 'data.prefetch', 'data.eval_split',
             'data.num_streams',   # the data position holds the resolved count, and checks it
             'task.pairs')         # derived from the task, whose name and labels are checked
# Keys a resume may change when named in train.allow_config_change: the optimization changes,
# the state and data stream keep their meaning.
ALLOWABLE_KEYS = ('train.learning_rate', 'train.warmup_steps', 'train.schedule',
                  'train.final_lr_fraction', 'train.weight_decay', 'train.grad_clip',
                  'train.adam_b1', 'train.adam_b2', 'train.z_loss', 'train.microbatches',
                  'train.seed', 'train.prng_impl', 'train.fp8')
# Model keys that say how the weights run, not what they are: a run starting from an import's
# weights (checkpoint 0) may set them (the import writes the defaults: dtype and attention_impl
# 'auto', no remat); a trained checkpoint's resume may not.
RUN_MODEL_KEYS = ('model.dtype', 'model.attention_impl', 'model.remat', 'model.dropout_rate',
                  'model.attention_dropout_rate', 'model.mlp_dropout', 'model.embedding_dropout')
# Every other key but mesh.* (checkpoints restore onto any mesh) must match config.json, e.g.
# train.batch_size: each data stream fills a fixed number of rows of every batch.


def is_hf_config(saved) -> bool:
  """True for a Hugging Face config.json's contents (a `model_type` or `architectures`, no
  `train` section): the one rule for "is this a Hugging Face directory"."""
  return isinstance(saved, dict) and 'train' not in saved and (
      'model_type' in saved or 'architectures' in saved)


def check_not_foreign(workdir: str) -> None:
  """Refuses a Hugging Face model directory as a workdir, before anything is written into it."""
  try:
    saved = read_config(workdir)
  except ValueError:
    return                       # the config check names a broken config.json
  if is_hf_config(saved):
    kind = next(f'{key} {saved[key]!r}' for key in ('model_type', 'architectures') if key in saved)
    raise ValueError(f'{workdir} is a Hugging Face model directory (config.json has '
                     f'{kind}); expected a training workdir: '
                     f'import it first (pretrain-jax convert_hf import --hf_dir {workdir} '
                     '--workdir NEW_DIR) and train there')


def differing(a: dict, b: dict) -> list:
  """(key, a's value, b's value) of each flattened key ('train.learning_rate') where two nested
  config dicts differ, sorted; a key one lacks has the value '<absent>'."""
  a, b = traverse_util.flatten_dict(a, sep='.'), traverse_util.flatten_dict(b, sep='.')
  return [(k, a.get(k, '<absent>'), b.get(k, '<absent>')) for k in sorted(a.keys() | b.keys())
          if a.get(k, '<absent>') != b.get(k, '<absent>')]


def config_differences(saved: dict, requested: dict, allowed: str = '') -> list:
  """The refused differences between two configs, as 'key: old -> new' lines. `allowed` is
  train.allow_config_change: comma-separated keys of ALLOWABLE_KEYS (others: ValueError)."""
  allowed = [k.strip() for k in (allowed or '').split(',') if k.strip()]
  bad = [k for k in allowed if k not in ALLOWABLE_KEYS]
  if bad:
    raise ValueError(f'train.allow_config_change names {", ".join(bad)}; only these keys may '
                     f'change on resume: {", ".join(ALLOWABLE_KEYS)} (model and data-stream '
                     'keys never: train a new workdir instead)')
  return [f'{k}: {a!r} -> {b!r}' for k, a, b in differing(saved, requested)
          if k not in FREE_KEYS and k not in allowed and not k.startswith('mesh.')]


def resolved(config: dict) -> dict:
  """`config` with each section as the dataclass it means (defaults filled in), so a
  config.json written before a field existed compares equal to one that spells it out."""
  sections = {'model': ModelConfig.from_config, 'train': TrainConfig.from_config,
              'mesh': MeshConfig.from_config, 'task': TaskConfig.from_config,
              'data': data_section}
  out = dict(config)
  for name, read in sections.items():
    try:
      out[name] = read(config[name]).to_dict()
    except (KeyError, TypeError, ValueError):   # absent, or not one this version reads: raw
      pass
  return out


def read_config(workdir: str):
  """The workdir's config.json as a dict; None when there is none."""
  path = paths.resolve(workdir) / CONFIG_FILE
  return paths.read_json(path) if path.is_file() else None


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a workdir was trained with, for loading it; a tokenizer path that no longer
  exists (the workdir was moved) is pointed at the workdir's copy."""
  saved = read_config(workdir)
  if saved is None:
    raise FileNotFoundError(f'{paths.resolve(workdir) / CONFIG_FILE} not found; expected a '
                            'workdir written by pretrain-jax train')
  config = ml_collections.ConfigDict(saved)
  copy = paths.resolve(workdir) / TOKENIZER_FILE
  moved = not (config.data.tokenizer and paths.resolve(config.data.tokenizer).exists())
  if moved and copy.is_file():
    config.data.tokenizer = str(copy)
  return config


def check_config(config, workdir: str, untrained: bool = False):
  """Refuses `config` where it differs from the workdir's config.json in a key that may not
  change; returns the saved config (None: none yet). `untrained`: the newest checkpoint is an
  import's step 0, so only the model must match (the run brings its own train and data)."""
  saved = read_config(workdir)
  if saved is not None:
    _keep_recorded_dtype(saved, config)
    lines = config_differences(resolved(saved), resolved(config.to_dict()),
                               TrainConfig.from_config(config.train).allow_config_change)
    if untrained:
      lines = [line for line in lines if line.startswith('model.') and
               line.split(':')[0] not in RUN_MODEL_KEYS]
      if lines:
        raise ValueError(f'the model differs from the one imported into {workdir} (checkpoint 0 '
                         f'holds its weights): {"; ".join(lines)}. Keep the import\'s model '
                         f'({", ".join(RUN_MODEL_KEYS)} may change), or import again '
                         '(pretrain-jax convert_hf import) into a new workdir')
    if lines:
      raise ValueError(f'the config differs from {paths.resolve(workdir) / CONFIG_FILE} (the '
                       f'checkpoints were trained with it): {"; ".join(lines)}. Resume with '
                       'the same settings, name safe keys in --config.train.allow_config_change, '
                       'or use a new workdir')
  return saved


def _keep_recorded_dtype(saved: dict, config) -> None:
  """A run recorded with an explicit model.dtype resumes under model.dtype='auto' (the
  published configs' default) where 'auto' computes in that dtype on this host's devices: the
  recorded value stays (a CPU run recorded as float32 resumes; on a TPU, where 'auto' means
  bfloat16, the difference is still refused)."""
  recorded = (saved.get('model') or {}).get('dtype')
  if (config.get('model') is None or config.model.get('dtype') != AUTO or recorded in (None, AUTO)
      or jnp.dtype(auto_dtype(jax.devices()[0])).name != recorded):
    return
  with config.unlocked():
    config.model.dtype = recorded


def write_config(config, workdir: str, tokenizer_path: str, start_step,
                 is_writer: bool = True) -> ml_collections.ConfigDict:
  """Checks `config` against the workdir's config.json, then records it (`is_writer`: process
  0), with the tokenizer's copy; nothing is written when it is refused or unchanged. Returns the
  config as saved. `start_step`: the newest checkpoint's step (None: a fresh workdir)."""
  config = ml_collections.ConfigDict(config.to_dict())
  root = paths.resolve(workdir)
  copy = root / TOKENIZER_FILE
  found = bool(tokenizer_path) and paths.resolve(tokenizer_path).is_file()
  copy_needed = found and paths.resolve(tokenizer_path) != copy
  if copy_needed and copy.is_file() and _differ(tokenizer_path, copy):
    raise ValueError(f'tokenizer {tokenizer_path} differs from the one this workdir was '
                     f'trained with ({copy}); resume with that one or use a new workdir')
  if found:
    config.data.tokenizer = str(copy)
  saved = check_config(config, root, untrained=start_step == 0)   # (an import's step 0)
  if saved is None and start_step is not None:
    raise ValueError(f'{root} holds checkpoints (newest step {start_step}) but no '
                     f'{CONFIG_FILE}; restore it or use a new workdir')
  if not is_writer:
    return config
  if copy_needed and not copy.is_file():
    paths.copy(tokenizer_path, copy)
  text = config.to_json(indent=2, sort_keys=True)
  if saved is None or json.loads(text) != saved:
    history = root / HISTORY_DIR
    n = len(list(history.glob('*.json')))
    if saved is not None and not n:   # an import's config.json: kept as the first version
      paths.write_atomic(history / f'0_step{start_step or 0}.json',
                         json.dumps(saved, indent=2, sort_keys=True))
      n = 1
    paths.write_atomic(history / f'{n}_step{start_step or 0}.json', text)
    paths.write_atomic(root / CONFIG_FILE, text)
  return config


def _differ(a, b) -> bool:
  return paths.resolve(a).read_bytes() != paths.resolve(b).read_bytes()


def shared_source(data_config, workdir: str):
  """The data source every process reads: process 0 prepares local files / the embedded corpus
  once (in `<workdir>/prepared_data` on several processes, unless data.prepared_dir is set)
  while the others wait, so no host-local cache matters for correctness."""
  from pretrain_jax.data import sources  # noqa: PLC0415 (TensorFlow)
  count = jax.process_count()
  return sources.open_source(
      data_config, data_dir=sources.prepared_dir(data_config, workdir, count),
      process_index=jax.process_index(),
      sync=(lambda name: agreement.gather_json(name)[0]) if count > 1 else None)


def shared_tokenizer(data_config, workdir: str, source=None):
  """The tokenizer every process uses: `data.tokenizer` when set; else the workdir's copy,
  which process 0 makes (trained on `source`, or from the cache: data.load_tokenizer) while the
  others wait. Once config.json exists the copy is the run's."""
  if data_config.tokenizer:
    return data.load_tokenizer(data_config)
  copy = paths.resolve(workdir) / TOKENIZER_FILE
  # A copy without config.json is a refused first run's: it may come from other data.* settings,
  # so it is replaced by the one these settings make (the config check guards the rest).
  if jax.process_index() == 0 and not (copy.is_file() and read_config(workdir) is not None):
    made = data.load_tokenizer(data_config, source).path
    if not copy.is_file() or _differ(made, copy):
      paths.copy(made, copy)
  agreement.barrier('pretrain_jax: the workdir tokenizer is written')
  return data.Tokenizer(str(copy))
