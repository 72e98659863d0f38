"""The TPU compiler's numbers in docs/performance.md: `pretrain-jax plan` over the published
configs and the memory table's cases, one process per plan, one JSON line per plan appended to
--out (a rerun skips the plans already there).

    nice -n 10 python scripts/tpu_plans.py --out tpu_plans.jsonl [--parts published,memory,fit]

Parts, in the order they run:
  headline   GPT-2 small, 1024 tokens, bf16, splash, fsdp 8 on a v5e-8 at batch 64, --fit, and
             its answer
  published  every pre-training config in configs/ at its published batch on a v5e-8 and a
             v4-8, as published and with docs/cloud_tpu.md's TPU settings (bf16, attention
             dropout 0)
  memory     GPT-2 small, BERT-base, T5-base at 512 / 1024 / 2048 tokens, dense (reference)
             and kernel (splash) attention, on 4 chips of a v5e and a v4 (pure data
             parallelism) at 1 and 2 rows per chip: bytes per row, fixed bytes
  fit        --fit for the memory table's cases at 1024 tokens (its max rows, checked)
  tiny_families  tiny_gpt and tiny_t5 on a v5p-8 and a v6e-8
  families   GPT-2 small, BERT-base, T5-base with the TPU settings on a v5p-8 and a v6e-8
  published_fit  --fit for every published config with the TPU settings

Several runners may share one --out (e.g. two under `nice`): each plan goes to the first runner
that claims it (a file in <out>.claims/). `--markdown` prints the tables of docs/performance.md
from --out instead of planning.
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time

import configs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TPU_SETTINGS = ['--config.model.dtype=bfloat16', '--config.model.attention_dropout_rate=0']
TOPOLOGIES = ('v5litepod-8', 'v4-8')
MEMORY_MODELS = ('gpt2_small', 'bert_base', 't5_base')
LENGTHS = (1024, 512, 2048)


def pretraining_configs() -> list:
  """The pre-training configs: the published models first (base sizes before large), then the
  benchmark shapes and the tiny ones."""
  names = [n for n in configs.config_names() if n not in ('finetune', 'shakespeare_char')]

  def models_first(n):
    return (n.startswith(('tiny', 'bench')), n.startswith('tiny'),
            'large' in n or 'medium' in n, n)
  return sorted(names, key=models_first)


def memory_case(name: str, length: int, impl: str) -> list:
  del name
  return TPU_SETTINGS + [f'--config.data.seq_len={length}', f'--config.model.max_len={length}',
                         f'--config.model.attention_impl={impl}']


def jobs(parts) -> list:
  out = []
  if 'headline' in parts:
    case = TPU_SETTINGS + ['--config.model.attention_impl=splash', '--config.mesh.data=1',
                           '--config.mesh.fsdp=8', '--config.train.batch_size=64']
    out.append(('headline', 'gpt2_small', 'v5litepod-8', case, False))
    out.append(('headline', 'gpt2_small', 'v5litepod-8', case, True))
    out.append(('headline', 'gpt2_small', 'v5litepod-8', case[:-1] + [
        '--config.train.batch_size=56'], False))   # --fit's answer, with its peak
  if 'published' in parts:   # as published first: those that do not fit are refused fast
    for settings in ([], TPU_SETTINGS):
      for name in pretraining_configs():
        for topology in TOPOLOGIES:
          out.append(('published', name, topology, settings, False))
  if 'tiny_families' in parts:   # the tiny configs on the other generations (seconds each)
    for name in ('tiny_gpt', 'tiny_t5'):
      for topology in ('v5p-8', 'v6e-8'):
        out.append(('families', name, topology, [], False))
  if 'families' in parts:   # the other generations plan compiles for
    for name in ('gpt2_small', 'bert_base', 't5_base'):
      for topology in ('v5p-8', 'v6e-8'):
        out.append(('families', name, topology, TPU_SETTINGS, False))
  if 'published_fit' in parts:
    for name in pretraining_configs():
      for topology in TOPOLOGIES:
        out.append(('published_fit', name, topology, TPU_SETTINGS, True))
  if 'memory' in parts:
    for length in LENGTHS:
      for topology, rows in (('v5litepod-4', 4), ('v4-8', 4)):
        for name in MEMORY_MODELS:
          for impl in ('reference', 'splash'):
            for batch in (rows, 2 * rows):
              out.append(('memory', name, topology, memory_case(name, length, impl)
                          + [f'--config.train.batch_size={batch}', '--noeval'], False))
  if 'fit' in parts:
    for topology in ('v5litepod-4', 'v4-8'):
      for name in MEMORY_MODELS:
        for impl in ('reference', 'splash'):
          out.append(('fit', name, topology, memory_case(name, 1024, impl) + ['--noeval'], True))
  return out


GIB = 2 ** 30


def _gib(n) -> str:
  return '-' if n is None else f'{n / GIB:.2f}'


def available_hbm(records) -> dict:
  """The HBM the compiler says a chip offers ('... exceeds available HBM (15.75G)'), by family."""
  out = {}
  for r in records:
    found = re.search(r'available HBM \(([\d.]+)G\)', ' '.join(r['summary']))
    if found:
      out[r['job']['topology'].split('-')[0]] = float(found.group(1)) * GIB
  return out


def published_table(records) -> list:
  rows = ['| config | settings | chips | batch | fits | train GiB / chip | eval GiB / chip | '
          'attention (Mosaic kernels) | TFLOP / chip / step | floor ms / step | tokens/s at most '
          '| compile s (train / eval) |', '|' + '---|' * 12]
  for r in records:
    if r['job']['part'] not in ('published', 'families') or not r['result']:
      continue
    x, settings = r['result'], 'TPU' if r['job']['args'] else 'as published'
    fits = 'yes' if x['fits'] else 'no'
    tflop = f"{x['flops_per_chip'] / 1e12:.3g}" if 'flops_per_chip' in x else '-'
    floor = f"{x['step_time_floor_s'] * 1e3:.1f}" if 'step_time_floor_s' in x else '-'
    ceiling = f"{x['tokens_per_s_ceiling']:,.0f}" if x.get('tokens_per_s_ceiling') else '-'
    paths = x['attention_impl'] + (f" / {x['biased_attention_impl']} (biased)"
                                   if 'biased_attention_impl' in x else '')
    kernels = f"{paths} ({x.get('attention_kernels', '-')})"
    times = f"{x['compile_s']:.0f} / {x['eval_compile_s']:.0f}" if 'eval_compile_s' in x else (
        f"{x['compile_s']:.0f}")
    # a plan from before plan.py read the compiler's peak: its bytes are the buffers' sum (*)
    summed = '*' if 'hbm_bytes_per_chip' in x and 'buffer_bytes' not in x else ''
    rows.append(f"| {r['job']['config']} | {settings} | {x['topology']} | {x['batch_size']} | "
                f"{fits} | {_gib(x.get('hbm_bytes_per_chip'))}{summed} | "
                f"{_gib(x.get('eval_hbm_bytes_per_chip'))} | {kernels} | {tflop} | {floor} | "
                f"{ceiling} | {times} |")
  return rows


def memory_table(records) -> list:
  """Per chip: fixed bytes and bytes per row from 1 and 2 rows per chip; the rows that fit in
  the HBM the compiler offers, and --fit's answer where it ran."""
  hbm = available_hbm(records)
  got, fits = {}, {}
  for r in records:
    x, job = r['result'], r['job']
    if not x or job['part'] not in ('memory', 'fit'):
      continue
    impl = next(a.split('=')[1] for a in job['args'] if 'attention_impl' in a)
    length = next(int(a.split('=')[1]) for a in job['args'] if 'seq_len' in a)
    key = (job['config'], length, job['topology'], impl)
    if job['part'] == 'memory' and x['fits']:
      got.setdefault(key, {})[x['batch_size'] // x['chips']] = x['hbm_bytes_per_chip']
    if job['part'] == 'fit':
      fits[key] = x['max_batch_size'] // x['chips']
  rows = ['| model | tokens | chip | attention | fixed GiB | GiB per row | rows per chip '
          '(estimate) | rows per chip (--fit) |', '|' + '---|' * 8]
  for key, by_rows in got.items():
    if 1 not in by_rows or 2 not in by_rows:
      continue
    name, length, topology, impl = key
    row = by_rows[2] - by_rows[1]
    fixed = by_rows[1] - row
    family = topology.split('-')[0]
    offered = hbm.get(family)
    estimate = int((offered - fixed) // row) if offered and row > 0 else '-'
    rows.append(f"| {name} | {length} | {topology.split('-')[0]} | {impl} | {_gib(fixed)} | "
                f"{_gib(row)} | {estimate} | {fits.get(key, '-')} |")
  return rows


def markdown(path: str) -> None:
  with open(path) as f:
    records = [json.loads(line) for line in f if line.strip()]
  print('\n'.join(published_table(records)))
  print()
  print('\n'.join(memory_table(records)))
  print()
  print('compiler HBM offered:', {k: v / GIB for k, v in available_hbm(records).items()})
  for r in records:
    if r['job']['part'] in ('headline', 'fit', 'published_fit'):
      print(r['command'], '->', json.dumps(r['result']))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', required=True)
  parser.add_argument('--parts', default='headline,published,memory,fit')
  parser.add_argument('--markdown', action='store_true')
  args = parser.parse_args(argv)
  if args.markdown:
    markdown(args.out)
    return
  done = set()
  if os.path.exists(args.out):
    with open(args.out) as f:
      done = {json.dumps(json.loads(line)['job']) for line in f if line.strip()}
  os.makedirs(args.out + '.claims', exist_ok=True)
  for part, name, topology, overrides, fit in jobs(args.parts.split(',')):
    job = {'part': part, 'config': name, 'topology': topology, 'args': overrides, 'fit': fit}
    key = hashlib.sha1(json.dumps(job).encode()).hexdigest()[:16]
    if json.dumps(job) in done:
      continue
    try:   # several runners share the list: each job goes to the first that claims it
      os.close(os.open(os.path.join(args.out + '.claims', key), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
      continue
    argv = [sys.executable, '-m', 'pretrain_jax.commands.plan', '--config', name,
            '--topology', topology, *overrides] + (['--fit'] if fit else [])
    start = time.time()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    record = {'job': job, 'command': ' '.join(['pretrain-jax plan'] + argv[3:]),
              'wall_s': round(time.time() - start, 1), 'rc': proc.returncode,
              'result': json.loads(lines[-1]) if proc.returncode == 0 and lines else None,
              'summary': proc.stderr.strip().splitlines()[-8:],
              'date': time.strftime('%Y-%m-%d %H:%M')}
    with open(args.out, 'a') as f:
      f.write(json.dumps(record) + '\n')
    print(json.dumps(record), flush=True)


if __name__ == '__main__':
  main()
