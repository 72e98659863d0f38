"""Will a config fit a Cloud TPU slice, at what batch, how fast at best: its train and eval
steps compiled by the TPU compiler (libtpu) for an accelerator type, on this machine, as a run
on that slice computes them (model.dtype='auto' is bfloat16 there).

  pretrain-jax plan --config gpt2_small --topology v5litepod-8 \\
      --config.model.attention_dropout_rate=0
  pretrain-jax plan --config bert_base --topology v4-32 --slices 2 --fit

--topology is a Cloud TPU accelerator type as gcloud names it (v4-8, v5litepod-16 or v5e-16,
v5p-8, v6e-8, ...; pretrain_jax/chips.py holds the table). The summary (stderr) gives per chip
the compiled train step's bytes (arguments, temporaries, code) against the chip's HBM, whether
it and the eval step fit (a batch that does not is `fits: false` with the compiler's own
message), the attention path and the Mosaic kernels that lowered, the step's FLOPs from the
compiled program (each loop body, e.g. a scanned layer stack, counted as often as it runs;
flops_source says whose count it is) and a floor on step time and tokens/s from the chip's
datasheet peak and HBM bandwidth, and the compile times. --fit also finds the largest global
batch that fits (a multiple of the data-parallel shards times the microbatches) from at most 4
compiles, and names the remat policy with the fewest FLOPs that fits the batch. --slices N
compiles a multislice run: N slices joined over the data-center network (the mesh's `dcn`
axis). Needs the TPU compiler: pip install 'pretrain_jax[tpu]' (or libtpu). The last stdout line
is one JSON object: fits, hbm_bytes_per_chip, hbm_capacity_bytes, batch_size,
max_batch_size and remat_choice (with --fit), dtype (the compute dtype), flops_per_chip,
flops_source, attention_kernels, topology, chips, slices, ...
"""
import os

# Before JAX starts: planning compiles for the named topology and runs nothing, so it takes no
# local accelerator (on a TPU VM the chips stay with the trainer).
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from pretrain_jax import cli  # noqa: E402
from pretrain_jax.cli import terminal  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, cli.CONFIG_HELP, lock_config=False)
_TOPOLOGY = flags.DEFINE_string('topology', None, 'a Cloud TPU accelerator type: v4-8, '
                                'v5litepod-8 (or v5e-8), v5p-8, v6e-8, ...')
_SLICES = flags.DEFINE_integer('slices', 1, 'slices of that type joined over the data-center '
                               'network (multislice)', lower_bound=1)
_FIT = flags.DEFINE_bool('fit', False, 'also find the largest global batch that fits (at most '
                        '4 compiles) and the remat policy to use')
_FIT_IF_REFUSED = flags.DEFINE_bool('fit_if_refused', False, 'find the largest batch that fits '
                                    "only when the configured one does not (the launcher's "
                                    'preflight)')
_EVAL = flags.DEFINE_bool('eval', True, "compile the eval step too (--noeval: the train step's "
                          'only)')

LINE_KEYS = ('fits', 'hbm_bytes_per_chip', 'hbm_capacity_bytes', 'batch_size', 'max_batch_size',
             'next_batch_size', 'planned_batch_size', 'eval_fits', 'eval_hbm_bytes_per_chip',
             'buffer_bytes', 'argument_bytes', 'temp_bytes', 'code_bytes', 'flops_per_chip',
             'model_flops_per_chip', 'bytes_accessed_per_chip', 'step_time_floor_s',
             'tokens_per_s_ceiling', 'dtype', 'attention_impl', 'biased_attention_impl',
             'attention_kernels', 'topology', 'chips',
             'slices', 'mesh', 'compile_s', 'eval_compile_s', 'fit_compiles', 'fit_compile_s',
             'fit_checked', 'fit_capped', 'fit_peaks', 'flops_source', 'compiler_flops_per_chip',
             'remat', 'remat_choice', 'remat_flops_per_chip', 'remat_compiles')


def _run(argv):
  del argv
  import jax  # noqa: PLC0415

  from pretrain_jax.perf import fit, plan  # noqa: PLC0415
  # Each plan compiles afresh: its compile time is the compiler's, not a cache read.
  jax.config.update('jax_enable_compilation_cache', False)
  config = cli.config_of(_CONFIG, 'pre-training')
  out = fit.run_plan(config, _TOPOLOGY.value, _SLICES.value, find_max=_FIT.value,
                      with_eval=_EVAL.value, fit_if_refused=_FIT_IF_REFUSED.value,
                      verbose=flags.FLAGS.verbose)
  terminal.finish({k: out[k] for k in LINE_KEYS if k in out}, summary=plan.summary(out))


def main(argv=None) -> None:
  flags.mark_flags_as_required(['config', 'topology'])
  cli.run(_run, argv)


if __name__ == '__main__':
  main()
