"""Model families: config, masks, the attention core, shared layers, BERT / GPT / T5.

`build(ModelConfig)` returns the Linen module of the config's family; `family_of(cfg)` its
record (pretrain_jax.models.family.Family): batch keys, example batch, heads, FLOPs.
"""
import jax

from pretrain_jax.models import bert, gpt, t5
from pretrain_jax.models.config import AUTO, ModelConfig
from pretrain_jax.models.family import Family, Head

FAMILIES = {f.name: f for f in (bert.FAMILY, gpt.FAMILY, t5.FAMILY)}


def family_of(cfg_or_name) -> Family:
  """The record of a ModelConfig's family (or of a family name, or the record itself)."""
  if isinstance(cfg_or_name, Family):
    return cfg_or_name
  name = getattr(cfg_or_name, 'family', cfg_or_name)
  if name not in FAMILIES:
    raise ValueError(f'model family {name!r}; expected one of {sorted(FAMILIES)}')
  return FAMILIES[name]


def build(cfg: ModelConfig):
  """The module of `cfg`, whose compute dtype is concrete: a config still `dtype='auto'`
  computes in the default device's (ModelConfig.resolved); make_steps resolves for its mesh's
  devices before it builds."""
  if cfg.dtype == AUTO:
    cfg = cfg.resolved(jax.devices()[0])
  return family_of(cfg).model(cfg)


__all__ = ['FAMILIES', 'Family', 'Head', 'ModelConfig', 'build', 'family_of']
