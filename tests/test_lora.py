"""LoRA (training/lora.py): step 0 is the base, only the adapter trains, merged equals unmerged,
the adapter is saved alone and merged back by load_pretrained, several adapters share one
backbone, and an adapter refuses a base it was not trained on."""
import json
import os

import flax
import jax
import jax.numpy as jnp
import modeling
import numpy as np
import pytest

import pretrain_jax
from configs import common
from pretrain_jax.finetune import run as run_lib
from pretrain_jax.hf import convert as hf_convert
from pretrain_jax.models import build, family_of
from pretrain_jax.training import lora
from pretrain_jax.training import mesh as mesh_lib
from pretrain_jax.training import step as step_lib
from pretrain_jax.training.config import MeshConfig, TrainConfig

# (family, ModelConfig changes, the trained head's top-level names); one layer each (T5: one
# per stack): every kind of targeted kernel, at the cost of one compile
CASES = {'bert': ('bert', dict(num_classes=3, num_layers=1), ('pooler', 'classifier')),
         'gpt': ('gpt', dict(num_classes=3, num_layers=1), ('score',)),
         'prefix_lm': ('gpt', dict(num_classes=3, prefix_lm=True, num_layers=1), ('score',)),
         't5': ('t5', dict(num_layers=1), ())}
RANK = 2


def _batch(case: str, seed: int = 0, rows: int = 8, length: int = 16) -> dict:
  """A labelled batch of the case's layout (T5: text to text, the LM loss on its targets)."""
  rng = np.random.default_rng(seed)
  if case == 't5':
    return family_of('t5').example_batch(rng.integers(3, modeling.VOCAB, (rows, length + 1)))
  lengths = rng.integers(4, length + 1, rows)
  seg = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
  batch = {'inputs': rng.integers(3, modeling.VOCAB, (rows, length)).astype(np.int32) * seg,
           'segment_ids': seg, 'positions': (np.cumsum(seg, 1) - 1) * seg,
           'labels': rng.integers(0, 3, rows).astype(np.int32)}
  if case == 'bert':
    batch['token_type_ids'] = np.zeros_like(seg)
  if case == 'prefix_lm':
    batch['prefix'] = seg.copy()
  return batch


def _steps(case: str, adapter=None, learning_rate=1e-2):
  family, changes, _ = CASES[case]
  t = common.train_config(batch_size=8, steps=3, learning_rate=learning_rate)
  t.update(warmup_steps=0, max_predictions_per_seq=0)
  mesh = mesh_lib.make_mesh(MeshConfig(), jax.devices()[:1])
  return step_lib.make_steps(modeling.tiny(family, **changes), TrainConfig.from_config(t), mesh,
                             init_length=16, adapter=adapter)


def _adapter(case: str, base: dict, targets='q,k,v,o,mlp') -> lora.Adapter:
  heads = CASES[case][2]
  return lora.Adapter(lora.LoraConfig(rank=RANK, alpha=4.0, targets=targets),
                      lora.split(base, heads)[0], heads)


def _base(case: str) -> dict:
  family, changes, _ = CASES[case]
  return modeling.init(modeling.tiny(family, **changes), length=16, seed=7)


