"""A LoRA fine-tune's workdir as an adapter: its checkpoint holds the factors and the head alone,
its config.json (`lora.base`, `lora.base_fingerprint`) names the base they were trained on.

`merged_params(backbone, workdir)` checks that `backbone` (a loaded Pretrained) is that base and
returns its parameters with the adapter merged in (W + alpha / rank * A @ B; training/lora.py);
every parameter the adapter does not change is the backbone's own array, so several adapters
served from one backbone share it. Pretrained.with_adapter and load_pretrained call it.
"""
import jax
import ml_collections

from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.run import checkpoint
from pretrain_jax.run import workdir as workdir_lib
from pretrain_jax.training import lora
from pretrain_jax.training import state as state_lib


def is_adapter(config) -> bool:
  """True for a config.json (dict or ConfigDict) of a LoRA fine-tune."""
  return config is not None and config.get('mode') == 'lora' and 'lora' in config


def adapter_config(workdir: str) -> ml_collections.ConfigDict | None:
  """The workdir's config when it is an adapter's, else None."""
  config = workdir_lib.read_config(workdir)
  return ml_collections.ConfigDict(config) if is_adapter(config) else None


def head_names(cfg: ModelConfig) -> tuple:
  return tuple(n for h in family_of(cfg).active_heads(cfg) for n in h.params)


def read_trained(workdir: str, config, step=None) -> tuple:
  """(the adapter's factors and head as trained, step) of checkpoint `step` (default: the
  latest), on the default device."""
  cfg = ModelConfig.from_config(config.model)
  lc = lora.LoraConfig.from_config(config.lora)
  frozen, head = lora.split(state_lib.abstract_params(build(cfg)), head_names(cfg))
  factors = jax.eval_shape(lambda: lora.init_factors(jax.random.key(0), frozen,
                                                      lc.target_names, lc.rank))
  return checkpoint.read_on_one_device(workdir, {lora.FACTORS: factors, **head}, step)


def merged_params(backbone, workdir: str, config, step=None) -> tuple:
  """(the backbone's params with the adapter of `workdir` merged in, the adapter's step);
  a one-line error when the backbone is not the base the adapter was trained on."""
  cfg = ModelConfig.from_config(config.model)
  lc = lora.LoraConfig.from_config(config.lora)
  heads = head_names(cfg)
  found = backbone.fingerprint(heads)
  if found != lc.base_fingerprint:
    raise ValueError(f'adapter {workdir} was trained on base {lc.base} (fingerprint '
                     f'{lc.base_fingerprint}); this backbone, {backbone.path}, has fingerprint '
                     f'{found}: expected the base it was trained on')
  trained, step = read_trained(workdir, config, step)
  frozen = {k: backbone.params[k] for k in lora.split(
      state_lib.abstract_params(build(cfg)), heads)[0]}
  return lora.merge(trained, frozen, lc.target_names, lc.scale), step
