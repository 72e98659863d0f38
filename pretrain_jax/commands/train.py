r"""Train a BERT, GPT or T5 from a config, resuming from the workdir's latest checkpoint.

  pretrain-jax train --config tiny_gpt --workdir /tmp/tiny_gpt \
      [--config.train.steps=100 --config.mesh.fsdp=4 ...]

The same command runs on CPU, GPU and TPU. On a multi-host TPU VM slice run it on every host
with --multihost (calls jax.distributed.initialize(), which finds the coordinator itself on
Cloud TPU / SLURM); each host then reads its share of the global batch. Elsewhere name it:
--coordinator_address=HOST:PORT --num_processes=N --process_id=I (CPU processes exchange
collectives over gloo, so N local processes simulate an N-host slice on one machine).
SIGTERM saves a checkpoint at the current step and exits cleanly; rerunning the command resumes
(a SIGTERM during start-up, before the first step, stops with exit 143: nothing to save yet).
In a multi-process run a process that stops with an error leaves at once (os._exit, no atexit
handlers), so the others' collectives fail at once instead of JAX's 5-minute exit barrier.

Progress and a summary go to stderr, TensorBoard and <workdir>/metrics.jsonl; stdout gets one
JSON line of results. A run refused before it trained leaves no new workdir behind.
--synthetic_data trains on random tokens (no tokenizer or corpus needed; benchmarks).
--config.data.tokenizer takes a sentencepiece .model or a Hugging Face tokenizer directory
(the hf_tokenizer/ of a workdir pretrain-jax convert_hf imported: GPT-2's BPE, BERT's WordPiece).
Every --config.SECTION.FIELD, its default and meaning: docs/training.md#configs (the fields
are on ModelConfig, DataConfig, TrainConfig and MeshConfig in pretrain_jax/models/config.py,
data/config.py and training/config.py).
"""
import contextlib
import re
import sys

from absl import flags
from ml_collections import config_flags

from pretrain_jax import cli
from pretrain_jax.cli import terminal
from pretrain_jax.training.config import RunConfig

_CONFIG = config_flags.DEFINE_config_file('config', None, cli.CONFIG_HELP, lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'checkpoints, logs and config.json go here')
_MULTIHOST = flags.DEFINE_bool('multihost', False,
                               'call jax.distributed.initialize() (multi-process runs)')
_COORDINATOR = flags.DEFINE_string('coordinator_address', None,
                                   'with --multihost: HOST:PORT of process 0 (default: detect)')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'with --multihost: process count')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'with --multihost: this process index')
_INIT_TIMEOUT = flags.DEFINE_float('init_timeout', 300.0, 'with --multihost: seconds to wait for '
                                   'every process to join, then exit 2 saying so', lower_bound=1)
_SYNTHETIC = flags.DEFINE_bool('synthetic_data', False,
                               'random token batches instead of pretrain_jax.data')
_CHECK_ARGS = flags.DEFINE_bool('check_args', False, 'parse the flags, load the config and check '
                                'its sections, then exit (pretrain-jax tpu run does this first)')


def _run(argv):
  del argv
  given = [f'--{f.name}' for f in (_COORDINATOR, _NUM_PROCESSES, _PROCESS_ID)
           if f.value is not None]
  if given and not _MULTIHOST.value:
    raise ValueError(f'{", ".join(given)} without --multihost: each process would train alone; '
                     'expected --multihost with them')
  address = _COORDINATOR.value
  if address is not None and not re.fullmatch(r'.+:[0-9]{1,5}', address):
    raise ValueError(f'--coordinator_address={address}; expected HOST:PORT')
  if _CHECK_ARGS.value:   # the flags parsed and the config's sections read: nothing else to do
    RunConfig.from_config(cli.config_of(_CONFIG, 'pre-training'))
    return
  import jax  # noqa: PLC0415 (after the flag checks)
  if _MULTIHOST.value:
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')  # CPU processes only
    if address:   # (JAX waits for every process in silence; --init_timeout says so)
      print(f'joining {_NUM_PROCESSES.value} processes at {address} (jax.distributed); start '
            'the same command on every host', file=sys.stderr, flush=True)
    try:
      cli.join_processes(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                         _INIT_TIMEOUT.value)
    except (RuntimeError, ValueError) as e:  # auto-detection found no Cloud TPU / SLURM cluster
      why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
      raise ValueError(f'--multihost could not detect the cluster ({why}); on a Cloud TPU VM '
                       'slice run the command on every worker; elsewhere pass '
                       '--coordinator_address=HOST:PORT --num_processes=N '
                       '--process_id=I') from None
  from pretrain_jax.hf import config as hf_config  # noqa: PLC0415 (after the flag checks)
  from pretrain_jax.hf import convert as hf_convert  # noqa: PLC0415 (after the flag checks)
  from pretrain_jax.hf import tokenizers as hf_tokenizers  # noqa: PLC0415 (after the flag checks)
  from pretrain_jax.models import ModelConfig  # noqa: PLC0415 (after the flag checks)
  from pretrain_jax.run import agreement, loop  # noqa: PLC0415 (after the flag checks)
  from pretrain_jax.training import synthetic  # noqa: PLC0415 (after the flag checks)
  if _MULTIHOST.value:   # a process's error reaches the others waiting in a collective at once
    cli.share_stops(agreement.announce_stop, agreement.watch_peers)
  config = cli.config_of(_CONFIG, 'pre-training')
  if jax.process_index() == 0:
    for problem in hf_config.export_problems(ModelConfig.from_config(config.model)):
      print(f'warning: trains, but cannot be exported to Hugging Face: {problem}',
            file=sys.stderr, flush=True)
  datasets = synthetic.synthetic_datasets(config) if _SYNTHETIC.value else None
  tokenizer = None
  if datasets is None:  # Hugging Face tokenizer files (an imported workdir's hf_tokenizer/)?
    tokenizer = hf_convert.data_tokenizer(config, _WORKDIR.value)
    if tokenizer is not None:
      hf_tokenizers.check_fits(tokenizer, config.model.vocab_size, 'this config')
  # (In a multi-process run the other processes may be writing the workdir: it stays.)
  with (contextlib.nullcontext() if _MULTIHOST.value
        else terminal.removed_if_refused(_WORKDIR.value)):
    results = loop.train_and_evaluate(config, _WORKDIR.value, datasets=datasets,
                                      tokenizer=tokenizer)
  if jax.process_index() == 0:
    terminal.finish(results, summary=[terminal.run_summary(results)])


def main(argv=None) -> None:
  flags.mark_flags_as_required(['config', 'workdir'])
  cli.run(_run, argv)


if __name__ == '__main__':
  main()
