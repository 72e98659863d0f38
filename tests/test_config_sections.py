"""Config sections as frozen dataclasses (pretrain_jax/sections.py): strict keys, one-line errors
naming the key and value, one place for each default, and old config.json files that load."""
import dataclasses
import json
import os

import jax.numpy as jnp
import ml_collections
import pytest

from configs import bench_common, common, tiny_gpt
from configs import finetune as finetune_config
from pretrain_jax.data.config import DataConfig, TaskConfig, TaskDataConfig
from pretrain_jax.finetune.config import FinetuneConfig, ModelOverrides
from pretrain_jax.models import ModelConfig
from pretrain_jax.perf.config import BenchmarkConfig
from pretrain_jax.run import workdir as workdir_lib
from pretrain_jax.training.config import MeshConfig, RunConfig, TrainConfig


def model(**changes) -> dict:
  m = tiny_gpt.get_config().model.to_dict()
  m.update(changes)
  return m


def train(**changes) -> dict:
  t = common.train_config(batch_size=8, steps=100, learning_rate=1e-3).to_dict()
  t.update(changes)
  return t


@pytest.mark.parametrize('section, values, key', [
    (TrainConfig, train(learnin_rate=1.0), 'learnin_rate'),
    (DataConfig, dict(objective='clm', seq_len=8, seq_length=8), 'seq_length'),
    (MeshConfig, dict(data=1, model=2), 'model'),
    (TaskConfig, dict(nmae='x'), 'nmae'),
    (TaskDataConfig, dict(target_length=4), 'target_length'),
    (BenchmarkConfig, dict(step=3), 'step'),
    (ModelConfig, model(hidden=8), 'hidden'),
    (ModelConfig, model(tuning='cpu'), 'tuning'),      # the ops form is no config key
])
def test_an_unknown_key_is_refused_naming_it(section, values, key):
  with pytest.raises(ValueError, match=rf"^unknown config\.{section.SECTION} keys \['{key}'\]; "
                                       'expected a subset of'):
    section.from_config(ml_collections.ConfigDict(values))


def test_an_unknown_fine_tune_key_is_refused_naming_it():
  c = finetune_config.get_config()
  c.task.nmae = 'x'
  with pytest.raises(ValueError, match=r"unknown config\.task keys \['nmae'\]"):
    FinetuneConfig.from_config(c)
  c = finetune_config.get_config()
  c.unlock()
  c.epochs = 3
  with pytest.raises(ValueError, match=r"^unknown config keys \['epochs'\]"):
    FinetuneConfig.from_config(c)
  with pytest.raises(ValueError, match=r'^model\.num_layers=3: .*checkpoint'):
    ModelOverrides.from_config({'num_layers': 3, 'dropout_rate': None})


@pytest.mark.parametrize('section, values, message', [
    (TrainConfig, train(steps=0), r'^train\.steps=0; expected a positive number of steps'),
    (TrainConfig, train(steps='10'), r"^train\.steps='10'; expected an integer"),
    (TrainConfig, train(log_every=2.5), r'^train\.log_every=2\.5; expected an integer'),
    (TrainConfig, train(async_checkpoints=1), r'^train\.async_checkpoints=1; expected True or '
                                               'False'),
    (TrainConfig, train(learning_rate=True), r'^train\.learning_rate=True; expected a number'),
    (TrainConfig, train(learning_rate=1e40), r'^train\.learning_rate=1e\+40; .*float32'),
    (TrainConfig, train(schedule='step'), r"^train\.schedule='step'; expected one of"),
    (TrainConfig, train(eval_batches=-1), r'^train\.eval_batches=-1; expected >= 0 batches'),
    (TrainConfig, train(max_predictions_per_seq=-2), r'^train\.max_predictions_per_seq=-2;'),
    (TrainConfig, train(checkpoint_timeout_sec=0), r'^train\.checkpoint_timeout_sec=0;'),
    (DataConfig, dict(objective='mlm', seq_len=64, mlm_probability=0.0),
     r'^config\.data\.mlm_probability=0\.0; .*\(0, 1\]'),
    (DataConfig, dict(objective='clm', seq_len=64, tokenizer_type='wordpiece'),
     r"^config\.data\.tokenizer_type='wordpiece'; .*'unigram'"),
    (DataConfig, dict(objective='clm', seq_len=64, num_streams=-2),
     r'^config\.data\.num_streams=-2; expected a positive integer'),
    (DataConfig, dict(objective='clm', seq_len=1), r'^config\.data\.seq_len=1 is too short for '
                                                   'clm; expected >= 2'),
    (MeshConfig, dict(data=-1, fsdp=-1), r"^config\.mesh \{'data': -1, 'fsdp': -1, 'tensor': 1\}"
                                         ': .*at most one -1'),
    (TaskConfig, dict(max_eval_examples=-1), r'^task\.max_eval_examples=-1; expected 0 \(all '
                                             r'examples\)'),
    (TaskDataConfig, dict(seq_len=0), r'^data\.seq_len=0; expected a positive input length'),
    (ModelOverrides, dict(dropout_rate=1.5), r'^model\.dropout_rate=1\.5;'),
    (BenchmarkConfig, dict(steps=0), r'^benchmark\.steps=0; expected a positive number'),
    (ModelOverrides, dict(dropout_rate='0.1'), r"^model\.dropout_rate='0\.1'; expected a number"),
    (ModelConfig, model(num_layers=0), r'^model\.num_layers=0; expected a positive integer'),
    (ModelConfig, model(num_layers='2'), r"^model\.num_layers='2'; expected an integer"),
    (ModelConfig, model(dense_bias='yes'), r"^model\.dense_bias='yes'; expected True or False"),
    (ModelConfig, model(dtype='fp8'),
     r"^model\.dtype='fp8'; expected 'auto' or one of \['bfloat16'"),
    (ModelConfig, model(param_dtype='auto'),
     r"^model\.param_dtype='auto'; expected one of \['bfloat16'"),
    (ModelConfig, model(activation='swish'), r"^model\.activation='swish'; expected one of"),
    (ModelConfig, model(dropout_rate=1.0), r'^model\.dropout_rate=1\.0; expected in \[0, 1\)'),
    (ModelConfig, model(family='t5', position_embedding='learned'),
     r"^model\.position_embedding='learned'; expected one of \('relative',\) for t5"),
])
def test_a_bad_value_is_refused_naming_key_and_value(section, values, message):
  with pytest.raises(ValueError, match=message):
    section.from_config(values)


