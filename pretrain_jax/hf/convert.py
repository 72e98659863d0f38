"""Hugging Face directory <-> training workdir (the layout of pretrain_jax.run.checkpoint).

Import writes, into a temporary directory renamed into place at the end:

  config.json             the full training config: the family's base config (configs/) with
                          the imported model section
  tokenizer.model         T5: a copy of spiece.model (the project's Tokenizer loads it)
  hf_tokenizer/           the HF tokenizer files as they came (BERT / GPT-2 / T5)
  checkpoints/0/          TrainState(step=0, imported params, fresh optimizer state); data
                          iterator state None ("start of the stream")

so `restore_params(workdir)` / `pretrain_jax.load_pretrained(workdir)` read it like any run.
A directory without tokenizer files imports with a warning in the summary, and data.tokenizer
names the absent hf_tokenizer/: loading text models from it refuses (naming the files it needs)
until they are copied there, instead of falling back to a tokenizer that does not fit.
Export reads a workdir's checkpoint (latest or `step`) and writes a HF directory, with
hf_tokenizer/'s files or those the family's record makes of the run's sentencepiece model
(T5: spiece.model; BERT / GPT-2: tokenizer.json + tokenizer_config.json, hf/spm.py).
"""
import tempfile

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from pretrain_jax import hf, paths
from pretrain_jax.data.config import TaskConfig
from pretrain_jax.hf import families
from pretrain_jax.hf import io as io_lib
from pretrain_jax.hf import tokenizers as tok_lib
from pretrain_jax.models import ModelConfig, family_of
from pretrain_jax.run import checkpoint as ckpt_lib
from pretrain_jax.run import workdir as train_workdir
from pretrain_jax.training import optimizer as opt_lib
from pretrain_jax.training import state as state_lib
from pretrain_jax.training.config import TrainConfig

HF_TOKENIZER_DIR = 'hf_tokenizer'


def model_section(cfg: ModelConfig) -> dict:
  """ModelConfig -> a config.model dict (dtypes by name; no eval/decode switches)."""
  return cfg.to_dict()


def training_config(cfg: ModelConfig, base):
  """The full ml_collections config for `cfg`: the base config's data, train and mesh sections
  with `cfg` as the model section."""
  config = ml_collections.ConfigDict(base.to_dict())
  config.model = ml_collections.ConfigDict(model_section(cfg))
  for key, value in families.of(cfg).data_settings(cfg, config.data).items():
    config.data[key] = value
  return config


def train_overrides(config, reference) -> list:
  """`--config.section.key=value` flags that turn the `reference` config into `config`.

  Model fields are compared as ModelConfigs, so a field the base file leaves at its default
  is only listed when the imported value differs from that default.
  """
  ours = model_section(ModelConfig.from_config(config.model))
  theirs = model_section(ModelConfig.from_config(reference.model))
  flags = [f'--config.model.{k}={v}' for k, v in sorted(ours.items()) if theirs[k] != v]
  ref_data = reference.data.to_dict()
  flags += [f'--config.data.{k}={v}' for k, v in sorted(config.data.to_dict().items())
            if ref_data.get(k) != v]
  return flags


