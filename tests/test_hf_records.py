"""One Hugging Face record per family (pretrain_jax.hf.families)."""
from pretrain_jax import models
from pretrain_jax.hf import config as hf_config
from pretrain_jax.hf import families

import modeling  # pylint: disable=g-bad-import-order


def test_one_record_per_model_family():
  assert set(families.BY_NAME) == set(models.FAMILIES)
  assert len(families.BY_MODEL_TYPE) == len(families.RECORDS)
  for name in models.FAMILIES:
    cfg = modeling.tiny(name)
    assert families.of(cfg) is families.of(name) is families.BY_NAME[name]
    assert families.of_config_json(hf_config.hf_config_from_model(cfg)).name == name

