"""Hugging Face model directory <-> training workdir (BERT, GPT-2, T5 v1.0 / v1.1).

  pretrain-jax convert_hf import --hf_dir ~/hf/gpt2 --workdir runs/gpt2 [--scan_layers]
  pretrain-jax convert_hf export --workdir runs/gpt2 --hf_dir /tmp/gpt2_out [--step 300]

import: reads config.json + model.safetensors (or pytorch_model.bin, needs torch) and the
tokenizer files, and writes a workdir with checkpoint 0 (the HF weights, a fresh optimizer
state), config.json and the tokenizer. Evaluation scripts and pretrain_jax.load_pretrained read
it like any run; the printed `train_flags` turn the family's base config into the imported model
for pretrain-jax train, which pre-trains on from checkpoint 0 with the model's own tokenizer and
any data / train settings (a fresh optimizer state). export: writes config.json +
model.safetensors (+ tokenizer files) that
transformers' from_pretrained loads. Neither ever writes into an existing non-empty directory,
and a failure leaves nothing behind. One JSON line of results goes to stdout; an import without
tokenizer files also prints a `warning:` line on stderr (the workdir then refuses text use).
"""
import sys

from absl import app, flags

import configs
from pretrain_jax import cli
from pretrain_jax.cli import terminal

_HF_DIR = flags.DEFINE_string('hf_dir', None, 'Hugging Face model directory (read or written)')
_WORKDIR = flags.DEFINE_string('workdir', None, 'training workdir (written or read)')
_STEP = flags.DEFINE_integer('step', None, 'export: checkpoint step (default: the latest)')
_SCAN = flags.DEFINE_bool('scan_layers', False, 'import: store layers stacked for nn.scan')
_BASE = flags.DEFINE_string('base_config', None, 'import: configs/ module name for the data, '
                            'train and mesh sections (default: by family)')

COMMANDS = ('import', 'export')


def _run(argv):
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise app.UsageError(f'expected one command, {" or ".join(COMMANDS)}; got {argv[1:]}')
  from pretrain_jax.hf import convert  # noqa: PLC0415 (after the usage checks)
  if argv[1] == 'import':
    result = convert.import_hf(_HF_DIR.value, _WORKDIR.value, configs.base_config,
                               base=_BASE.value, scan_layers=_SCAN.value)
    if result.get('warning'):
      print(f"warning: {result['warning']}", file=sys.stderr, flush=True)
    summary = (f"imported {_HF_DIR.value}: a {result['family']} of {result['params']:,} "
               f"parameters, now checkpoint 0 of {result['workdir']} (data, train and mesh "
               f"from {result['base_config']})")
  else:
    result = convert.export_hf(_WORKDIR.value, _HF_DIR.value, step=_STEP.value)
    summary = (f"exported step {result['step']} of {_WORKDIR.value} ({result['family']}) to "
               f"{result['hf_dir']}, with tokenizer files "
               f"{', '.join(result['tokenizer_files']) or 'none'}")
  terminal.finish(result, summary=[summary])


def main(argv=None) -> None:
  flags.mark_flags_as_required(['hf_dir', 'workdir'])
  cli.run(_run, argv, positional=True)


if __name__ == '__main__':
  main()