def import_hf(hf_dir: str, workdir: str, base_config, *, base: str = None,
              **model_overrides) -> dict:
  """Imports the HF directory `hf_dir` as a new training workdir `workdir` (must not exist).

  `base_config(model_config, base) -> (name, ConfigDict)` gives the config whose data, train
  and mesh sections the workdir starts from (scripts pass configs.base_config: the library
  never imports configs/). Returns a summary: family, parameter count, tokenizer, and the
  pretrain-jax train flags that reproduce the imported model from its base config.
  """

  io_lib.check_free(workdir)  # before the (possibly long) read
  cfg, params, tokenizer = io_lib.load_hf(hf_dir, **model_overrides)
  base, reference = base_config(cfg, base)
  config = training_config(cfg, reference)
  final = paths.resolve(workdir)
  with io_lib.atomic_directory(final) as tmp:
    for path in map(paths.resolve, tok_lib.tokenizer_files(hf_dir)):
      paths.copy(path, tmp / HF_TOKENIZER_DIR / path.name)
    if isinstance(tokenizer, tok_lib.SentencePieceTokenizer):
      paths.copy(tokenizer.path, tmp / train_workdir.TOKENIZER_FILE)
      config.data.tokenizer = str(final / train_workdir.TOKENIZER_FILE)
    else:  # not sentencepiece (pretrain_jax.data cannot read it yet), or absent (a marker)
      config.data.tokenizer = str(final / HF_TOKENIZER_DIR)
    train_workdir.write_config(config, tmp, '', None)
    state_params = jax.tree.map(jnp.asarray, params)
    tx = opt_lib.make_optimizer(TrainConfig.from_config(config.train))
    state = state_lib.TrainState(step=jnp.zeros((), jnp.int32), params=state_params,
                                 opt_state=tx.init(state_params))
    checkpointer = ckpt_lib.Checkpointer(tmp, keep=0, async_save=False)
    checkpointer.save(0, state, None)
    checkpointer.close()
  summary = {'workdir': str(final), 'family': cfg.family, 'base_config': f'configs/{base}.py',
             'params': optax.tree_utils.tree_size(params),
             'tokenizer': type(tokenizer).__name__ if tokenizer is not None else None,
             'train_flags': train_overrides(config, reference)}
  if tokenizer is None:
    summary['warning'] = missing_tokenizer_message(hf_dir, cfg.family, final)
  return summary


def missing_tokenizer_message(hf_dir: str, family: str, workdir: str) -> str:
  """What a workdir imported without tokenizer files lacks, and where to put them."""
  expected = families.of(family).expected_files
  return (f'{hf_dir} has no tokenizer files (expected {expected}); the model in {workdir} has no '
          'tokenizer, so training on, generate / fill_mask / evaluate refuse it until its '
          f'tokenizer files are copied into {paths.resolve(workdir) / HF_TOKENIZER_DIR}')


def data_tokenizer(config, workdir: str):
  """The Hugging Face tokenizer `config.data.tokenizer` names, or None where it names a
  sentencepiece model or nothing (pretrain_jax.data.load_tokenizer reads those).

  A directory is read as Hugging Face tokenizer files for `config.model.family`: an imported
  workdir's hf_tokenizer/ (this workdir's own where the named one is gone: the workdir moved)
  or any HF model or tokenizer directory. Pre-training (pretrain-jax train), evaluation and
  loading all read `data.tokenizer` through this, so they tokenize alike. Refused, naming the
  files: a directory without the family's tokenizer files, and a tokenizer other than the one
  the workdir's config.json records (by the files' bytes; a moved copy is the same one).
  """
  name = _moved_hf_tokenizer(config.data.tokenizer, workdir)
  family = config.model.family
  if name and name.name == HF_TOKENIZER_DIR and not name.is_dir():
    raise FileNotFoundError(missing_tokenizer_message(
        'the Hugging Face directory it was imported from', family, workdir))
  _check_recorded_tokenizer(name, workdir)
  if not (name and name.is_dir()):
    return None
  tokenizer = tok_lib.load_tokenizer(name, family)
  if tokenizer is None:
    found = sorted(paths.resolve(p).name for p in tok_lib.tokenizer_files(name))
    raise FileNotFoundError(f'{name} (config.data.tokenizer) holds no {family} tokenizer files '
                            f'(found {found or "none"}); expected '
                            f'{families.of(family).expected_files}')
  return tokenizer


def _moved_hf_tokenizer(name: str, workdir: str):
  """`name` resolved (None: empty); an imported hf_tokenizer/ that is gone is the workdir's own
  (the workdir moved)."""
  if not name:
    return None
  name = paths.resolve(name)
  if name.name == HF_TOKENIZER_DIR and not name.is_dir():
    return paths.resolve(workdir) / HF_TOKENIZER_DIR
  return name


def _tokenizer_bytes(name) -> dict:
  """{file name: bytes} of a Hugging Face tokenizer directory, or of a sentencepiece model."""
  if name is not None and name.is_dir():
    return {p.name: p.read_bytes() for p in map(paths.resolve, tok_lib.tokenizer_files(name))}
  return {name.name: name.read_bytes()} if name is not None and name.is_file() else {}