@pytest.mark.parametrize('case', list(CASES))
def test_step_0_is_the_base_model_and_only_the_adapter_trains(case):
  base = _base(case)
  adapter = _adapter(case, base)
  steps = _steps(case, adapter)
  state = steps.create_state(0)
  heads = CASES[case][2]
  assert set(state.params) == {lora.FACTORS, *heads}
  # Step 0: the base's weights with this state's head give the same sums as the model itself.
  plain = _steps(case)
  batch = _batch(case)
  with_head = {**base, **{k: state.params[k] for k in heads}}
  got, _ = steps.eval_step(state.params, batch)
  want, _ = plain.eval_step(with_head, batch)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  # The optimizer holds state for the trained leaves alone (Adam's mu and nu of each).
  trained = lora.count(state.params)
  assert lora.count(state.opt_state) - trained * 2 < 10, (lora.count(state.opt_state), trained)
  before = jax.device_get(state.params)
  for i in range(3):
    state, metrics = steps.train_step(state, _batch(case, seed=i + 1))
  assert np.isfinite(float(metrics['loss']))
  after = jax.device_get(state.params)
  for path, value in flax.traverse_util.flatten_dict(before).items():
    moved = not np.array_equal(value, flax.traverse_util.flatten_dict(after)[path])
    # B starts at zero, so A has no gradient on the first step but moves after B does
    assert moved, '/'.join(path)
  # Merged, every weight outside the targeted kernels is the base's, bit for bit, and each
  # targeted kernel moved by a matrix of rank <= RANK.
  merged = jax.device_get(adapter.merge(after, adapter.frozen))
  targets = {t.path: t for t in lora.plan(adapter.frozen, ('q', 'k', 'v', 'o', 'mlp'))}
  flat_base = flax.traverse_util.flatten_dict(base)
  for path, value in flax.traverse_util.flatten_dict(merged).items():
    if path[0] in heads:
      continue
    if path not in targets:
      np.testing.assert_array_equal(value, flat_base[path], err_msg='/'.join(path))
      continue
    n_in = targets[path].n_in
    change = (value - flat_base[path]).reshape(int(np.prod(value.shape[:n_in])), -1)
    assert 0 < np.linalg.matrix_rank(change, tol=1e-6) <= RANK, '/'.join(path)


@pytest.mark.parametrize('case', ['bert', 'gpt', 't5'])
def test_merged_weights_equal_the_unmerged_low_rank_path(case):
  """x (W + s A B) against x W + s (x A) B computed beside each layer (flax interception)."""
  family, changes, heads = CASES[case]
  cfg = modeling.tiny(family, **changes)
  base = _base(case)
  adapter = _adapter(case, base)
  factors = lora.init_factors(jax.random.key(1), adapter.frozen, ('q', 'k', 'v', 'o', 'mlp'),
                              RANK)
  factors = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.key(2), x.shape),
                         factors)   # B != 0: the update is not zero
  trained = {lora.FACTORS: factors, **lora.split(base, heads)[1]}
  args, kwargs = family_of(cfg).model_inputs(_batch(case))
  model, names, scale = build(cfg), adapter.config.target_names, adapter.config.scale

  @jax.jit
  def outputs(trained, frozen):
    first = lambda out: out[0] if isinstance(out, tuple) else out  # noqa: E731  (BERT: MLM)
    merged = model.apply({'params': lora.merge(trained, frozen, names, scale)}, *args, **kwargs)
    unmerged = lora.unmerged_apply(model, frozen, trained, names, scale, *args, **kwargs)
    plain = model.apply({'params': {**frozen, **lora.split(base, heads)[1]}}, *args, **kwargs)
    return first(merged), first(unmerged), first(plain)
  merged, unmerged, plain = outputs(trained, adapter.frozen)
  assert float(jnp.abs(merged - plain).max()) > 1e-3   # the update counts
  np.testing.assert_allclose(merged, unmerged, atol=1e-5, rtol=1e-5)


def test_targets_pick_their_kernels_and_bad_values_are_refused():
  base = _base('gpt')
  paths = {'/'.join(t.path) for t in lora.plan(base, ('q', 'o'))}
  assert paths == {f'h_0/attn/{m}/kernel' for m in ('query', 'out')}
  a, b = (lora.init_factors(jax.random.key(0), base, ('o',), 4)['h_0']['attn']['out'][k]
          for k in 'ab')
  assert a.shape == (4, 8, 4) and b.shape == (4, 32) and not b.any()   # (N, H, r), (r, E)
  for key, value, match in [('rank', 0, 'lora.rank=0'), ('targets', 'q,x', "lora.targets='q,x'"),
                            ('alpha', -1.0, 'lora.alpha=-1.0')]:
    with pytest.raises(ValueError, match=match):
      lora.LoraConfig(**{key: value})


def _lora_finetune(init: str, workdir: str, seed: int = 0, task_format: str = 'head') -> dict:
  c = modeling.tiny_finetune_config(init)
  c.mode = 'lora'
  c.lora.rank = RANK
  c.train.seed = seed
  c.task.format = task_format
  return run_lib.finetune(c, workdir)


