"""`load_pretrained(path)`: any checkpoint as one object, the one a notebook user holds.

  model = pretrain_jax.load_pretrained('runs/tiny/gpt')          # a training workdir (latest)
  model = pretrain_jax.load_pretrained('runs/tiny/gpt/checkpoints/300')  # one checkpoint
  model = pretrain_jax.load_pretrained('bert-base-uncased/')     # a Hugging Face directory
  logits = model(input_ids, attention_mask=mask)                 # (B, T, V)
  model.generate(['The list'])                                   # GPT / T5 text out
  model.fill_mask('Return a new [MASK].')                        # BERT
  model.evaluate(batches)                                        # the train loop's metrics
  model = pretrain_jax.load_pretrained('runs/lora/sst2')         # a LoRA fine-tune: its base
                                                                 # with the adapter merged
  a = backbone.with_adapter('runs/lora/a')                       # adapters on one backbone

`attention_mask` (1 = real token, 0 = padding) becomes the models' segment ids; positions
count real tokens only, so left- and right-padded rows both work.
"""
import dataclasses
import functools
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from pretrain_jax import data, hf, ops, paths
from pretrain_jax.data import tasks
from pretrain_jax.data.config import TaskConfig, data_section
from pretrain_jax.hf import tokenizers as hf_tokenizers
from pretrain_jax.inference import adapter as adapter_lib
from pretrain_jax.inference import beam, sampling, text
from pretrain_jax.models import ModelConfig, build, family_of, masks
from pretrain_jax.ops import backends
from pretrain_jax.training import evaluate as eval_lib
from pretrain_jax.training import lora
from pretrain_jax.training import step as step_lib
from pretrain_jax.training.config import TrainConfig


def check_inputs(cfg, names: dict, batch: dict) -> None:
  """Refuses what the model would silently get wrong: an id outside the vocabulary (the
  embedding lookup reads NaN), a token type outside type_vocab_size, and with learned positions
  a row longer than max_len (positions past the table embed as zeros: no position at all)."""
  limits = [('input_ids', cfg.vocab_size, 'vocab_size'),
            ('decoder_input_ids', cfg.vocab_size, 'vocab_size'),
            ('token_type_ids', cfg.type_vocab_size, 'type_vocab_size')]
  for name, limit, what in limits:
    if names.get(name) in batch and batch[names[name]].size:
      values = np.asarray(batch[names[name]])
      low, high = int(values.min()), int(values.max())
      if low < 0 or high >= limit:
        raise ValueError(f'{name} holds {low if low < 0 else high}; expected values in '
                         f'[0, {what}={limit})')
  if cfg.position_embedding == 'learned' and 'positions' in batch and batch['positions'].size:
    longest = int(np.asarray(batch['positions']).max()) + 1
    if longest > cfg.max_len:
      raise ValueError(f'a row of {longest} tokens; the model holds at most max_len='
                       f'{cfg.max_len} (learned positions)')


class BertOutput(NamedTuple):
  logits: jax.Array                 # (B, T, V) masked-LM logits
  nsp_logits: jax.Array | None   # (B, 2) next-sentence logits (0 = IsNext), if trained


