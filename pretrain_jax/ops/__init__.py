"""The operations whose form depends on the backend a step runs on; model code reads as plain Flax.

  backends.py  the Tuning record: PLAIN (every ModelConfig's default) and CPU, chosen once per
               train step from its devices by training.step.make_steps (for_device)
  fp8.py       fp8 dense layers (train.fp8; GPUs with fp8 tensor cores): e4m3 operands, e5m2
               gradients, one scale per tensor from its current maximum
  cpu.py       the XLA:CPU forms CPU swaps in (dense-layer weight gradients, 16-bit dropout
               masks, the state's finiteness check, init programs' compiler options)

A bottom layer like paths.py: every package but cloud/ may import it; it imports none of them.
"""
