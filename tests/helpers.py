"""What several test modules share that needs no library: the repository root, tools for
runs' files, and the multi-process runs' command line. Tiny models, configs and runs of them are
in modeling.py; fixtures in conftest.py. A helper one module uses stays in that module."""
import json
import os
import socket

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_losses(workdir):
  """{step: loss} of the train rows of `<workdir>/metrics.jsonl`."""
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  return {r['step']: r['loss'] for r in rows if r['split'] == 'train'}


def flip_bytes(path, n=64):
  """XORs the lowest bit of `n` bytes spread over `path` (values stay plausible)."""
  with open(path, 'r+b') as f:
    data = bytearray(f.read())
    for i in range(n):
      data[i * len(data) // n] ^= 0x01
    f.seek(0)
    f.write(data)


def splice(inputs, targets, first_sentinel=2047, num_sentinels=100, eos=1):
  """Span corruption's inverse: the target spans put back in place of the input sentinels
  (`first_sentinel`: <extra_id_0>, by default of a 2048-id vocabulary)."""
  def is_sentinel(t):
    return first_sentinel - num_sentinels < t <= first_sentinel
  assert inputs[-1] == eos and targets[-1] == eos
  spans, current = {}, None
  for t in targets[:-1]:
    if is_sentinel(t):
      current = spans.setdefault(int(t), [])
    else:
      current.append(int(t))
  out = []
  for t in inputs[:-1]:
    out.extend(spans[int(t)] if is_sentinel(t) else [int(t)])
  return out


# Multi-process runs: pretrain-jax train on a tiny GPT, one CPU device per process.
TRAIN = ['-m', 'pretrain_jax.commands.train']
SMALL = ['--config', os.path.join(ROOT, 'configs', 'tiny_gpt.py'), '--config.train.batch_size=4',
         '--config.data.seq_len=32', '--config.model.num_layers=1', '--config.train.log_every=1',
         '--config.train.eval_every=0', '--config.train.checkpoint_every=100']


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def one_device_env() -> dict:
  """This process's environment without XLA_FLAGS: one CPU device per process."""
  env = dict(os.environ)
  env.pop('XLA_FLAGS', None)
  return env