def hf_batch(family, **given) -> dict:
  """Hugging Face keyword arguments -> the family's batch (its `hf_inputs` names them).

  A missing `*attention_mask` is all ones and a missing `token_type_ids` all zeros, shaped like
  the ids of the same prefix (`decoder_` or none). Positions count real tokens only
  (masks.positions_from_mask), so left- and right-padded rows both work.
  """
  names = dict(family.hf_inputs)
  extra = sorted(k for k, v in given.items() if v is not None and k not in names)
  if extra:
    raise ValueError(f'{", ".join(extra)} given to a {family.name} model; it takes '
                     f'{", ".join(names)}')
  batch = {}
  for name, key in names.items():
    value = given.get(name)
    like = given.get('decoder_input_ids' if name.startswith('decoder_') else 'input_ids')
    if value is None and key in family.input_keys:
      raise ValueError(f'{family.name} needs {name}' + (
          ' (targets shifted right, starting with 0)' if name.startswith('decoder_') else ''))
    if value is None:
      value = (jnp.ones_like if key.endswith('segment_ids') else jnp.zeros_like)(
          jnp.asarray(like, jnp.int32))
    value = jnp.asarray(value, jnp.int32)
    if value.ndim != 2:
      raise ValueError(f'{name} of shape {value.shape}; expected (batch, length)')
    batch[key] = value
    positions_key = key.replace('segment_ids', 'positions')
    if key.endswith('segment_ids') and positions_key in family.kwarg_keys:
      batch[positions_key] = masks.positions_from_mask(value)
  return batch


