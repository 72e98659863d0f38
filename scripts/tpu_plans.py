"""The TPU compiler's numbers in docs/performance.md: `pretrain-jax plan` over the published
configs and the memory table's cases, one process per plan, one JSON line per plan appended to
--out (a rerun skips the plans already there).

    nice -n 10 python scripts/tpu_plans.py --out tpu_plans.jsonl [--parts published,memory,fit]

Parts, in the order they run:
  headline   GPT-2 small, 1024 tokens, bf16, splash, fsdp 8 on a v5e-8 at batch 64, and --fit
  published  every pre-training config in configs/ at its published batch on a v5e-8 and a
             v4-8, as published and with docs/cloud_tpu.md's TPU settings (bf16, attention
             dropout 0)
  memory     GPT-2 small, BERT-base, T5-base at 512 / 1024 / 2048 tokens, dense (reference)
             and kernel (splash) attention, on 4 chips of a v5e and a v4 (pure data
             parallelism) at 1 and 2 rows per chip: bytes per row, fixed bytes
  fit        --fit for the memory table's cases at 1024 tokens (its max rows, checked)
  published_fit  --fit for every published config with the TPU settings

Several runners may share one --out (e.g. two under `nice`): each plan goes to the first runner
that claims it (a file in <out>.claims/).
"""
import argparse
import hashlib
import json
import os
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
  names = [n for n in configs.config_names() if n not in ('finetune', 'shakespeare_char')]

  def cheap_first(n):
    return (not n.startswith('tiny'), not n.startswith('bench'), 'large' in n or 'medium' in n,
            n)
  return sorted(names, key=cheap_first)


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
  if 'published' in parts:
    for settings in ([], TPU_SETTINGS):
      for name in pretraining_configs():
        for topology in TOPOLOGIES:
          out.append(('published', name, topology, settings, False))
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


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', required=True)
  parser.add_argument('--parts', default='headline,published,memory,fit')
  args = parser.parse_args(argv)
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
