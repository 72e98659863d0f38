"""finetune(config, workdir): a checkpoint + a labelled task -> a trained classifier workdir.

It runs pre-training's loop (training/loop.train_and_evaluate: sharded jitted steps from
step.make_steps, checkpoints with the data position, SIGTERM, workdir lock, metrics.jsonl and
TensorBoard); this file only decides the config, the batches and the starting weights:

  mode 'full'          every weight trains, starting from the checkpoint
  mode 'linear_probe'  the backbone is frozen (stop_gradient on its hidden states, and no
                       optimizer state: optimizer.train_only); only the head trains (BERT: the
                       pooler + classifier that read [CLS]; GPT: `score` on the last token)
  mode 'scratch'       the same architecture and recipe from random weights (the baseline)

BERT and GPT get `model.num_classes` = the number of labels and are scored by the class_*
metrics of training/task.py (class_accuracy, class_mcc, class_f1). T5 is text to text
(`prefix: text` -> the label string, teacher-forced LM loss); at each evaluation its labels are
decoded greedily with the KV cache (inference/sampling.t5_generate) and scored by exact match
(class_accuracy; exact_match), an undecodable answer counting as a wrong class.
"""
import dataclasses
import json

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from pretrain_jax import paths
from pretrain_jax.data import classification, tasks
from pretrain_jax.data.config import TaskDataConfig
from pretrain_jax.finetune.config import FinetuneConfig, ModelOverrides
from pretrain_jax.inference import load, sampling
from pretrain_jax.models import ModelConfig, family_of
from pretrain_jax.training import checkpoint as ckpt_lib
from pretrain_jax.training import loop, task as task_lib
from pretrain_jax.training import workdir as workdir_lib
from pretrain_jax.training.config import TrainConfig

MODEL_OVERRIDES = tuple(f.name for f in dataclasses.fields(ModelOverrides))   # its model.*


def load_init(path: str) -> load.Pretrained:
  """The checkpoint to start from; a one-line error when `path` is not one."""
  if not path:
    raise ValueError("init=''; expected a training workdir, one of its checkpoints/<step> "
                     'directories, or a Hugging Face model directory')
  if not paths.isdir(path):
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
  if family.classifier is not None:
    if not task.labels:
      raise ValueError(f'task {task.name!r} is text-to-text (inputs/targets); a '
                       f'{family.name} model needs text + label columns')
    model['num_classes'] = len(task.labels)
  elif ft.mode == 'linear_probe':
    raise ValueError(f'mode=linear_probe on {family.name}: text-to-text has no separate head '
                     'to probe; use full or scratch')
  config.model = ml_collections.ConfigDict(model)
  config.train.freeze_backbone = ft.mode == 'linear_probe'
  if ft.mode == 'linear_probe' and ft.probe_learning_rate:
    config.train.learning_rate = ft.probe_learning_rate
  config.init = paths.absolute(ft.init)   # a resume from another directory names it alike
  config.task.name = task.name
  config.task.labels = list(task.labels)
  config.task.metric = task.metric
  config.task.prefix = task.prefix
  config.task.pairs = task.pairs            # what predict() must be given
  # (a Hugging Face directory's config has no data section: its tokenizer is the directory's)
  tokenizer_path = (init.config['data']['tokenizer'] if 'data' in init.config else '') or \
      config.init
  config.data.tokenizer = paths.absolute(tokenizer_path)
  if ft.data.seq_len > init.model_config.max_len:
    raise ValueError(f'data.seq_len={ft.data.seq_len} exceeds the checkpoint\'s model.max_len='
                     f'{init.model_config.max_len}; expected at most that')
  return config


def check_resume(config, workdir: str) -> None:
  """A resumed run must have the same head size and labels (a one-line error otherwise). A
  workdir that recorded its init relative to the directory it ran in (before init was made
  absolute) keeps that spelling when it names the same directory."""
  saved = paths.join(workdir, ckpt_lib.CONFIG_FILE)
  if not paths.isfile(saved):
    return
  old = workdir_lib.resolved(json.loads(paths.read_text(saved)))   # (defaults filled in)
  if 'init' in old and old['init'] and paths.absolute(old['init']) == config.init:
    config.init = old['init']
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


def exact_match_scores(decoded: list, targets: list, truth, label_forms: tuple) -> dict:
  """Decoded strings against target strings (whitespace-stripped): exact_match, and for a
  labelled task class_accuracy / class_mcc / class_f1 with `truth` the (N,) class ids and
  `label_forms` the labels as decoding gives them back (classification.label_forms); a decoded
  string that is no label counts as a wrong class ((truth + 1) mod C)."""
  hits = [d.strip() == t.strip() for d, t in zip(decoded, targets)]
  out = {'exact_match': float(np.mean(hits))}
  if label_forms:
    index = {form: c for c, form in enumerate(label_forms)}
    truth = np.asarray(truth)
    predicted = np.array([index.get(d.strip(), -1) for d in decoded])
    predicted = np.where(predicted < 0, (truth + 1) % len(label_forms), predicted)
    confusion = np.zeros((len(label_forms), len(label_forms)), np.float32)
    np.add.at(confusion, (truth, predicted), 1.0)
    out.update(class_accuracy=float(np.mean(truth == predicted)),
               **{f'class_{k}': float(v) for k, v in
                  task_lib.confusion_metrics(jnp.asarray(confusion)).items()})
  return out