@dataclasses.dataclass
class Pretrained:
  """A loaded model: `.config` (ml_collections), `.model_config`, `.params`, `.tokenizer`,
  `.path` (the directory it was loaded from, for messages). `.model_config.dtype` is as the
  checkpoint recorded it: 'auto' computes in its devices' dtype (bfloat16 on TPU and GPU,
  float32 on CPU), wherever the checkpoint was trained."""
  config: ml_collections.ConfigDict
  model_config: ModelConfig
  params: Any
  tokenizer: Any
  step: int | None = None
  path: str | None = None

  @property
  def family(self) -> str:
    return self.model_config.family

  # Read from .config at each use (a ConfigDict its holder may edit); each is a few dict reads.
  @property
  def train_config(self) -> TrainConfig | None:
    """config.train as trained (None: a Hugging Face directory)."""
    return TrainConfig.from_config(self.config.train) if 'train' in self.config else None

  @property
  def task(self) -> TaskConfig | None:
    """A fine-tune's config.task (None: not fine-tuned on a task)."""
    return TaskConfig.from_config(self.config.task) if 'task' in self.config else None

  @property
  def data_config(self):
    """config.data: a DataConfig, a fine-tune's TaskDataConfig, or None (Hugging Face)."""
    return data_section(self.config.data) if 'data' in self.config else None

  @functools.cached_property
  def _apply(self):
    model = build(self.model_config.replace(deterministic=True, decode=False))
    family = family_of(self.model_config)

    def apply(params, batch):
      args, kwargs = family.model_inputs(batch)
      return model.apply({'params': params}, *args, **kwargs)
    return jax.jit(apply)

  def __call__(self, input_ids, decoder_input_ids=None, *, attention_mask=None,
               token_type_ids=None, decoder_attention_mask=None):
    """GPT: logits (B, T, V). BERT: BertOutput(logits, nsp_logits). T5: logits (B, T_dec, V)."""
    given = dict(input_ids=input_ids, decoder_input_ids=decoder_input_ids,
                 attention_mask=attention_mask, token_type_ids=token_type_ids,
                 decoder_attention_mask=decoder_attention_mask)
    family = family_of(self.model_config)
    batch = hf_batch(family, **given)
    check_inputs(self.model_config, dict(family.hf_inputs), batch)
    out = self._apply(self.params, batch)
    return BertOutput(*out) if isinstance(out, tuple) else out

  @functools.cached_property
  def _digests(self) -> dict:
    return lora.leaf_digests(self.params)

  def fingerprint(self, head_names: tuple = ()) -> str:
    """16 hex digits naming these weights outside the top-level `head_names` (what a LoRA
    adapter records of its base: training/lora.py)."""
    return lora.fingerprint(self._digests, head_names)

  def with_adapter(self, path: str, step: int | None = None) -> 'Pretrained':
    """This backbone with the LoRA adapter of fine-tune workdir `path` (its latest checkpoint,
    or `step`) merged in: the fine-tuned model, as load_pretrained(path) gives it. The weights
    the adapter leaves alone stay this backbone's arrays, so adapters share them. A backbone
    other than the adapter's base is refused in one line."""
    workdir, path_step = split_checkpoint_path(path)
    config = adapter_lib.adapter_config(workdir)
    if config is None:
      raise ValueError(f'{path} is not a LoRA adapter (a fine-tune workdir with mode=lora); '
                       'expected one written by pretrain-jax finetune --mode lora')
    params, step = adapter_lib.merged_params(self, workdir, config,
                                             step if step is not None else path_step)
    # the backbone's model (with its load-time overrides) and the fine-tune's head
    cfg = self.model_config.replace(
        num_classes=ModelConfig.from_config(config.model).num_classes)
    return Pretrained(config, cfg, params, _workdir_tokenizer(workdir, config), step,
                      path=str(paths.resolve(path)))

  def replace_params(self, params) -> 'Pretrained':
    """The same model with other parameters (e.g. training.evaluate.random_init_params)."""
    return dataclasses.replace(self, params=params)

  def generate(self, prompts, **sampling) -> list:
    """GPT: continue each prompt; T5: fill its <extra_id_N> spans (inference.text)."""
    return text.generate_text(self, prompts, **sampling)

  def fill_mask(self, text_with_masks: str, top_k: int = 5) -> list:
    """BERT: top-k (token, probability) for each [MASK] (inference.text)."""
    return text.fill_mask(self, text_with_masks, top_k)

  def predict(self, texts, text_pairs=None, *, batch_size: int = 32) -> list:
    """A fine-tuned checkpoint's label (a string of config.task.labels) for each text (and
    pair): BERT/GPT by the argmax of the class logits, a GPT fine-tuned with task.format=
    'generation' by the likeliest label after its prompt (inference/scoring.py), T5 by
    decoding (greedy, or task.beam_size beams: the label whose decoded form the text is,
    classification.label_forms; else the decoded text, which is then no label at all). A T5
    fine-tuned on inputs -> targets gives the decoded targets."""
    from pretrain_jax.data import classification  # noqa: PLC0415 (TensorFlow)
    family, trained_on = family_of(self.model_config), self.task
    labels = trained_on.labels if trained_on else ()
    text_to_text = family.task_layout.text_to_text and not labels and trained_on is not None
    if not labels and not text_to_text:
      raise ValueError('predict needs a fine-tuned checkpoint (config.task.labels); this one '
                       'has none (train one with pretrain-jax finetune)')
    if isinstance(texts, str):
      raise ValueError('predict takes a list of texts; expected [text, ...], got one string')
    pairs = list(text_pairs) if text_pairs is not None else [None] * len(texts)
    if len(pairs) != len(texts):
      raise ValueError(f'{len(texts)} texts but {len(pairs)} text_pairs; expected one each')
    trained_on_pairs = trained_on.pairs   # (None: a workdir from before it)
    if trained_on_pairs is not None and not text_to_text and trained_on_pairs != (
        text_pairs is not None):
      raise ValueError(
          f'text_pairs {"missing" if trained_on_pairs else "given"}: this model was fine-tuned '
          f'on task {trained_on.name!r} of '
          f'{"sentence pairs" if trained_on_pairs else "single sentences"}; expected '
          f'{"predict(texts, text_pairs)" if trained_on_pairs else "predict(texts) alone"}')
    if text_to_text and text_pairs is not None:
      raise ValueError('text_pairs given to a T5 fine-tuned on inputs -> targets; expected '
                       'the inputs alone')
    examples = [{'inputs': t, 'targets': ''} if text_to_text else
                dict({'text': t, 'label': labels[0]}, **({'text_pair': p} if p is not None
                                                         else {}))
                for t, p in zip(texts, pairs, strict=True)]
    task = tasks.Task('predict', {'train': examples}, labels, prefix=trained_on.prefix)
    d, text_out = self.data_config, family.task_layout.text_to_text
    if trained_on.format == 'generation':
      return self._rank_labels(examples, labels, trained_on.question, d.seq_len, batch_size)
    rows = classification.encode(task, 'train', self.tokenizer, family.task_layout, d.seq_len,
                                 d.target_len if text_out else 0).rows
    if self.model_config.prefix_lm and not text_out:   # as it was fine-tuned (finetune/run.py)
      rows['prefix'] = (rows['segment_ids'] > 0).astype(np.int32)
    out = []
    label_of = (dict(zip(classification.label_forms(self.tokenizer, labels), labels, strict=True))
                if text_out else {})
    for start in range(0, len(texts), batch_size):
      batch = {k: jnp.asarray(v[start:start + batch_size]) for k, v in rows.items()
               if k in family.batch_keys}
      if text_out:
        kw = dict(max_new_tokens=d.target_len, eos_id=self.tokenizer.eos_id,
                  pad_id=self.tokenizer.pad_id)
        inputs, segments = batch['encoder_input_tokens'], batch['encoder_segment_ids']
        if trained_on.beam_size > 1:
          ids, _ = beam.t5_beam_search(self.params, self.model_config, inputs, segments,
                                       beam_size=trained_on.beam_size, **kw)
        else:
          ids = sampling.t5_generate(self.params, self.model_config, inputs, segments,
                                     jax.random.key(0), **kw)
        for row in jax.device_get(ids).tolist():
          row = row[:row.index(self.tokenizer.eos_id)] if self.tokenizer.eos_id in row else row
          text = self.tokenizer.decode([i for i in row if i != self.tokenizer.pad_id]).strip()
          out.append(label_of.get(text, text))
      else:
        logits = self._apply(self.params, batch)                        # (B, C)
        out.extend(labels[int(i)] for i in jax.device_get(jnp.argmax(logits, -1)))
    return out

  def _rank_labels(self, examples, labels, question: str, seq_len: int, batch_size: int):
    """The likeliest of `labels` after each example's prompt (a generation-format fine-tune)."""
    from pretrain_jax.data import prompts  # noqa: PLC0415 (TensorFlow)
    from pretrain_jax.inference import scoring  # noqa: PLC0415 (TensorFlow)
    contexts = [prompts.context(ex, question) for ex in examples]
    rows, _ = scoring.choice_rows(self.tokenizer, contexts, labels, seq_len + 1)
    logliks = scoring.loglikelihoods(self.params, self.model_config, rows,
                                     pad_id=self.tokenizer.pad_id, batch_size=batch_size)
    return [labels[int(i)] for i in np.argmax(logliks.reshape(len(examples), len(labels)), -1)]

  def evaluate(self, batches, max_batches: int = 0, params=None, progress=None) -> dict:
    """The train loop's validation metrics (training.evaluate) over `batches` of this family's
    layout; `params` replaces the loaded ones (e.g. random_init_params for a baseline);
    `progress` as training.evaluate's (e.g. run.metrics.Progress(max_batches))."""
    t = self.train_config
    max_predictions = step_lib.max_predictions(t, self.data_config) if t else 0
    params = self.params if params is None else params
    leaf = jax.tree.leaves(params)[0]
    device = next(iter(leaf.devices())) if isinstance(leaf, jax.Array) else jax.devices()[0]
    eval_step = jax.jit(ops.bind(   # in its devices' ops form and dtype, as make_steps's
        backends.for_platform(device.platform), step_lib.make_eval_step(
            build(self.model_config.resolved(device).replace(deterministic=True,
                                                             decode=False)),
            t.loss_chunk_len if t else 0, max_predictions,
            fused_loss=t.fused_loss if t else True)))
    keys = set(family_of(self.model_config).batch_keys)   # (drops e.g. ids the model never reads)
    return eval_lib.evaluate(eval_step, params, ({k: v for k, v in b.items() if k in keys}
                                                 for b in batches), max_batches, progress)


