"""The largest global batch a config's train step fits on a topology, and the remat policy to
use, from a few compiles by the TPU compiler (perf/plan.py's plans).

The batch search (`largest_batch`) makes at most FIT_COMPILES train-step compiles, the
configured batch's included. A global batch is a multiple of a unit (the data-parallel shards
times the microbatches), and from 2 units on the compiler's peak bytes per chip grow about
linearly in the units (1 unit is off that line: some buffers jump from 1 row per chip to 2).
So: a first batch (the configured one, or 2 units); a second far from it, that fits for sure
(the first's bytes taken as all per row: more per row than the truth, so fewer rows than fit);
the line through the two, whose prediction of the largest batch is compiled; then one unit
more, to check it, or one step down the line if the compiler refused the prediction. The
answer is the largest batch the compiler fitted; the next multiple was refused by it where
`fit_checked`, else the line predicts it does not fit (near the HBM's limit the compiler's
peak grows a little less than linearly, so the line may be a unit short). The search stops at
FIT_CAP times the configured batch (a tiny model's search: its first batch and the cap).

The remat choice (`choose_remat`) is the cheapest policy in the compiled FLOPs of those that
fit the configured batch. 'none' recomputes nothing, so no policy computes fewer FLOPs: where
it fits, it is the choice; else every other policy is compiled at the configured batch.
"""
import re
from collections.abc import Callable

from pretrain_jax import chips as chips_lib
from pretrain_jax.models.config import REMAT_POLICIES
from pretrain_jax.perf import plan as plan_lib

FIT_COMPILES = 4   # train-step compiles of the batch search, the configured batch's included
# The HBM the compiler offers a program is a little less than the chip's (v5e: "available HBM
# (15.75G)" of 16 GiB in its refusals); a refusal names it, and until one does the line aims
# at the chip's less this share.
RESERVED = 1 / 64
OFFERED = re.compile(r'available HBM \(([\d.]+)G\)')   # in the compiler's refusal
SAFETY = 0.9   # the second point: this share of the batch the first one's bytes bound
# The search stops at this many times the configured batch: a tiny model fits batches far
# beyond any it trains at, and from a few rows per chip on a compile costs several times more
# (tiny_gpt on a v5e-16: 9 CPU-seconds at 2 rows per chip, 45-48 at 256 and 4096).
FIT_CAP = 64
NO_RECOMPUTE = 'none'   # model.remat that recomputes no matmul (layers.REMAT)
# The policies --fit chooses from: REMAT_POLICIES less 'minimal_with_context', which differs
# from 'minimal' only where attention is batched matmuls (not a TPU's splash or flash kernels,
# whose output every policy but 'full' keeps): a compile the choice can spare.
FIT_POLICIES = tuple(p for p in REMAT_POLICIES if p != 'minimal_with_context')


