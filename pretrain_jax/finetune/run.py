"""finetune(config, workdir): a checkpoint + a labelled task -> a trained classifier workdir.

It runs pre-training's loop (run/loop.train_and_evaluate: sharded jitted steps from
step.make_steps, checkpoints with the data position, SIGTERM, workdir lock, metrics.jsonl and
TensorBoard); this file only decides the config, the batches and the starting weights:

  mode 'full'          every weight trains, starting from the checkpoint
  mode 'linear_probe'  the backbone is frozen (stop_gradient on its hidden states, and no
                       optimizer state: optimizer.train_only); only the head trains (BERT: the
                       pooler + classifier that read [CLS]; GPT: `score` on the last token)
  mode 'scratch'       the same architecture and recipe from random weights (the baseline)
  mode 'lora'          the backbone is frozen and rank-r factors beside its kernels train
                       with the head (training/lora.py: the state holds only those, so the
                       checkpoint is the adapter alone; config.lora names its base checkpoint
                       and that base's fingerprint, and load_pretrained merges it)

BERT and GPT get `model.num_classes` = the number of labels and are scored by the class_*
metrics of training/task.py (class_accuracy, class_mcc, class_f1). With task.format=
'generation' a GPT instead learns to write the label after a prompt (data/prompts.py: the LM
loss on the label's tokens alone, no head) and is scored by ranking the labels' log-likelihoods
(evaluators.choice_evaluator). T5 is text to text (`prefix: text` -> the label string or a
summary, teacher-forced LM loss); at each evaluation its targets are decoded with the KV cache
(greedy, or a beam of task.beam_size) and scored by exact match (labels: the class metrics of
the decoded label, an undecodable answer counting as a wrong class; free text: ROUGE-1/2/L).
A prefix LM reads its whole input (the head format) or its prompt (generation) as its
bidirectional prefix.
"""
import dataclasses
import json
import math

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from pretrain_jax import paths
from pretrain_jax.data import classification, prompts, tasks
from pretrain_jax.data.config import TaskDataConfig
from pretrain_jax.finetune import evaluators
from pretrain_jax.finetune.config import FinetuneConfig, ModelOverrides
from pretrain_jax.inference import load, scoring
from pretrain_jax.models import ModelConfig, build, family_of
from pretrain_jax.run import loop
from pretrain_jax.run import workdir as workdir_lib
from pretrain_jax.training import lora
from pretrain_jax.training import state as state_lib
from pretrain_jax.training.config import TrainConfig

MODEL_OVERRIDES = tuple(f.name for f in dataclasses.fields(ModelOverrides))   # its model.*


def load_init(path: str) -> load.Pretrained:
  """The checkpoint to start from; a one-line error when `path` is not one."""
  if not path:
    raise ValueError("init=''; expected a training workdir, one of its checkpoints/<step> "
                     'directories, or a Hugging Face model directory')
  if not paths.resolve(path).is_dir():
    raise FileNotFoundError(f'init {path!r} is not a directory; expected a training workdir, '
                            'a checkpoints/<step> directory or a Hugging Face model directory')
  try:
    return load.load_pretrained(path)
  except (FileNotFoundError, ValueError, KeyError) as e:
    raise ValueError(f'init {path!r} is not a checkpoint ({str(e).splitlines()[0]}); '
                     'expected a training workdir, checkpoints/<step> or a Hugging Face '
                     'directory') from None