def split_checkpoint_path(path: str):
  """'W/checkpoints/300' -> (W, 300); a workdir -> (W, None)."""
  path = paths.resolve(path)
  if path.name.isdigit() and path.parent.name == 'checkpoints':
    return str(path.parent.parent), int(path.name)
  return str(path), None


def load_pretrained(path: str, step: int | None = None, **model_overrides) -> Pretrained:
  """Load a training workdir (latest or `step`), one of its checkpoints, or a HF directory.

  `model_overrides` are ModelConfig fields (e.g. dtype='float32' where the checkpoint's
  'auto' would compute in bfloat16, attention_impl='xla').
  """
  if not paths.resolve(path).is_dir():
    raise FileNotFoundError(f'{path!r} is not a directory; expected a training workdir, a '
                            'checkpoint directory or a Hugging Face model directory')
  if hf.is_hf_dir(path):
    cfg, params, tokenizer = hf.load_hf(path, **model_overrides)
    config = ml_collections.ConfigDict({'model': cfg.to_dict()})
    return Pretrained(config, cfg, jax.tree.map(jnp.asarray, params), tokenizer,
                      path=str(paths.resolve(path)))
  from pretrain_jax.run import checkpoint  # noqa: PLC0415 (orbax: workdirs only)
  workdir, path_step = split_checkpoint_path(path)
  if step is not None and path_step is not None and step != path_step:
    raise ValueError(f'{path} is checkpoint {path_step} but step={step} was asked for; expected '
                     'one of them (the workdir with step=, or the checkpoint directory alone)')
  adapter = adapter_lib.adapter_config(workdir)
  if adapter is not None:   # a LoRA fine-tune: its base, then the adapter merged in
    base = adapter.lora.base
    if not paths.resolve(base).is_dir():
      raise FileNotFoundError(f'{path} is a LoRA adapter of base checkpoint {base!r}, which is '
                              'not there; expected it in place (or load a backbone and call '
                              '.with_adapter)')
    return load_pretrained(base, **model_overrides).with_adapter(
        path, step if step is not None else path_step)
  config, params, step = checkpoint.restore_params(workdir, step if step is not None
                                                   else path_step)
  cfg = ModelConfig.from_config(config.model).replace(**model_overrides)
  tokenizer = _workdir_tokenizer(workdir, config)
  hf_tokenizers.check_fits(tokenizer, cfg.vocab_size, workdir)
  return Pretrained(config, cfg, nn.unbox(params), tokenizer, step, path=str(paths.resolve(path)))


