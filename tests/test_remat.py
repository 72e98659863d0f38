"""model.remat: the policies by name (layers.REMAT) over the tensors the shared layers name, the
same loss and gradients scanned or unrolled under each, and (the TPU compiler) a scanned stack
at the unrolled one's bytes per row."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals
from modeling import init, tiny, tokens

from pretrain_jax.hf import weights
from pretrain_jax.models import build, family_of
from pretrain_jax.models.config import REMAT_POLICIES, ModelConfig
from pretrain_jax.models.layers import ATTENTION_NAMES, REMAT
from pretrain_jax.training import task

MLP_NAMES = {'gpt': ('mlpwi', 'mlpwo'), 't5': ('mlpwi_0', 'mlpwi_1', 'mlpwo')}


def _loss(cfg):
  """The training loss of (params, batch) for cfg's model; dropout (where its rates are not 0)
  from a fixed key."""
  model, family = build(cfg.replace(deterministic=False)), family_of(cfg)

  def loss(params, batch):
    sums = task.loss_sums(model, params, batch, rngs={'dropout': jax.random.key(3)})
    return task.total_loss(sums, task.denominators(family, batch))
  return loss


def _batch(cfg):
  return family_of(cfg).example_batch(np.asarray(tokens((2, 13))))


@pytest.fixture(scope='module', params=['gpt', 't5'])
def unrolled(request):
  """(cfg, params, batch, loss, gradients) of a tiny model, its layers unrolled, no remat,
  without dropout (a scanned stack draws its layers' masks from other keys)."""
  cfg = tiny(request.param)
  params, batch = init(cfg), _batch(cfg)
  loss, grads = jax.jit(jax.value_and_grad(_loss(cfg)))(params, batch)
  return cfg, params, batch, loss, grads


def _check(cfg, params, batch, want_loss, want_grads):
  loss, grads = jax.jit(jax.value_and_grad(_loss(cfg)))(params, batch)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=2e-4, atol=1e-6),
               grads, want_grads)


def test_every_policy_has_a_name_the_config_accepts():
  assert tuple(REMAT) == REMAT_POLICIES


@pytest.mark.parametrize('policy', REMAT_POLICIES)
def test_scanned_under_each_policy_gives_the_unrolled_loss_and_gradients(unrolled, policy):
  cfg, params, batch, want_loss, want_grads = unrolled
  cfg = cfg.replace(scan_layers=True, remat=policy)
  _check(cfg, weights.stack_layers(cfg, params), batch, want_loss,
         weights.stack_layers(cfg, want_grads))


@pytest.fixture(scope='module')
def with_dropout():
  """The unrolled tiny GPT's (cfg, params, batch, loss, gradients) with dropout, no remat."""
  cfg = tiny('gpt', dropout_rate=0.1, attention_dropout_rate=0.1)
  params, batch = init(cfg), _batch(cfg)
  return (cfg, params, batch, *jax.jit(jax.value_and_grad(_loss(cfg)))(params, batch))


@pytest.mark.parametrize('policy', REMAT_POLICIES[1:])
def test_each_policy_recomputes_the_same_dropout_masks(with_dropout, policy):
  """A policy's backward redraws the very masks its forward drew."""
  cfg, params, batch, want_loss, want_grads = with_dropout
  _check(cfg.replace(remat=policy), params, batch, want_loss, want_grads)


def _saved_names(capsys, cfg, params, batch):
  """The checkpoint names of the tensors cfg's forward saves for its backward."""
  capsys.readouterr()
  print_saved_residuals(_loss(cfg), params, batch)
  saved = capsys.readouterr().out
  return {n for n in ATTENTION_NAMES + MLP_NAMES[cfg.family] if f"'{n}'" in saved}


@pytest.mark.parametrize('policy, kept', [
    ('save_dot_except_mlp', 'attention'),     # the MLP's projections recomputed
    ('minimal_with_context', 'context'),      # the matmuls' outputs kept by primitive, not name
    ('full', 'nothing')])
def test_a_policy_keeps_the_named_tensors_it_names(capsys, unrolled, policy, kept):
  """The layers name q/k/v/out projections, the attention output ('context') and the MLP's
  projections (mlpwi, or mlpwi_0/mlpwi_1 gated, mlpwo); a policy of names keeps those."""
  cfg, params, batch = unrolled[:3]
  # unrolled: a scan's residuals are its stacked outputs, their names not shown
  names = _saved_names(capsys, cfg.replace(remat=policy), params, batch)
  assert names == {'attention': set(ATTENTION_NAMES), 'context': {'context'},
                   'nothing': set()}[kept]


def test_without_remat_every_name_is_in_the_program(unrolled):
  cfg, params, batch = unrolled[:3]
  text = str(jax.make_jaxpr(_loss(cfg))(params, batch))
  for name in ATTENTION_NAMES + MLP_NAMES[cfg.family]:
    assert f'name={name}' in text, name


def test_a_bad_policy_name_is_refused_naming_it_and_the_choices():
  with pytest.raises(ValueError, match=r"remat='minimum'.*'save_dot_except_mlp'"):
    tiny('gpt', remat='minimum')
  with pytest.raises(ValueError, match="remat='minimum'"):
    ModelConfig.from_config(dict(tiny('bert').to_dict(), remat='minimum'))


def test_bert_scanned_under_a_policy_gives_the_unrolled_loss():
  cfg = tiny('bert')
  params, batch = init(cfg), _batch(cfg)
  want = jax.jit(_loss(cfg))(params, batch)
  scanned = cfg.replace(scan_layers=True, remat='save_dot_except_mlp')
  got = jax.jit(jax.value_and_grad(_loss(scanned)))(weights.stack_layers(scanned, params), batch)
  np.testing.assert_allclose(got[0], want, rtol=1e-6)
  assert jnp.isfinite(got[0])


def _bytes_per_row(model: dict) -> float:
  """The TPU compiler's peak bytes of a tiny GPT's train step on one v5e chip (no collective
  buffer is per row) at 4 rows less that at 2, per row."""
  import configs.tiny_gpt  # noqa: PLC0415
  from pretrain_jax.perf import plan  # noqa: PLC0415
  config = configs.tiny_gpt.get_config()
  config.model.update(num_layers=4, emb_dim=128, num_heads=1, head_dim=128, mlp_dim=512,
                      max_len=256, vocab_size=256, attention_impl='splash',
                      attention_dropout_rate=0.0, **model)
  config.data.seq_len = 256
  return plan.bytes_per_row(plan.Planner(config, 'v5litepod-1'))


@pytest.mark.slow
def test_a_scanned_stack_holds_the_unrolled_stack_s_bytes_per_row():
  """Without a policy, nn.scan's partial evaluation keeps every intermediate the backward
  reads (float32 LayerNorm and GELU ones among them) as stacked loop outputs: 4x the unrolled
  program's bytes per row here. A scanned 'none' keeps the matmul and attention-kernel
  outputs alone and recomputes the rest, as the unrolled program's fusions do. At this tiny
  width the loop still holds more per row than the unrolled program (the compiler pinned here:
  4,572,416 against 3,819,264 bytes, 1.20x; GPT-2 small's shapes at 4 layers: 0.90x,
  docs/training.md), so the bound here is 1.25x: the keep-everything scan is 4x."""
  unrolled = _bytes_per_row({'scan_layers': False, 'remat': 'none'})
  scanned = _bytes_per_row({'scan_layers': True, 'remat': 'none'})
  assert scanned < 1.25 * unrolled, (scanned, unrolled)