def build_config(config, init: load.Pretrained, task) -> ml_collections.ConfigDict:
  """`config` (configs/finetune.py) completed from the checkpoint and the task: the config the
  workdir records. Its numbers are checked first (FinetuneConfig)."""
  ft = FinetuneConfig.from_config(config)
  config = ml_collections.ConfigDict(config.to_dict())
  model = init.model_config.to_dict()
  model.update({k: v for k, v in ft.model.to_dict().items() if v is not None})  # its dropout
  family = family_of(init.model_config)
  generation = ft.task.format == 'generation'
  if generation:
    scoring.check_scores(init.model_config, "task.format='generation'",
                         f'checkpoint {ft.init!r}')
  if ft.task.beam_size > 1 and not family.task_layout.text_to_text:
    raise ValueError(f'task.beam_size={ft.task.beam_size} decodes text-to-text targets (T5); '
                     f'a {family.name} checkpoint\'s labels are '
                     f'{"ranked" if generation else "a head"}: expected task.beam_size=1')
  if (family.classifier is not None or generation) and not task.labels:
    raise ValueError(f'task {task.name!r} is text-to-text (inputs/targets); a '
                     f'{family.name} model needs text + label columns')
  if family.classifier is not None and not generation:
    model['num_classes'] = len(task.labels)
  elif ft.mode == 'linear_probe':
    what = ("task.format='generation': the label is written by the LM head, not a separate head"
            if generation else 'text-to-text has no separate head')
    raise ValueError(f'mode=linear_probe on {family.name} with {what} to probe; use full or '
                     'scratch')
  config.model = ml_collections.ConfigDict(model)
  config.train.freeze_backbone = ft.mode == 'linear_probe'
  if ft.mode == 'linear_probe' and ft.probe_learning_rate:
    config.train.learning_rate = ft.probe_learning_rate
  if ft.mode == 'lora':
    if ft.lora.learning_rate:
      config.train.learning_rate = ft.lora.learning_rate
    head_names = tuple(n for h in family.active_heads(ModelConfig.from_config(model))
                       for n in h.params)
    config.lora.base = base_checkpoint(init)
    config.lora.base_fingerprint = init.fingerprint(head_names)
  # absolute: a resume from another directory names it alike
  config.init = str(paths.resolve(ft.init)) if ft.init else ''
  config.task.name = task.name
  config.task.labels = list(task.labels)
  config.task.metric = task.metric
  config.task.prefix = task.prefix
  config.task.question = ft.task.question or task.question   # the generation format's prompt
  config.task.pairs = task.pairs            # what predict() must be given
  # (a Hugging Face directory's config has no data section: its tokenizer is the directory's)
  tokenizer_path = (init.config['data']['tokenizer'] if 'data' in init.config else '') or \
      config.init
  config.data.tokenizer = str(paths.resolve(tokenizer_path))
  if ft.data.seq_len > init.model_config.max_len:
    raise ValueError(f'data.seq_len={ft.data.seq_len} exceeds the checkpoint\'s model.max_len='
                     f'{init.model_config.max_len}; expected at most that')
  return config


def base_checkpoint(init: load.Pretrained) -> str:
  """The exact checkpoint `init` holds: <workdir>/checkpoints/<step> for a workdir (whose
  latest may change), else its directory."""
  workdir, step = load.split_checkpoint_path(init.path)
  if step is None and init.step is not None:
    return str(paths.resolve(workdir) / 'checkpoints' / str(init.step))
  return init.path


def check_resume(config, workdir: str) -> None:
  """A resumed run must have the same head size and labels (a one-line error otherwise). A
  workdir that recorded its init relative to the directory it ran in (before init was made
  absolute) keeps that spelling when it names the same directory."""
  saved = workdir_lib.read_config(workdir)
  if saved is None:
    return
  old = workdir_lib.resolved(saved)   # (defaults filled in)
  if 'init' in old and old['init'] and str(paths.resolve(old['init'])) == config.init:
    config.init = old['init']
  old_format = old['task'].get('format', 'head') if 'task' in old else 'head'
  if old_format != config.task.format:
    raise ValueError(f'{workdir} was fine-tuned with task.format={old_format!r}, not '
                     f'{config.task.format!r}; use a new --workdir')
  old_base = old.get('lora', {}).get('base_fingerprint', '')
  if old.get('mode') == 'lora' and config.get('mode') == 'lora' and \
      old_base != config.lora.base_fingerprint:
    raise ValueError(f'{workdir} holds an adapter of base {old["lora"]["base"]} (fingerprint '
                     f'{old_base}); init {config.init} has fingerprint '
                     f'{config.lora.base_fingerprint}: expected that base, or a new --workdir')
  old_classes = old['model']['num_classes']
  if old_classes != config.model.num_classes:
    raise ValueError(f'{workdir} was trained with model.num_classes={old_classes} but this task '
                     f'has {config.model.num_classes} labels; use a new --workdir')
  old_labels = old['task']['labels'] if 'task' in old else None
  if old_labels is not None and list(old_labels) != list(config.task.labels):
    raise ValueError(f'{workdir} was trained with labels {old_labels} but this task has '
                     f'{list(config.task.labels)}; use a new --workdir')


