"""Shared pieces of every config: data, training and mesh sections.

Each configs/<name>.py builds its `model` section and calls these for the rest, so a field is
documented in exactly one place. Override anything from the command line:
`--config.train.steps=100 --config.data.seq_len=64`.
"""
import ml_collections


def data_config(objective: str, seq_len: int) -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  d.objective = objective           # 'clm' (GPT), 'mlm' (BERT), 'span_corruption' (T5) or
                                    # 'prefix_lm' (GPT with model.prefix_lm: a random split
                                    # per piece, loss after it; objectives/prefix_lm.py)
  # Source: a named tfds dataset, or local files, or (both empty) the embedded default corpus.
  d.tfds_name = ''                  # e.g. 'c4/en:3.1.0'; any tfds dataset with a text feature
  d.tfds_data_dir = ''              # tfds data_dir; may be a gs:// path on a Cloud TPU VM
  d.files = ''                      # glob of C4-format .json/.jsonl/.json.gz ("text") or .txt files
  d.text_key = 'text'               # name of the text feature
  d.train_split = 'train'           # split read for training
  d.eval_split = 'validation'       # split read for validation loss / evaluate.py
  d.validation_fraction = 0.02      # local files / embedded corpus: share of documents held out
  d.prepared_dir = ''               # local files / embedded corpus: where they are prepared as
                                    # tfds (may be gs://); '' = this host's cache on one process,
                                    # <workdir>/prepared_data (shared) on several
  # Tokenizer.
  d.tokenizer = ''                  # path to a sentencepiece .model; '' = train once and cache one
  d.tokenizer_type = 'unigram'      # when training one: 'unigram', 'bpe' or 'char'
  d.tokenizer_vocab_size = 2048     # when training one: size incl. specials, padded to 128s
  d.tokenizer_train_chars = 20_000_000  # when training one: characters of text it reads at most
  # Sequences and objective.
  d.seq_len = seq_len               # packed row length (T5: encoder input length)
  d.pack = True                     # pack several documents per row (segment ids keep them apart)
  d.mlm_probability = 0.15          # MLM: share of tokens selected for prediction
  d.whole_word_mask = False         # MLM: select whole words instead of single pieces
  d.nsp = False                     # BERT: next-sentence prediction pairs (one pair per row)
  d.noise_density = 0.15            # T5: share of tokens corrupted
  d.mean_noise_span_length = 3.0    # T5: mean corrupted span length
  # Input machinery.
  d.shuffle_buffer = 10_000         # documents in the shuffle buffer
  d.seed = 0                        # data order and masking randomness
  d.num_streams = 0                 # the data is this many streams of train.batch_size / n rows,
                                    # each reading its own share of the documents; a host count
                                    # must divide it, and it is fixed for a run (a checkpoint
                                    # resumes on any host count dividing it). 0 = gcd(batch, 8)
  d.num_parallel_calls = -1         # tf.data parallelism for tokenization; -1 = AUTOTUNE
  d.prefetch = 4                    # batches prepared ahead of the train step
  return d


def train_config(batch_size: int, steps: int, learning_rate: float) -> ml_collections.ConfigDict:
  t = ml_collections.ConfigDict()
  t.batch_size = batch_size         # global batch (sequences per step, summed over all hosts)
  t.steps = steps                   # total optimizer steps
  t.learning_rate = learning_rate   # peak learning rate
  t.warmup_steps = max(steps // 20, 1)  # linear warmup from 0 to the peak
  t.schedule = 'cosine'             # after warmup: 'cosine', 'linear', 'rsqrt' or 'constant'
  t.final_lr_fraction = 0.1         # cosine/linear decay ends at this share of the peak
  t.optimizer = 'adamw'             # 'adamw' or 'adafactor'
  t.adam_b1 = 0.9                   # AdamW first-moment decay
  t.adam_b2 = 0.999                 # AdamW second-moment decay (0.95 is common for GPTs)
  t.weight_decay = 0.01             # decoupled; never on norms, biases or embedding scales
  t.grad_clip = 1.0                 # global-norm clip; 0 disables
  t.microbatches = 1                # gradient accumulation: batch_size splits into this many
  t.z_loss = 0.0                    # coefficient of log(Z)^2 in the loss (0 disables)
  t.loss_chunk_len = 0              # LM head + cross-entropy this many positions at a time,
                                    # recomputed in the backward pass: saves the (B, T, V)
                                    # logits' memory for one more head matmul; 0 = all at once
  t.max_predictions_per_seq = -1    # LM head only on this many loss-weighted positions per row
                                    # (BERT: ~15% carry the loss); a batch with a fuller row
                                    # runs the head on every position (exact). -1 = the MLM
                                    # objective's bound (128 for 512 tokens), 0 = every position
  t.seed = 0                        # parameter init and dropout randomness
  t.prng_impl = 'threefry2x32'      # dropout key's PRNG (jax.random.key impl): 'threefry2x32'
                                    # (JAX's default, works everywhere), 'philox4x32' (cheaper
                                    # on XLA:CPU; single process only), 'rbg', 'unsafe_rbg'
  t.log_every = 10                  # steps between progress lines / TensorBoard scalars
  t.eval_every = 100                # steps between validation losses (0 disables)
  t.eval_batches = 4                # batches per validation loss
  t.checkpoint_every = 100          # steps between checkpoints, > 0 (a final one is always
                                    # saved: a value >= steps saves only at the end)
  t.keep_checkpoints = 3            # checkpoints kept on disk; 0 keeps all
  t.async_checkpoints = True        # write checkpoints in the background while training goes on
  t.checkpoint_timeout_sec = 1200   # several hosts: how long orbax's commit barriers wait for a
                                    # host whose save failed before every host stops with the error
  t.allow_config_change = ''        # resume: comma-separated train.* keys that may differ
                                    # from the workdir's config.json (pretrain_jax.training.
                                    # workdir.ALLOWABLE_KEYS, e.g. 'train.learning_rate');
                                    # steps and cadences may always change
  t.peak_tflops = 0.0               # per-device peak for the MFU estimate; 0 = guess from device
  t.profile_steps = 0               # jax.profiler trace of this many steps into
                                    # <workdir>/tensorboard/plugins/profile (0: none)
  t.profile_start_step = 0          # ... starting after this step (and never with the run's
                                    # first, compiling step)
  return t


def mesh_config() -> ml_collections.ConfigDict:
  m = ml_collections.ConfigDict()
  m.data = -1                       # pure data parallelism; -1 = all devices left over
  m.fsdp = 1                        # parameters and optimizer state sharded over this axis
  m.tensor = 1                      # heads / mlp / vocab split over this axis
  return m