def test_a_required_key_missing_is_named():
  values = train()
  del values['batch_size'], values['steps']
  with pytest.raises(ValueError, match=r"^config\.train lacks \['batch_size', 'steps'\]"):
    TrainConfig.from_config(values)


def test_sections_are_frozen_and_replace_checks_again():
  t = TrainConfig.from_config(train())
  with pytest.raises(dataclasses.FrozenInstanceError):
    t.steps = 5
  assert t.replace(steps=5).steps == 5 and t.steps == 100
  with pytest.raises(ValueError, match=r'^train\.steps=-5'):
    t.replace(steps=-5)


def _defaults(section) -> dict:
  return {f.name: f.default for f in dataclasses.fields(section)
          if f.default is not dataclasses.MISSING}


@pytest.mark.parametrize('built, section', [
    (common.data_config('mlm', 32), DataConfig),
    (common.train_config(batch_size=8, steps=100, learning_rate=1e-3), TrainConfig),
    (common.mesh_config(), MeshConfig),
    (bench_common.bench_section(), BenchmarkConfig),
])
def test_configs_common_is_built_from_the_dataclass_defaults(built, section):
  """One source: every field of the dataclass is a key of the shared section (so
  --config.x.y= overrides reach it), with the field's default as its value."""
  assert set(built) == {f.name for f in dataclasses.fields(section)}
  defaults = _defaults(section)
  assert {k: built[k] for k in defaults} == defaults
  assert section.from_config(built).to_dict() == built.to_dict()


def test_the_fine_tune_config_leaves_its_sections_at_their_defaults():
  """configs/finetune.py sets the recipe (train) only; its other keys are the dataclasses'."""
  ft = FinetuneConfig.from_config(finetune_config.get_config())
  assert (ft.task, ft.data, ft.model, ft.mesh) == (TaskConfig(), TaskDataConfig(),
                                                   ModelOverrides(), MeshConfig())
  assert (ft.init, ft.mode, ft.probe_learning_rate) == ('', 'full', 1e-3)
  assert set(finetune_config.get_config().model) == {'dropout_rate', 'attention_dropout_rate'}


def test_every_shipped_pre_training_config_reads():
  names = sorted(f[:-3] for f in os.listdir(os.path.join(os.path.dirname(common.__file__)))
                 if f.endswith('.py') and not f.startswith(('_', 'common', 'bench_common',
                                                              'finetune', 'shakespeare')))
  assert 'tiny_gpt' in names and 'bert_base' in names
  for name in names:
    c = __import__(f'configs.{name}', fromlist=['get_config']).get_config()
    TrainConfig.from_config(c.train), DataConfig.from_config(c.data)
    MeshConfig.from_config(c.mesh)


def test_an_old_config_json_without_a_newer_key_loads_with_its_default(tmp_path):
  """A workdir written before train.freeze_backbone, train.prng_impl and data.num_streams
  existed resumes under a config that spells out their defaults; a value other than the
  default is still a change (prng_impl is not free, so it is refused)."""
  config = tiny_gpt.get_config()
  old = json.loads(config.to_json())
  for section, key in (('train', 'freeze_backbone'), ('train', 'prng_impl'),
                       ('data', 'num_streams')):
    del old[section][key]
  t = TrainConfig.from_config(old['train'])
  assert (t.freeze_backbone, t.prng_impl) == (False, 'threefry2x32')
  assert DataConfig.from_config(old['data']).num_streams == 0
  work = tmp_path / 'run'
  work.mkdir()
  (work / 'config.json').write_text(json.dumps(old))
  assert workdir_lib.check_config(config, str(work)) == old    # no refusal
  config.train.prng_impl = 'rbg'
  with pytest.raises(ValueError, match=r"train\.prng_impl: 'threefry2x32' -> 'rbg'"):
    workdir_lib.check_config(config, str(work))


