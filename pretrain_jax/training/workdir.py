"""The run's files in its workdir: one reader (`read_config`) and one writer (`write_config`).

Files (process 0 writes them; nothing here runs inside the jitted step):
  config.json                  the config of the latest (re)start, written atomically, and only
                               when it changes
  config_history/<n>_step<k>.json  every config.json written; k = the checkpoint step it started at
  tokenizer.model              the run's sentencepiece model (config.json's data.tokenizer)
  prepared_data/               local files prepared once for every process (shared_source)
The lock is `lock.py`'s, the checkpoints (state, data position, checksums) `checkpoint.py`'s.

Before anything else touches the workdir (the config's sections already built, so their values
are checked): `check_not_foreign`, `lock.hold`, `check_config` (before any data are opened),
then `write_config` once the data and tokenizer are known (it checks again, then records).
"""
import json

import jax
import ml_collections
from flax import traverse_util

from pretrain_jax import paths
from pretrain_jax.data.config import TaskConfig, data_section
from pretrain_jax.models import ModelConfig
from pretrain_jax.training import agreement
from pretrain_jax.training.config import MeshConfig, TrainConfig

CONFIG_FILE = 'config.json'
TOKENIZER_FILE = 'tokenizer.model'
HISTORY_DIR = 'config_history'

# Keys a resume may change freely: when, how often and how much to train, not what the state is.
FREE_KEYS = ('train.steps', 'train.log_every', 'train.eval_every', 'train.eval_batches',
             'train.checkpoint_every', 'train.keep_checkpoints', 'train.async_checkpoints',
             'train.checkpoint_timeout_sec',
             'train.peak_tflops', 'train.profile_steps', 'train.profile_start_step',
             'train.allow_config_change', 'train.loss_chunk_len',
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
# weights (checkpoint 0) may set them (the import writes float32, reference attention, no
# remat); a trained checkpoint's resume may not.
RUN_MODEL_KEYS = ('model.dtype', 'model.attention_impl', 'model.remat', 'model.dropout_rate',
                  'model.attention_dropout_rate', 'model.mlp_dropout', 'model.embedding_dropout')
# Every other key (model.*, the data fields that define the token stream, train.optimizer,
# train.batch_size: each data stream fills a fixed number of rows of every batch; mesh.* is
# free: checkpoints restore onto any mesh) must match the workdir's config.json.


def is_hf_config(saved) -> bool:
  """True for a Hugging Face config.json's contents: a `model_type` (or `architectures`) and no
  `train` section, which every training workdir's config.json has. The one rule for "is this a
  Hugging Face directory" (hf.is_hf_dir, check_not_foreign, pretrain-jax evaluate)."""
  return isinstance(saved, dict) and 'train' not in saved and (
      'model_type' in saved or 'architectures' in saved)


def check_not_foreign(workdir: str) -> None:
  """Refuses a Hugging Face model directory as a workdir, before the lock or a tokenizer is
  written into it (its config.json then read as a changed config, in a 3 KB message)."""
  path = paths.join(workdir, CONFIG_FILE)
  if not paths.isfile(path):
    return
  try:
    saved = paths.read_json(path)
  except ValueError:
    return                       # the config check names a broken config.json
  if is_hf_config(saved):
    kind = (f'model_type {saved["model_type"]!r}' if 'model_type' in saved
            else f'architectures {saved.get("architectures")!r}')
    raise ValueError(f'{workdir} is a Hugging Face model directory (config.json has '
                     f'{kind}); expected a training workdir: '
                     f'import it first (pretrain-jax convert_hf import --hf_dir {workdir} '
                     '--workdir NEW_DIR) and train there')


def flatten(d: dict) -> dict:
  """{'train.learning_rate': value} of a config's nested dict."""
  return traverse_util.flatten_dict(d, sep='.')


def config_differences(saved: dict, requested: dict, allowed: str = '') -> list:
  """The refused differences between two configs, as 'key: old -> new' lines.

  `allowed` is train.allow_config_change: comma-separated keys of ALLOWABLE_KEYS. Naming any
  other key is itself refused (ValueError).
  """
  allowed = [k.strip() for k in (allowed or '').split(',') if k.strip()]
  bad = [k for k in allowed if k not in ALLOWABLE_KEYS]
  if bad:
    raise ValueError(f'train.allow_config_change names {", ".join(bad)}; only these keys may '
                     f'change on resume: {", ".join(ALLOWABLE_KEYS)} (model and data-stream '
                     'keys never: train a new workdir instead)')
  old, new = flatten(saved), flatten(requested)
  missing = '<absent>'
  lines = []
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key, missing), new.get(key, missing)
    if a != b and key not in FREE_KEYS and key not in allowed and not key.startswith('mesh.'):
      lines.append(f'{key}: {a!r} -> {b!r}')
  return lines


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
  path = paths.join(workdir, CONFIG_FILE)
  return paths.read_json(path) if paths.isfile(path) else None


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a workdir was trained with, for loading it. A tokenizer path that no longer
  exists (the workdir was moved) is pointed at the workdir's copy."""
  saved = read_config(workdir)
  if saved is None:
    raise FileNotFoundError(f'{paths.join(workdir, CONFIG_FILE)} not found; expected a workdir '
                            'written by pretrain-jax train')
  config = ml_collections.ConfigDict(saved)
  copy = paths.join(paths.absolute(workdir), TOKENIZER_FILE)
  if not paths.exists(config.data.tokenizer or '') and paths.isfile(copy):
    config.data.tokenizer = copy
  return config


