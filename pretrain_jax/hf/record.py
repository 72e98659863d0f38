"""The one Hugging Face record of a model family: its config.json, tensors and tokenizer.

Each family module here (bert.py, gpt2.py, t5.py) ends with its `HF = HfFamily(...)`;
hf/families.py looks a record up by our family name or by config.json's `model_type`, and the
generic code (config.py, weights.py, tokenizers.py, workdir.py, io.py) asks the record instead
of branching on the name. The model side is pretrain_jax.models.family.Family.
"""
import dataclasses
from collections.abc import Callable

# HF activation name -> ours (BERT hidden_act, GPT-2 activation_function) and back.
ACTIVATIONS = {'gelu': 'gelu', 'gelu_new': 'gelu_tanh', 'gelu_pytorch_tanh': 'gelu_tanh',
               'relu': 'relu'}
HF_ACTIVATIONS = {'gelu': 'gelu', 'gelu_tanh': 'gelu_new', 'relu': 'relu'}


@dataclasses.dataclass(frozen=True)
class HfFamily:
  """How one family is written in a Hugging Face directory.

  Config: `config_from_hf(hf, tensor_names) -> ModelConfig fields` (the tensors decide the
  heads a checkpoint carries), `config_to_hf(cfg, pad_id, eos_id) -> config.json dict`,
  `export_problems(cfg) -> [why it cannot be exported]`.
  Weights (hf/weights.py): `rules(cfg) -> [Rule]`, `tied` (copy, original) tensor names HF may
  save twice, `stacks` (paths of the nn.scan layer stacks), `rename` (an old tensor name ->
  the current one), `complete(cfg, state_dict)` (fill tensors a checkpoint may leave implicit).
  Tokenizer (hf/tokenizers.py): `tokenizer(files, settings) -> adapter or None` from the
  tokenizer files present ({name: local path}) and tokenizer_config.json settings; the files
  that identify the family (`sentencepiece_file`, `tokenizer_json_type`, `vocab_file`) and
  how errors name them (`expected_files`);
  `from_sentencepiece(model_path) -> {HF file name: bytes}`, the files that carry a workdir's
  sentencepiece model (empty when the family cannot).
  Workdirs: `data_settings(cfg, data) -> dict` of config.data fields the imported model fixes.
  """
  name: str                        # ours: pretrain_jax.models.family_of(cfg).name
  model_type: str                  # config.json model_type
  architectures: tuple             # accepted config.json architectures
  config_from_hf: Callable
  config_to_hf: Callable
  rules: Callable
  tokenizer: Callable
  tied: tuple = ()
  stacks: tuple = ()
  export_problems: Callable = lambda cfg: []
  rename: Callable = lambda name: name
  complete: Callable = lambda cfg, state_dict: state_dict
  sentencepiece_file: str | None = None
  tokenizer_json_type: str | None = None
  vocab_file: str | None = None
  expected_files: str = 'tokenizer files'  # the tokenizer files it reads, as errors name them
  from_sentencepiece: Callable = lambda model_path: {}
  data_settings: Callable = lambda cfg, data: {}


def get(hf: dict, key: str, default=None):
  """config.json's `key`; ValueError naming it when absent and there is no default."""
  if key in hf and hf[key] is not None:
    return hf[key]
  if default is None:
    raise ValueError(f'config.json has no {key!r}; it is needed to build the '
                     f'{hf.get("model_type")} model')
  return default


def activation(hf: dict, key: str, table: dict, default: str) -> str:
  name = get(hf, key, default)
  if name not in table:
    raise ValueError(f'config.json {key}={name!r}; supported: {sorted(table)}')
  return table[name]


def head_dim(emb: int, heads: int, emb_key: str) -> int:
  if emb % heads:
    raise ValueError(f'config.json {emb_key}={emb} is not divisible by the number of heads '
                     f'{heads}')
  return emb // heads


def learned_position_problems(cfg) -> list:
  """Why `cfg` is not a Hugging Face BERT / GPT-2 (learned positions, tied head, E = N * H)."""
  problems = []
  if cfg.num_heads * cfg.head_dim != cfg.emb_dim:
    problems.append(f'model.num_heads * head_dim = {cfg.num_heads} * {cfg.head_dim} != '
                    f'emb_dim={cfg.emb_dim}; Hugging Face {cfg.family} needs them equal')
  if cfg.position_embedding != 'learned':
    problems.append(f'model.position_embedding={cfg.position_embedding!r}; Hugging Face '
                    f'{cfg.family} has only learned position embeddings')
  if cfg.activation not in HF_ACTIVATIONS:
    problems.append(f'model.activation={cfg.activation!r}; exportable for {cfg.family}: '
                    f'{sorted(HF_ACTIVATIONS)}')
  if not cfg.tie_embeddings:
    problems.append(f'model.tie_embeddings=False; Hugging Face {cfg.family.upper()} ties its '
                    'LM head to the token embedding')
  if not cfg.causal:
    problems.append('model.causal=False; Hugging Face GPT-2 is a causal decoder')
  if cfg.prefix_lm:
    problems.append('model.prefix_lm=True; Hugging Face GPT-2 has no bidirectional prefix')
  return problems


def clamp_seq_len(cfg, data) -> dict:
  """Learned positions: the data's sequence length must fit in max_len."""
  return {'seq_len': min(data.seq_len, cfg.max_len)}