def starting_params(pretrained, mode: str, head_names: tuple):
  """fresh params -> the params to start from: the checkpoint's weights wherever the model has
  the same parameter (shapes must agree), fresh ones for the head; all fresh for 'scratch'."""
  def merge(fresh):
    if mode == 'scratch':
      return fresh
    flat, given = flax.traverse_util.flatten_dict(fresh), flax.traverse_util.flatten_dict(
        pretrained)
    missing = [k for k in flat if k not in given and k[0] not in head_names]
    if missing:
      raise ValueError(f'the checkpoint lacks backbone parameter {"/".join(missing[0])} (and '
                       f'{len(missing) - 1} more); expected a checkpoint of this architecture')
    for key, value in flat.items():
      if key in given:
        if given[key].shape != value.shape:
          raise ValueError(f'checkpoint parameter {"/".join(key)} has shape {given[key].shape}; '
                           f'the model expects {value.shape}')
        # a copy: the train step donates its state, and the checkpoint's arrays serve every
        # run of a transfer comparison (an alias would be deleted after the first step)
        flat[key] = jnp.array(given[key], value.dtype, copy=True)
    return flax.traverse_util.unflatten_dict(flat)
  return merge


def lora_adapter(base_params, cfg: ModelConfig, head_names: tuple, config) -> lora.Adapter:
  """The checkpoint's weights of `cfg`'s model, less its head, frozen for LoRA."""
  abstract = state_lib.abstract_params(build(cfg))
  weights = starting_params(base_params, 'full', head_names)(abstract)
  return lora.Adapter(config, lora.split(weights, head_names)[0], head_names)


def _size(abstract) -> int:
  """The number of parameters in a tree of ShapeDtypeStructs (optax's tree_size wants arrays)."""
  return sum(math.prod(x.shape) for x in jax.tree.leaves(abstract))


def parameter_counts(cfg: ModelConfig, mode: str, head_names: tuple, state_params: int) -> dict:
  """{'total_params': the model's, 'trainable_params': those the optimizer updates} (the
  state's count is the trainable one for LoRA, the model's otherwise)."""
  abstract = state_lib.abstract_params(build(cfg))
  total = _size(abstract)
  trainable = {'lora': state_params, 'linear_probe': _size(
      {k: v for k, v in abstract.items() if k in head_names})}.get(mode, total)
  return {'total_params': total, 'trainable_params': trainable}


def load_task(ft: FinetuneConfig):
  return tasks.load_task(ft.task.name, tfds_data_dir=ft.task.tfds_data_dir, seed=ft.data.seed)