@pytest.mark.parametrize('recorded, refused', [('float32', False), ('bfloat16', True)])
def test_a_run_recorded_with_a_dtype_resumes_under_auto_where_auto_means_it(
    tmp_path, recorded, refused):
  """A workdir recorded before model.dtype='auto' (dtype 'float32') resumes on this CPU under
  the published 'auto', which computes in float32 here, and keeps its recorded dtype; one
  recorded as bfloat16 is still refused (the same command would now compute in float32)."""
  config = tiny_gpt.get_config()
  assert config.model.dtype == 'auto'
  old = json.loads(config.to_json())
  old['model']['dtype'] = recorded
  work = tmp_path / 'run'
  work.mkdir()
  (work / 'config.json').write_text(json.dumps(old))
  if refused:
    with pytest.raises(ValueError, match=r"model\.dtype: 'bfloat16' -> 'auto'"):
      workdir_lib.check_config(config, str(work))
  else:
    assert workdir_lib.check_config(config, str(work)) == old
    assert config.model.dtype == 'float32'    # what the resumed run records and computes in


def test_an_old_model_section_loads_with_the_defaults_of_newer_keys():
  """A config.json model section written before the layer switches, ALiBi and the prefix LM
  existed: the missing keys take their defaults (the family's layer choices for those left
  None), and the section round-trips through to_dict."""
  old = model(dtype='float32')        # (a config.json names a dtype)
  for key in ('norm', 'dense_bias', 'kernel_init', 'fold_query_scale', 'mlp_dropout',
              'embedding_dropout', 'alibi_bias_max', 'prefix_lm', 'head_bias', 'num_classes'):
    old.pop(key, None)
  cfg = ModelConfig.from_config(old)
  assert (cfg.norm, cfg.dense_bias, cfg.kernel_init, cfg.prefix_lm, cfg.alibi_bias_max) == (
      'layernorm', True, 'normal', False, 8.0)
  assert cfg.dtype == jnp.float32 and cfg.to_dict()['dtype'] == 'float32'
  assert ModelConfig.from_config(cfg.to_dict()) == cfg
  assert 'deterministic' not in cfg.to_dict() and 'decode' not in cfg.to_dict()
  with pytest.raises(ValueError, match=r"^config\.model lacks \['vocab_size'\]"):
    ModelConfig.from_config({k: v for k, v in old.items() if k != 'vocab_size'})


def test_auto_dtype_follows_the_platform_and_an_explicit_one_wins():
  """model.dtype='auto' (the published configs') stays 'auto' in the config (config.json
  records it so), and resolves per device: bfloat16 on TPUs and GPUs with bf16 tensor cores,
  float32 on CPUs and older GPUs; parameters stay float32; an explicit dtype is kept."""
  cfg = ModelConfig.from_config(model())
  assert cfg.dtype == 'auto' and cfg.to_dict()['dtype'] == 'auto'
  assert ModelConfig.from_config(cfg.to_dict()) == cfg
  gpu = dataclasses.make_dataclass('Gpu', ['platform', 'compute_capability'])
  for device, dtype in [('cpu', jnp.float32), ('tpu', jnp.bfloat16), ('gpu', jnp.bfloat16),
                        (gpu('gpu', '9.0'), jnp.bfloat16), (gpu('gpu', '8.0'), jnp.bfloat16),
                        (gpu('gpu', '7.5'), jnp.float32), (gpu('gpu', 'gfx90a'), jnp.bfloat16)]:
    resolved = cfg.resolved(device)
    assert (resolved.dtype, resolved.param_dtype) == (dtype, jnp.float32), device
    assert resolved.to_dict()['dtype'] == jnp.dtype(dtype).name
  for name in ('float32', 'bfloat16'):
    explicit = ModelConfig.from_config(model(dtype=name))
    assert {jnp.dtype(explicit.resolved(p).dtype).name for p in ('cpu', 'tpu')} == {name}


def test_an_old_fine_tune_config_reads_its_task_without_pairs():
  task = TaskConfig.from_config({'name': 'toy', 'labels': ['neg', 'pos'], 'metric': 'accuracy',
                                 'prefix': ''})
  assert task.pairs is None and task.labels == ('neg', 'pos')
  assert task.to_dict()['labels'] == ['neg', 'pos']


def test_a_seq_len_past_the_models_max_len_is_refused_before_the_model_is_built():
  """seq_len=100000 on tiny_gpt was killed for memory while the model's init traced a row of
  that length, before the data pipeline's own check could say so."""
  c = tiny_gpt.get_config()
  c.data.seq_len = 100000
  with pytest.raises(ValueError, match=r'seq_len=100000 .*\(max_len=128\)'):
    RunConfig.from_config(c)
  c.data.seq_len = 128
  assert RunConfig.from_config(c).data.seq_len == 128