def exact_match_evaluator(cfg: ModelConfig, encoded, tokenizer, labels: tuple,
                          batch_size: int, target_len: int):
  """params -> {class_accuracy, class_mcc, class_f1, exact_match} by greedy T5 decoding."""
  rows = encoded.rows
  forms = classification.label_forms(tokenizer, labels) if labels else ()
  targets = [tokenizer.decode([int(t) for t in row if t not in (0, tokenizer.eos_id)])
             for row in rows['decoder_target_tokens']]

  def evaluate(params):
    decoded = []
    for start in range(0, len(targets), batch_size):
      stop = min(start + batch_size, len(targets))
      pad = batch_size - (stop - start)
      inputs = np.pad(rows['encoder_input_tokens'][start:stop], [(0, pad), (0, 0)])
      segments = np.pad(rows['encoder_segment_ids'][start:stop], [(0, pad), (0, 0)])
      segments[stop - start:, 0] = 1   # a padding row still has one token (no empty encoder row)
      out = sampling.t5_generate(params, cfg, jnp.asarray(inputs), jnp.asarray(segments),
                                 jax.random.key(0), max_new_tokens=target_len,
                                 eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)
      for row in np.asarray(out)[:stop - start]:
        ids = [int(t) for t in row]
        ids = ids[:ids.index(tokenizer.eos_id)] if tokenizer.eos_id in ids else ids
        decoded.append(tokenizer.decode([t for t in ids if t != tokenizer.pad_id]))
    return exact_match_scores(decoded, targets, rows.get('class_ids'), forms)
  return evaluate


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
  encoded = {split: classification.encode(
      task, split, init.tokenizer, layout, d.seq_len, target_len,
      ft.task.max_train_examples if split == d.train_split else ft.task.max_eval_examples)
      for split in (d.train_split, d.eval_split)}
  keys = set(family.batch_keys)

  def datasets(*, split, batch_size, process_index, process_count, repeat, model_max_len):
    del model_max_len
    return classification.make_task_dataset(
        encoded[split], split=split, batch_size=batch_size, seed=d.seed,
        repeat=repeat and split == d.train_split, process_index=process_index,
        process_count=process_count, keys=keys)

  head_names = tuple(n for h in family.active_heads(cfg) for n in h.params)
  evaluators = ()
  if layout.text_to_text:   # scored by decoding its answers
    evaluators = (exact_match_evaluator(cfg, encoded[d.eval_split], init.tokenizer,
                                        task.labels, t.batch_size, target_len),)
  paths.makedirs(workdir)
  # The workdir keeps its own tokenizer, so it loads after the init moves: a sentencepiece
  # model is copied by the loop (as in pre-training), a Hugging Face one here (process 0;
  # files already there are kept).
  tokenizer_path = d.tokenizer
  if paths.isdir(tokenizer_path):
    config.data.tokenizer = load.copy_hf_tokenizer(tokenizer_path, workdir,
                                                   write=jax.process_index() == 0)
  result = loop.train_and_evaluate(
      config, workdir, datasets=datasets, data=d.replace(tokenizer=config.data.tokenizer),
      init_params=starting_params(init.params, ft.mode, head_names), evaluators=evaluators,
      tokenizer_path=tokenizer_path if paths.isfile(tokenizer_path) else '')
  history = read_curves(workdir)['eval']
  metric = 'class_' + task.metric if task.labels else 'exact_match'
  values = [r[metric] for r in history if metric in r]
  result.update(mode=ft.mode, task=task.name, init=config.init, metric=metric,
                final=values[-1] if values else None, best=max(values) if values else None,
                train_examples=len(next(iter(encoded[d.train_split].rows.values()))),
                truncated=encoded[d.train_split].truncated + encoded[d.eval_split].truncated)
  return result


def read_curves(workdir: str) -> dict:
  """metrics.jsonl -> {'train': [records], 'eval': [records]}, the last record per step (a
  resumed run rewrites the steps after its checkpoint)."""
  out = {'train': {}, 'eval': {}}
  path = paths.join(workdir, 'metrics.jsonl')
  if paths.isfile(path):
    for line in paths.read_text(path).splitlines():
      record = json.loads(line)
      if record.get('split') in out:
        out[record['split']][record['step']] = record
  return {k: [v[s] for s in sorted(v)] for k, v in out.items()}