def check_config(config, workdir: str, untrained: bool = False):
  """Refuses `config` where it differs from the workdir's config.json in a key that may not
  change (config_differences); returns the saved config (None: none yet). The train loop calls
  it before the data are opened, so a changed `data.files` is refused before it is prepared.
  `untrained`: the newest checkpoint is step 0, weights no step of this workdir trained (an
  import, pretrain-jax convert_hf), so only the model must match: the run starts from them with
  its own train, data and optimizer settings."""
  saved = read_config(workdir)
  if saved is not None:
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
      raise ValueError(f'the config differs from {paths.join(workdir, CONFIG_FILE)} (the '
                       f'checkpoints were trained with it): {"; ".join(lines)}. Resume with '
                       'the same settings, name safe keys in --config.train.allow_config_change, '
                       'or use a new workdir')
  return saved


def write_config(config, workdir: str, tokenizer_path: str, start_step,
                 is_writer: bool = True) -> ml_collections.ConfigDict:
  """Checks `config` against the workdir's config.json, then records it (process 0 only).

  Returns the config as saved (`data.tokenizer` names the workdir's copy when there is one).
  Nothing is written when the config is refused or unchanged. `start_step` is the newest
  checkpoint's step (None: a fresh workdir).
  """
  config = ml_collections.ConfigDict(config.to_dict())
  root = paths.absolute(workdir)
  copy = paths.join(root, TOKENIZER_FILE)
  tokenizer_found = bool(tokenizer_path) and paths.isfile(tokenizer_path)
  copy_needed = tokenizer_found and paths.absolute(tokenizer_path) != copy
  if tokenizer_found:
    if copy_needed and paths.isfile(copy) and not _same_bytes(tokenizer_path, copy):
      raise ValueError(f'tokenizer {tokenizer_path} differs from the one this workdir was '
                       f'trained with ({copy}); resume with that one or use a new workdir')
    config.data.tokenizer = copy
  saved = check_config(config, root, untrained=start_step == 0)   # (an import's step 0)
  if saved is None and start_step is not None:
    raise ValueError(f'{root} holds checkpoints (newest step {start_step}) but no '
                     f'{CONFIG_FILE}; restore it or use a new workdir')
  if not is_writer:
    return config
  if copy_needed and not paths.isfile(copy):
    paths.copy(tokenizer_path, copy)   # atomic: a local temporary file renamed, or one object
  text = config.to_json(indent=2, sort_keys=True)
  if saved is None or json.loads(text) != saved:
    history = paths.join(root, HISTORY_DIR)
    n = len([f for f in paths.listdir(history) if f.endswith('.json')])
    if saved is not None and not n:   # an import's config.json: kept as the first version
      paths.write_text(paths.join(history, f'0_step{start_step or 0}.json'),
                       json.dumps(saved, indent=2, sort_keys=True))
      n = 1
    paths.write_text(paths.join(history, f'{n}_step{start_step or 0}.json'), text)
    paths.write_text(paths.join(root, CONFIG_FILE), text)
  return config


def _same_bytes(a: str, b: str) -> bool:
  return paths.read_bytes(a) == paths.read_bytes(b)


def shared_source(data_config, workdir: str):
  """The data source every process reads: local files / the embedded corpus are prepared once,
  by process 0, in sources.prepared_dir (on several processes `<workdir>/prepared_data` unless
  data.prepared_dir is set) while the others wait at a barrier and then open that one copy,
  so no host-local cache matters for correctness. Each host reads its streams' shares of it."""
  from pretrain_jax.data import sources  # pylint: disable=g-import-not-at-top  (tensorflow)
  count = jax.process_count()
  return sources.open_source(
      data_config, data_dir=sources.prepared_dir(data_config, workdir, count),
      process_index=jax.process_index(),
      sync=(lambda name: agreement.gather_json(name)[0]) if count > 1 else None)


def shared_tokenizer(data_config, workdir: str, source=None):
  """The tokenizer every process uses: `data.tokenizer` when set; else `<workdir>/tokenizer.model`,
  which process 0 creates (trained once on `source`, or copied from its cache:
  data.load_tokenizer) while the others wait at a barrier, so all hosts load the same file and
  no host-local cache matters for correctness. Once config.json exists the copy is the run's."""
  from pretrain_jax import data  # pylint: disable=g-import-not-at-top  (pulls in tensorflow)
  if data_config.tokenizer:
    return data.load_tokenizer(data_config)
  root = paths.absolute(workdir)
  copy = paths.join(root, TOKENIZER_FILE)
  # A copy without config.json is a refused first run's: it may come from other data.* settings,
  # so it is replaced by the one these settings make (the config check guards the rest).
  if jax.process_index() == 0 and not (paths.isfile(copy) and read_config(root) is not None):
    made = data.load_tokenizer(data_config, source).path
    if not (paths.isfile(copy) and _same_bytes(made, copy)):
      paths.copy(made, copy)
  agreement.barrier('pretrain_jax: the workdir tokenizer is written')
  return data.Tokenizer(copy)
