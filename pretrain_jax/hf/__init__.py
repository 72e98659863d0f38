"""Hugging Face interop: BERT (BertForPreTraining / BertForMaskedLM), GPT-2 (GPT2LMHeadModel)
and T5 v1.0 / v1.1 (T5ForConditionalGeneration).

  load_hf(hf_dir, **model_overrides) -> (ModelConfig, params, tokenizer or None)
  save_hf(hf_dir, cfg, params, tokenizer=None, tokenizer_files=())
  is_hf_dir(path)

Mapping layers: pretrain_jax.hf.config (config.json <-> ModelConfig), pretrain_jax.hf.weights
(state dict <-> params), pretrain_jax.hf.tokenizers. Workdirs: pretrain_jax.hf.convert.
What differs by family is one record per family (hf/bert.py, hf/gpt2.py, hf/t5.py, each ending
with `HF = HfFamily(...)`), looked up in pretrain_jax.hf.families.
"""
from pretrain_jax import paths
from pretrain_jax.hf.io import load_hf, read_state_dict, save_hf
from pretrain_jax.hf.tokenizers import load_tokenizer
from pretrain_jax.run import workdir as workdir_lib


def is_hf_dir(path: str) -> bool:
  """True when `path` holds a Hugging Face config.json (run.workdir.is_hf_config: a
  `model_type` or `architectures`, and no `train` section, which a training workdir's
  config.json has). A
  config.json that is not JSON is a ValueError naming it: it is neither."""
  config = paths.resolve(path) / 'config.json'
  if not config.is_file():
    return False
  return workdir_lib.is_hf_config(paths.read_json(config))


__all__ = ['is_hf_dir', 'load_hf', 'load_tokenizer', 'read_state_dict', 'save_hf']