def finetune(config, workdir: str, init=None, task=None) -> dict:
  """Fine-tunes config.init on config.task in `workdir` (resuming there); returns the loop's
  summary plus `metric` (the task's headline, e.g. class_mcc for CoLA) and its final / best
  validation values. `init` / `task`: load_init(config.init) / load_task(its FinetuneConfig),
  already loaded (transfer's runs share them)."""
  ft = FinetuneConfig.from_config(config)   # every number checked before anything loads
  workdir_lib.check_not_foreign(workdir)   # nothing is written into a Hugging Face directory
  init = init or load_init(ft.init)
  task = task or load_task(ft)
  config = build_config(config, init, task)
  check_resume(config, workdir)
  cfg = ModelConfig.from_config(config.model)
  family, layout = family_of(cfg), family_of(cfg).task_layout
  d, t = TaskDataConfig.from_config(config.data), TrainConfig.from_config(config.train)
  target_len = d.target_len if layout.text_to_text else 0
  generation, question = ft.task.format == 'generation', config.task.question
  limit = {d.train_split: ft.task.max_train_examples, d.eval_split: ft.task.max_eval_examples}
  encoded = {split: encode(task, split, init.tokenizer, cfg, d, generation, question,
                           limit[split]) for split in (d.train_split, d.eval_split)}
  keys = set(family.batch_keys)

  def datasets(*, split, batch_size, process_index, process_count, repeat, model_max_len):
    del model_max_len
    return classification.make_task_dataset(
        encoded[split], split=split, batch_size=batch_size, seed=d.seed,
        repeat=repeat and split == d.train_split, process_index=process_index,
        process_count=process_count, keys=keys)

  head_names = tuple(n for h in family.active_heads(cfg) for n in h.params)
  scorers = ()
  if layout.text_to_text:   # scored by decoding its answers
    scorers = (evaluators.exact_match_evaluator(cfg, encoded[d.eval_split], init.tokenizer,
                                                task.labels, t.batch_size, target_len,
                                                ft.task.beam_size),)
  elif generation:          # scored by the likeliest label
    scorers = (evaluators.choice_evaluator(cfg, task, d.eval_split, init.tokenizer, question,
                                           d.seq_len, ft.task.max_eval_examples,
                                           t.batch_size),)
  adapter = None
  if ft.mode == 'lora':
    adapter = lora_adapter(init.params, cfg, head_names, ft.lora)
    merged = jax.jit(adapter.merge)
    scorers = tuple((lambda score: lambda params: score(merged(params, adapter.frozen)))(s)
                    for s in scorers)
  paths.makedirs(workdir)
  # The workdir keeps its own tokenizer, so it loads after the init moves: a sentencepiece
  # model is copied by the loop (as in pre-training), a Hugging Face one here (process 0;
  # files already there are kept).
  tokenizer_path = d.tokenizer
  tokenizer = paths.resolve(tokenizer_path) if tokenizer_path else None
  if tokenizer and tokenizer.is_dir():
    config.data.tokenizer = load.copy_hf_tokenizer(tokenizer_path, workdir,
                                                   write=jax.process_index() == 0)
  result = loop.train_and_evaluate(
      config, workdir, datasets=datasets, data=d.replace(tokenizer=config.data.tokenizer),
      init_params=starting_params(init.params, ft.mode, head_names + (lora.FACTORS,) * (
          adapter is not None)), evaluators=scorers,
      tokenizer_path=tokenizer_path if tokenizer and tokenizer.is_file() else '', adapter=adapter)
  history = read_curves(workdir)['eval']
  metric = 'class_' + task.metric if task.labels else task.metric
  values = [r[metric] for r in history if metric in r]
  result.update(mode=ft.mode, format=ft.task.format, task=task.name, init=config.init,
                metric=metric,
                final=values[-1] if values else None, best=max(values) if values else None,
                train_examples=len(next(iter(encoded[d.train_split].rows.values()))),
                **parameter_counts(cfg, ft.mode, head_names, result['params']),
                truncated=encoded[d.train_split].truncated + encoded[d.eval_split].truncated)
  return result


def encode(task, split: str, tokenizer, cfg: ModelConfig, d: TaskDataConfig, generation: bool,
           question: str, max_examples: int = 0) -> classification.Encoded:
  """`split` of `task` as rows for `cfg`'s family: the generation format's prompts and labels
  (prompts.encode_generation), else the family's layout (classification.encode); a prefix
  LM's classifier reads its whole input as its prefix."""
  if generation:
    return prompts.encode_generation(task, split, tokenizer, d.seq_len, question,
                                     max_examples, prefix_lm=cfg.prefix_lm)
  layout = family_of(cfg).task_layout
  encoded = classification.encode(task, split, tokenizer, layout, d.seq_len,
                                  d.target_len if layout.text_to_text else 0, max_examples)
  if cfg.prefix_lm and not layout.text_to_text:
    encoded.rows['prefix'] = (encoded.rows['segment_ids'] > 0).astype(np.int32)
  return encoded


def read_curves(workdir: str) -> dict:
  """metrics.jsonl -> {'train': [records], 'eval': [records]}, the last record per step (a
  resumed run rewrites the steps after its checkpoint)."""
  out = {'train': {}, 'eval': {}}
  path = paths.resolve(workdir) / 'metrics.jsonl'
  if path.is_file():
    for line in path.read_text().splitlines():
      record = json.loads(line)
      if record.get('split') in out:
        out[record['split']][record['step']] = record
  return {k: [v[s] for s in sorted(v)] for k, v in out.items()}