def _next_units(seen: dict, lo: int, hi: float, capacity: float) -> int | None:
  """The next batch (in units) to compile, or None when the search is done: before there is a
  line, its points; then where the line through the two largest batches that fit (of 2 units
  or more) meets `capacity`, inside (lo, hi)."""
  line = sorted(n for n, b in seen.items() if b is not None and n >= 2)
  if not line:   # 1 unit is off the line: its bytes jump at 2
    return 2 if 2 < hi and 2 not in seen else 1
  if len(line) == 1:
    point = line[0]
    bound = int(min(SAFETY * capacity * point / seen[point], hi - 1))
    if bound > point:
      return bound
    return point // 2 if point >= 4 else (point + 1 if point + 1 < hi else None)
  a, b = line[-2:]
  per_unit = (seen[b] - seen[a]) / (b - a)
  guess = b + int((capacity - seen[b]) // per_unit) if per_unit > 0 else 2 * b
  if guess <= lo or hi - 1 <= lo:
    return None
  return int(min(guess, hi - 1))


def largest_batch(probe: Callable, unit: int, capacity, start: int = 1,
                  budget: int = FIT_COMPILES, known: dict | None = None,
                  cap: float = float('inf')) -> tuple:
  """(the largest multiple of `unit` found to fit, {units: its probe's bytes or None}), from at
  most `budget` probes (the module's docstring has the steps).

  `probe(batch)` compiles and returns the bytes per chip, or None when the batch does not fit;
  `capacity` is the bytes a chip offers, or a callable that returns them (the probe may learn
  them from a refusal); `known`: probes made already ({units: bytes or None}), in the budget;
  `cap`: the most units to try. The answer is exact when one unit more was refused:
  `seen.get(best // unit + 1, 0) is None`, or when it is the cap.
  """
  seen, answered = dict(known or {}), False
  capacity_of = capacity if callable(capacity) else lambda: capacity
  if start >= 2 and start not in seen:
    seen[start] = probe(start * unit)
  while len(seen) < budget:
    lo = max((n for n, b in seen.items() if b is not None), default=0)
    hi = min(min((n for n, b in seen.items() if b is None), default=cap + 1), cap + 1)
    if hi - lo <= 1:
      break
    on_line = len([n for n, b in seen.items() if b is not None and n >= 2]) >= 2
    n = None if answered else _next_units(seen, lo, hi, capacity_of())
    checking = n is None and on_line   # the line's answer is lo: one unit more checks it
    n = lo + 1 if checking else n
    if n is None or n in seen:   # done (or the compiler's bytes were not monotone)
      break
    seen[n] = probe(n * unit)
    if checking:
      break
    answered = on_line and seen[n] is not None   # the line's prediction (or a step down) fits
  best = max((n for n, b in seen.items() if b is not None), default=0)
  return best * unit, seen


def _offered(message: str) -> float | None:
  """The HBM the compiler offers a program, from its refusal ('... available HBM (15.75G)')."""
  found = OFFERED.search(message or '')
  return float(found.group(1)) * chips_lib.GIB if found else None


def choose_remat(planner: plan_lib.Planner, records: dict, fits: bool,
                 policies=REMAT_POLICIES) -> dict:
  """The cheapest remat policy in the compiled FLOPs of those whose train step fits the
  configured batch (None when none does): NO_RECOMPUTE where it fits, else one compile per
  other policy at that batch. `records`: the configured policy's plans by batch; `fits`:
  whether it fits the configured batch (the search knows)."""
  batch, configured = planner.run.train.batch_size, planner.run.model.remat
  plans, compiles = {}, 0

  def plan_of(policy):
    nonlocal compiles
    if policy == configured and batch in records:
      return records[batch]
    compiles += 1
    return plan_lib.plan(planner if policy == configured else planner.with_remat(policy), batch,
                         with_eval=False)

  if NO_RECOMPUTE in policies:
    if configured == NO_RECOMPUTE and fits:
      plans[NO_RECOMPUTE] = records.get(batch, {'fits': True})
    else:
      plans[NO_RECOMPUTE] = plan_of(NO_RECOMPUTE)
  if not plans.get(NO_RECOMPUTE, {}).get('fits'):
    plans.update({p: plan_of(p) for p in policies if p != NO_RECOMPUTE})
  fitting = sorted((p.get('flops_per_chip', 0.0), policies.index(name), name)
                   for name, p in plans.items() if p['fits'])
  return {'remat_choice': fitting[0][2] if fitting else None, 'remat_compiles': compiles,
          'remat_flops_per_chip': {name: p.get('flops_per_chip') if p['fits'] else None
                                   for name, p in plans.items()}}


def fit(planner: plan_lib.Planner, with_eval: bool = True, head: dict = None,
        policies: tuple = ()) -> dict:
  """The plan of the largest batch that fits, with `max_batch_size`, `next_batch_size` (the
  next multiple: refused by the compiler when `fit_checked`, not tried when `fit_capped` (the
  search stops at FIT_CAP times the configured batch), else predicted by the line not to fit),
  whether the configured batch fits, the train-step compiles made (`fit_compiles`, at
  most FIT_COMPILES) and their peaks (`fit_peaks`: bytes per chip by batch, None if refused).
  `head`: the configured batch's plan, if made already. `policies`: remat policies to choose
  from (choose_remat), none by default."""
  configured, unit = planner.run.train.batch_size, planner.unit
  records = {configured: head} if head else {}
  offered = {'bytes': planner.topology.chip.hbm_bytes * (1 - RESERVED)}

  def probe(batch_size):
    if batch_size not in records:
      records[batch_size] = plan_lib.plan(planner, batch_size, with_eval=False)
    record = records[batch_size]
    if not record['fits']:
      offered['bytes'] = _offered(record.get('compiler_message')) or offered['bytes']
      return None
    return record['hbm_bytes_per_chip']

  start = max(configured // unit, 1)
  best, seen = largest_batch(probe, unit, lambda: offered['bytes'], start=start,
                             known={start: probe(configured)} if head else None,
                             cap=FIT_CAP * start)
  fits = best >= configured   # a batch fits when a larger one does
  out = dict(records[best] if best else records.get(configured) or records[min(records)])
  if best and with_eval:
    plan_lib.add_eval(planner, best, out)
  out.update(planned_batch_size=best, batch_size=configured, fits=fits,
             max_batch_size=best, next_batch_size=best + unit,
             fit_checked=seen.get(best // unit + 1, 0) is None,
             fit_capped=best == FIT_CAP * start * unit, fit_compiles=len(records),
             fit_peaks={b: r.get('hbm_bytes_per_chip') if r['fits'] else None
                        for b, r in sorted(records.items())},
             fit_compile_s=round(sum(r['compile_s'] for r in records.values()), 1))
  if not fits:
    out['compiler_message'] = records.get(configured, {}).get('compiler_message', '')
  if policies:
    out.update(choose_remat(planner, records, fits, tuple(policies)))
  return out


def run_plan(config, tpu_type: str, slices: int = 1, find_max: bool = False,
             with_eval: bool = True, fit_if_refused: bool = False,
             verbose: bool = False) -> dict:
  """What `pretrain-jax plan` computes (commands/plan.py): the plan of the configured batch;
  `find_max` adds the largest batch that fits and the remat policy to use (fit), `fit_if_refused`
  the largest batch only when the configured one does not fit (the launcher's preflight)."""
  planner = plan_lib.Planner(config, tpu_type, slices, verbose)
  if find_max:
    return fit(planner, with_eval, policies=FIT_POLICIES)
  out = plan_lib.plan(planner, with_eval=with_eval)
  return fit(planner, with_eval, head=out) if fit_if_refused and not out['fits'] else out
