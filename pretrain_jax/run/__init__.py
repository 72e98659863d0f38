"""A training run around the pure step (pretrain_jax/training): the loop, orbax checkpoints and
their checksums, the workdir's files and lock, agreements between hosts, metrics files and the
profiler. Everything here touches files, clocks, signals or other processes."""
