"""Reading and writing Hugging Face model directories.

  load_hf(hf_dir)                        -> (ModelConfig, params, tokenizer or None)
  save_hf(hf_dir, cfg, params, tokenizer_files=...)   config.json + model.safetensors (+ tokenizer)

Weights: model.safetensors (read with safetensors' numpy API, no PyTorch), a sharded
model.safetensors.index.json, or pytorch_model.bin[.index.json] (needs torch). Writes go to a
temporary directory next to the target that is renamed into place, so a failure leaves nothing
half-written. A gs:// directory is read from a local copy (paths.local_copy) and written in place
(object stores have no rename): a failure removes what was written.
"""
import contextlib
import json
import os
import shutil  # noqa: TID251 (atomic_directory's local temporary folder)
import struct
import tempfile

import ml_dtypes
import numpy as np
from etils import epath
from safetensors import safe_open
from safetensors.numpy import save_file

from pretrain_jax import paths
from pretrain_jax.hf import config as config_lib
from pretrain_jax.hf import tokenizers as tok_lib
from pretrain_jax.hf import weights as weights_lib

WEIGHT_FILES = ('model.safetensors', 'model.safetensors.index.json', 'pytorch_model.bin',
                'pytorch_model.bin.index.json')


def read_config(hf_dir: str) -> dict:
  path = paths.resolve(hf_dir) / 'config.json'
  if not path.is_file():
    raise FileNotFoundError(f'{path} not found; expected a Hugging Face model directory')
  hf = paths.read_json(path)
  if not isinstance(hf, dict):
    raise ValueError(f'{path} holds a JSON {type(hf).__name__}; expected an object '
                     '(a Hugging Face config.json)')
  return hf


def _damaged(path: str, e: Exception) -> ValueError:
  why = ' '.join(str(e).split())[:300] or type(e).__name__
  return ValueError(f'{path} cannot be read ({type(e).__name__}: {why}); the file is damaged or '
                    'truncated: download it again')


def _read_safetensors(path: str) -> dict:
  try:
    return _read_safetensors_file(path)
  except Exception as e:  # SafetensorError, bad header
    if isinstance(e, (ImportError, MemoryError)):
      raise
    raise _damaged(path, e) from None


def _read_safetensors_file(path: str) -> dict:
  # the header says each tensor's dtype; numpy has no bfloat16
  with open(path, 'rb') as f:  # noqa: PTH123 (a local_copy file: safetensors reads local files)
    header = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
  out = {}
  with safe_open(path, framework='numpy') as f:
    for name in f.keys():
      if header[name]['dtype'] == 'BF16':
        out[name] = _read_bf16(path, header, name)
      else:
        out[name] = f.get_tensor(name)
  return out


def _read_bf16(path: str, header: dict, name: str) -> np.ndarray:
  start, end = header[name]['data_offsets']
  with open(path, 'rb') as f:  # noqa: PTH123 (a local_copy file)
    f.seek(8 + struct.unpack('<Q', f.read(8))[0] + start)
    raw = f.read(end - start)
  return np.frombuffer(raw, ml_dtypes.bfloat16).reshape(header[name]['shape']).astype(np.float32)


def _read_torch(path: str) -> dict:
  try:
    import torch  # noqa: PLC0415 (torch: optional, pytorch_model.bin only)
  except ImportError:
    raise ImportError(f'{path} is a PyTorch pickle; reading it needs torch '
                      '(pip install torch==2.13.0), or convert it to model.safetensors') from None
  try:
    state = torch.load(path, map_location='cpu', weights_only=True)
  except Exception as e:  # pickle / zip errors
    raise _damaged(path, e) from None
  return {k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in state.items()}


def read_state_dict(hf_dir: str) -> dict:
  """All tensors of the checkpoint in `hf_dir`, name -> numpy array."""
  check_exists(hf_dir)
  hf_dir = paths.local_copy(hf_dir)  # below: local files only
  found = [n for n in WEIGHT_FILES if (hf_dir / n).is_file()]
  if not found:
    raise FileNotFoundError(f'{hf_dir} has no weights: expected one of {list(WEIGHT_FILES)}; '
                            f'it holds {sorted(f.name for f in hf_dir.iterdir())}')
  name = found[0]
  read = _read_safetensors if name.startswith('model.safetensors') else _read_torch
  if not name.endswith('.index.json'):
    return read(str(hf_dir / name))
  try:
    shards = sorted(set(json.loads((hf_dir / name).read_text())['weight_map'].values()))
  except (ValueError, KeyError, AttributeError, TypeError) as e:
    raise ValueError(f'{hf_dir / name} is not a shard index ({type(e).__name__}: {e}); expected '
                     'JSON with a "weight_map" of tensor name -> file') from None
  out = {}
  for shard in shards:
    if not (hf_dir / shard).is_file():
      raise FileNotFoundError(f'{hf_dir / shard} (listed in {name}) does not exist')
    out.update(read(str(hf_dir / shard)))
  return out