def copy_hf_tokenizer(folder: str, workdir: str, write: bool = True) -> str:
  """<workdir>/hf_tokenizer holding the tokenizer files of the Hugging Face directory `folder`
  (copied once, by the process that `write`s; an imported workdir keeps them there too);
  returns that directory."""
  from pretrain_jax.hf import convert as hf_convert  # noqa: PLC0415 (orbax: workdirs only)
  target = paths.resolve(workdir) / hf_convert.HF_TOKENIZER_DIR
  if write and paths.resolve(folder) != target:
    for path in map(paths.resolve, hf_tokenizers.tokenizer_files(folder)):
      if not (target / path.name).is_file():
        paths.copy(path, target / path.name)
  return str(target)


def _workdir_tokenizer(workdir: str, config):
  """The tokenizer config.data names: Hugging Face tokenizer files (hf.workdir.data_tokenizer)
  or the project's sentencepiece model."""
  from pretrain_jax.hf import convert as hf_convert  # noqa: PLC0415 (orbax: workdirs only)
  tokenizer = hf_convert.data_tokenizer(config, workdir)
  if tokenizer is not None:
    return tokenizer
  d = data_section(config.data)
  # (a fine-tune always names its checkpoint's; a pre-training run with none trains its own)
  return data.open_tokenizer(d.tokenizer) if d.tokenizer else data.load_tokenizer(d)