def _check_recorded_tokenizer(name: str, workdir: str) -> None:
  """Refuses a Hugging Face tokenizer directory other than the one the workdir was trained or
  imported with, or a switch between such a directory and a sentencepiece model: its ids mean
  other pieces to the trained embedding. Sentencepiece to sentencepiece is
  run.workdir.write_config's check (it compares the workdir's copy)."""
  saved = train_workdir.read_config(workdir) if paths.resolve(workdir).is_dir() else None
  recorded = _moved_hf_tokenizer(saved['data']['tokenizer'] if saved and 'data' in saved else '',
                                 workdir)
  if not recorded or not ((name and name.is_dir()) or recorded.is_dir()):
    return
  if name == recorded or _tokenizer_bytes(name) == _tokenizer_bytes(recorded):
    return
  raise ValueError(f'tokenizer {name or "(none: data.tokenizer is empty)"} differs from the one '
                   f'this workdir was trained with ({recorded}); resume with that one or use a '
                   'new workdir')


def classifier_problem(config, where: str):
  """Why a fine-tuned classifier (model.num_classes > 0) is no LM checkpoint, or None."""
  cfg = ModelConfig.from_config(config.model)
  classes, family = cfg.num_classes, cfg.family
  if not classes:
    return None
  head = ' + '.join(repr(name) for name in family_of(cfg).classifier.params)
  labels = list(TaskConfig.from_config(config.task).labels) if 'task' in config else []
  return (f'{where} holds a fine-tuned {family} classifier (model.num_classes={classes}, '
          f'labels {labels}, the {head} head) with no language-model head')


def workdir_tokenizer(workdir: str, config, local_dir: str):
  """(tokenizer or None, files to export with the model) of a workdir.

  An imported workdir has the HF files in hf_tokenizer/; a run trained with a sentencepiece
  model gets the files its family's record makes of it (`from_sentencepiece`: T5's
  spiece.model, BERT / GPT-2's tokenizer.json), written to the local directory `local_dir`.
  """
  hf_tok = paths.resolve(workdir) / HF_TOKENIZER_DIR
  if hf_tok.is_dir():
    return tok_lib.load_tokenizer(hf_tok), tok_lib.tokenizer_files(hf_tok)
  sp_path = config.data.tokenizer
  if not (sp_path.endswith('.model') and paths.resolve(sp_path).is_file()):
    return None, []
  made = families.of(config.model.family).from_sentencepiece(str(paths.local_copy(sp_path)))
  for name, data in made.items():
    paths.write_atomic(paths.resolve(local_dir) / name, data)
  if not made:
    return None, []
  return (tok_lib.load_tokenizer(local_dir, config.model.family),
          tok_lib.tokenizer_files(local_dir))


def export_hf(workdir: str, hf_dir: str, *, step: int = None) -> dict:
  """Writes checkpoint `step` (default latest) of `workdir` as the HF directory `hf_dir`."""

  if hf.is_hf_dir(workdir):
    raise ValueError(f'{workdir} is already a Hugging Face model directory (its config.json is '
                     'a Hugging Face config); export reads a training workdir: load the '
                     'directory as it is, or import it first (pretrain-jax convert_hf import)')
  saved = train_workdir.load_config(workdir)
  if saved.get('mode') == 'lora':   # its checkpoint holds the factors, not the model
    raise ValueError(f'{workdir} holds a LoRA adapter of {saved.lora.base}, not a model; '
                     'export its base (in Python, pretrain_jax.load_pretrained(workdir) merges '
                     'the adapter into it)')
  problem = classifier_problem(saved, workdir)
  if problem:
    raise ValueError(f'{problem}; export supports pretrained LM checkpoints only (the head and '
                     'labels would be dropped): export the checkpoint it was fine-tuned from')
  io_lib.check_free(hf_dir)
  config, params, step = ckpt_lib.restore_params(workdir, step)
  cfg = ModelConfig.from_config(config.model)
  params = jax.tree.map(np.asarray, nn.unbox(params))
  with tempfile.TemporaryDirectory() as local, io_lib.atomic_directory(hf_dir) as tmp:
    tokenizer, files = workdir_tokenizer(workdir, config, local)
    io_lib.write_hf(tmp, cfg, params, tokenizer=tokenizer, tokenizer_files=files)
  return {'hf_dir': str(paths.resolve(hf_dir)), 'family': cfg.family, 'step': int(step),
          'tokenizer_files': sorted(paths.resolve(p).name for p in files)}
