"""Weight rules: one HF tensor <-> one or more of our leaves, with a pair of reshapes that are
exact inverses (transposes, reshapes, splits: no arithmetic). The family modules build their
rule lists from these; hf/weights.py applies them.

Layouts: torch Linear weight is (out, in), our kernels (in, out); attention kernels are
(E, N, H) for q/k/v and (N, H, E) for the output.
"""
import dataclasses
from collections.abc import Callable, Sequence


@dataclasses.dataclass(frozen=True)
class Rule:
  hf: str                                 # HF tensor name
  ours: Sequence[str]                     # our leaf paths, 'a/b/kernel'
  to_ours: Callable = None                # hf array -> tuple of our arrays
  to_hf: Callable = None                  # our arrays -> hf array


def copy(hf, ours):
  return Rule(hf, (ours,), lambda w: (w,), lambda w: w)


def linear(hf_prefix, ours, bias=True):
  """torch Linear (out, in) -> DenseGeneral kernel (in, out) [+ bias]."""
  rules = [Rule(hf_prefix + '.weight', (ours + '/kernel',), lambda w: (w.T,), lambda k: k.T)]
  if bias:
    rules.append(copy(hf_prefix + '.bias', ours + '/bias'))
  return rules


def heads_in(cfg, hf_prefix, ours, bias=True):
  """Linear (N*H, E) -> (E, N, H); bias (N*H,) -> (N, H)."""
  n, h = cfg.num_heads, cfg.head_dim
  rules = [Rule(hf_prefix + '.weight', (ours + '/kernel',),
                lambda w: (w.T.reshape(w.shape[1], n, h),), lambda k: k.reshape(k.shape[0], -1).T)]
  if bias:
    rules.append(Rule(hf_prefix + '.bias', (ours + '/bias',), lambda b: (b.reshape(n, h),),
                      lambda b: b.reshape(-1)))
  return rules


def heads_out(cfg, hf_prefix, ours, bias=True):
  """Linear (E, N*H) -> (N, H, E)."""
  n, h = cfg.num_heads, cfg.head_dim
  rules = [Rule(hf_prefix + '.weight', (ours + '/kernel',),
                lambda w: (w.T.reshape(n, h, w.shape[0]),), lambda k: k.reshape(n * h, -1).T)]
  if bias:
    rules.append(copy(hf_prefix + '.bias', ours + '/bias'))
  return rules


def norm(hf_prefix, ours, bias=True):
  rules = [copy(hf_prefix + '.weight', ours + '/scale')]
  if bias:
    rules.append(copy(hf_prefix + '.bias', ours + '/bias'))
  return rules
