"""Hugging Face config.json <-> ModelConfig, through each family's record (hf/families.py).

Which heads a checkpoint carries (BERT's NSP head, T5's separate LM head) is read from the
tensor names, not from `architectures`, because that is what the weights can actually fill.
The per-family mapping lives in hf/bert.py, hf/gpt2.py and hf/t5.py.
"""
from pretrain_jax.hf import families
from pretrain_jax.models.config import ModelConfig


def family_of(hf: dict) -> str:
  """'bert' | 'gpt' | 't5' from config.json's model_type (and architectures, when present)."""
  return families.of_config_json(hf).name


def model_config_from_hf(hf: dict, state_dict: dict, **overrides) -> ModelConfig:
  """config.json dict + the checkpoint's tensors (name -> array) -> ModelConfig.

  The tensors decide BERT's `nsp` (a `cls.seq_relationship` head is present) and whether T5's
  LM head is tied (hf/t5.py `lm_head_tied`). `overrides` are ModelConfig fields (e.g. dtype,
  scan_layers, attention_impl) applied last.
  """
  record = families.of_config_json(hf)
  kw = record.config_from_hf(hf, state_dict)
  kw.update(overrides)
  return ModelConfig(family=record.name, **kw)


def export_problems(cfg: ModelConfig) -> list:
  """Why `cfg` cannot be written as a Hugging Face model (empty when it can). Training scripts
  print these as a warning at start, so nobody learns it only at export time."""
  problems = []
  if cfg.num_classes:
    problems.append(f'model.num_classes={cfg.num_classes}: a fine-tuned classifier; export '
                    'supports pretrained LM checkpoints only (its head would be dropped)')
  return problems + families.of(cfg).export_problems(cfg)


def hf_config_from_model(cfg: ModelConfig, *, pad_id=None, eos_id=None) -> dict:
  """ModelConfig -> a config.json dict that transformers' from_pretrained accepts.

  `pad_id` / `eos_id` come from the tokenizer when there is one.
  """
  problems = export_problems(cfg)
  if problems:
    raise ValueError(problems[0])
  return families.of(cfg).config_to_hf(cfg, pad_id=pad_id, eos_id=eos_id)