def _size(path: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def test_the_adapter_is_saved_alone_merged_on_load_and_served_beside_others(gpt_workdir,
                                                                            tmp_path):
  """A GPT fine-tuned with LoRA twice (a classifier, and the generation format: no head): each
  workdir holds the adapter and a pointer to its base; load_pretrained merges it; one backbone
  serves both; a backbone that is not the base is refused in one line."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv('PRETRAIN_JAX_CACHE', f'{gpt_workdir}_cache')
    a = _lora_finetune(gpt_workdir, str(tmp_path / 'a'), seed=0)
    b = _lora_finetune(gpt_workdir, str(tmp_path / 'b'), seed=1, task_format='generation')
    full = run_lib.finetune(modeling.tiny_finetune_config(gpt_workdir), str(tmp_path / 'full'))
    again = _lora_finetune(gpt_workdir, str(tmp_path / 'a'), seed=0)   # restores the adapter
  assert (again['start_step'], again['step'], again['final']) == (2, 2, a['final'])
  base = pretrain_jax.load_pretrained(gpt_workdir)
  # The trainable count: r * (in + out) for each q/k/v/o/MLP kernel of each layer, and the head.
  cfg, e = base.model_config, base.model_config.emb_dim
  qkv = cfg.num_heads * cfg.head_dim
  per_layer = 3 * RANK * (e + qkv) + RANK * (qkv + e) + RANK * (e + cfg.mlp_dim) * 2
  assert a['trainable_params'] == cfg.num_layers * per_layer + e * 2   # score: (E, 2)
  assert b['trainable_params'] == cfg.num_layers * per_layer           # the factors alone
  assert a['total_params'] == full['total_params'] == full['trainable_params']
  # Saved: the adapter alone, and where its base is.
  saved = json.load(open(tmp_path / 'a' / 'config.json'))
  assert saved['lora']['base'] == os.path.join(gpt_workdir, 'checkpoints', str(base.step))
  assert saved['lora']['base_fingerprint'] == base.fingerprint(('score',))
  assert _size(tmp_path / 'a' / 'checkpoints') * 3 < _size(tmp_path / 'full' / 'checkpoints')
  # Loaded, the adapter is merged into its base.
  model_a = pretrain_jax.load_pretrained(str(tmp_path / 'a'))
  texts = ['The list is sorted in place.', 'list The sorted is place in.', 'a b c']
  served_a, served_b = base.with_adapter(str(tmp_path / 'a')), base.with_adapter(
      str(tmp_path / 'b'))
  assert served_a.predict(texts) == model_a.predict(texts)
  labels = served_b.predict(texts)   # by the labels' likelihood after the prompt
  assert labels == pretrain_jax.load_pretrained(str(tmp_path / 'b')).predict(texts)
  assert set(labels) <= {'original', 'shuffled'}
  ids = np.asarray(base.tokenizer.encode(texts[0]))[None]
  np.testing.assert_array_equal(served_a(ids), model_a(ids))
  assert not np.array_equal(served_a(ids), served_b(ids))
  # Both adapters read the backbone's own arrays where they change nothing.
  assert served_a.params['wte']['embedding'] is base.params['wte']['embedding']
  assert served_b.params['h_0']['ln_1']['scale'] is base.params['h_0']['ln_1']['scale']
  # Another backbone (one weight off) is refused, in one line naming the adapter.
  params = jax.tree.map(lambda x: x, base.params)
  params['ln_f']['bias'] = params['ln_f']['bias'] + 1e-3
  with pytest.raises(ValueError, match=r'adapter .*/a was trained on base .*fingerprint') as e:
    base.replace_params(params).with_adapter(str(tmp_path / 'a'))
  assert '\n' not in str(e.value)
  with pytest.raises(ValueError, match='is not a LoRA adapter'):
    base.with_adapter(str(tmp_path / 'full'))
  with pytest.raises(ValueError, match=r'/a holds a LoRA adapter of .*export its base'):
    hf_convert.export_hf(str(tmp_path / 'a'), str(tmp_path / 'hf'))
  # Resuming the adapter's workdir from a base that changed is refused too.
  c = modeling.tiny_finetune_config(gpt_workdir)
  c.mode, c.lora.rank = 'lora', RANK
  config = run_lib.build_config(c, base.replace_params(params), run_lib.load_task(
      run_lib.FinetuneConfig.from_config(c)))
  with pytest.raises(ValueError, match=r'holds an adapter of base .*fingerprint'):
    run_lib.check_resume(config, str(tmp_path / 'a'))
