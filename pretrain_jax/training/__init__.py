"""Pure training: losses, the task's loss terms and metrics, the train state, the optimizer, the
mesh, the one jitted and sharded train/eval step, and the one evaluator. No files, locks or
processes: the run around a step (pretrain_jax/run) owns those."""
