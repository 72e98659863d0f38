"""Pretraining objectives as pure functions of (tokens, rng) -> features.

The ONLY place that knows MLM (80/10/10, NSP), CLM and T5 span corruption. Every function takes
numpy arrays and an explicit `np.random.Generator`; none touches files, TensorFlow or the
tokenizer object, so each can be tested against its definition in isolation.
"""