def load_hf(hf_dir: str, **overrides):
  """(ModelConfig, params, tokenizer or None) from a Hugging Face model directory.

  `overrides` are ModelConfig fields applied to the imported config (e.g. scan_layers=True,
  dtype=jnp.bfloat16); params are float32 numpy arrays in the layout the config asks for.
  """
  check_exists(hf_dir)
  name, hf_dir = hf_dir, paths.local_copy(hf_dir)  # below: local files only
  hf = read_config(hf_dir)
  family = config_lib.family_of(hf)
  state_dict = weights_lib.normalize_names(family, read_state_dict(hf_dir))
  cfg = config_lib.model_config_from_hf(hf, state_dict, **overrides)
  try:
    params = weights_lib.hf_to_params(cfg, state_dict)
  except ValueError as e:  # a tensor missing, misshapen or unexpected: name the directory
    raise type(e)(f'{name}: {e}') from None
  tokenizer = tok_lib.load_tokenizer(hf_dir, family)
  if tokenizer is not None:
    tok_lib.check_fits(tokenizer, cfg.vocab_size, name)
  return cfg, params, tokenizer


def check_exists(hf_dir: str) -> None:
  """FileNotFoundError naming `hf_dir` unless it is a directory (local or gs://)."""
  if not paths.resolve(hf_dir).is_dir():
    raise FileNotFoundError(f'{hf_dir} does not exist or is not a directory; expected a Hugging '
                            'Face model directory (config.json + model.safetensors)')


def check_free(target: str) -> epath.Path:
  """`target` resolved; FileExistsError unless it is absent or an empty directory."""
  target = paths.resolve(target)
  if target.exists() and (not target.is_dir() or any(target.iterdir())):
    raise FileExistsError(f'{target} already exists and is not an empty directory; '
                          'refusing to overwrite it')
  return target


@contextlib.contextmanager
def atomic_directory(target: str):
  """Yields a temporary directory that becomes `target` when the block succeeds.

  `target` must not exist (or be an empty directory); on any error the temporary directory is
  removed and `target` is untouched.
  """
  target = check_free(target)
  if paths.is_remote(target):
    try:
      yield target
    except BaseException:
      target.rmtree(missing_ok=True)
      raise
    return
  parent = paths.makedirs(target.parent)
  tmp = epath.Path(tempfile.mkdtemp(prefix=f'.{target.name}.tmp-', dir=parent))
  try:
    yield tmp
    _default_permissions(tmp)  # mkdtemp (and safetensors) create owner-only files
    if target.is_dir():
      target.rmdir()
    tmp.rename(target)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def _default_permissions(root: epath.Path) -> None:
  umask = os.umask(0)
  os.umask(umask)
  for folder, _, files in root.walk():
    os.chmod(folder, 0o777 & ~umask)
    for name in files:
      os.chmod(folder / name, 0o666 & ~umask)


def write_hf(out_dir: str, cfg, params, *, tokenizer=None, tokenizer_files=()) -> None:
  """Writes config.json + model.safetensors (+ tokenizer files) into an existing `out_dir`."""
  pad_id = eos_id = None
  if tokenizer is not None:
    pad_id, eos_id = _maybe(lambda: tokenizer.pad_id), _maybe(lambda: tokenizer.eos_id)
  hf = config_lib.hf_config_from_model(cfg, pad_id=pad_id, eos_id=eos_id)
  tensors = weights_lib.params_to_hf(cfg, params)
  out_dir = paths.resolve(out_dir)
  with tempfile.TemporaryDirectory() as tmp:  # safetensors writes local files only
    local = epath.Path(tmp) / 'model.safetensors'
    save_file(tensors, str(local), metadata={'format': 'pt'})
    paths.copy(local, out_dir / 'model.safetensors')
  paths.write_atomic(out_dir / 'config.json', json.dumps(hf, indent=2, sort_keys=True))
  for path in map(paths.resolve, tokenizer_files):
    paths.copy(path, out_dir / path.name)


def save_hf(hf_dir: str, cfg, params, *, tokenizer=None, tokenizer_files=()) -> str:
  """Exports (cfg, params) as a Hugging Face directory `hf_dir` (must not exist yet)."""
  with atomic_directory(hf_dir) as tmp:
    write_hf(tmp, cfg, params, tokenizer=tokenizer, tokenizer_files=tokenizer_files)
  return str(paths.resolve(hf_dir))


def _maybe(get):
  try:
    return get()
  except ValueError:
    return None
