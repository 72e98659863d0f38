"""The chapter-41 experiment: BERT vs GPT on character-level tiny Shakespeare.

  pretrain-jax shakespeare --corpus PATH/tinyshakespeare.txt
  pretrain-jax shakespeare --corpus ... --config=configs/shakespeare_char.py:product

Train on characters [0, 72000), validate GPT on [72000, 80000), hold out [80000, 100000) for
BERT's masked-LM accuracy (against a random-init encoder). Published reference: GPT validation
perplexity 5.69; BERT held-out MLM top-1 0.569, top-5 0.857.

Variant 'chapter' (default): the chapter's ONE skeleton trained twice, the attention mask the
only difference (`model.causal`): token embedding + fixed sinusoidal positions, two pre-LN
blocks, a final LayerNorm and a Linear head, PyTorch's default initialisation, no dropout on the
embeddings. scripts/shakespeare_torch.py runs the same protocol in PyTorch.
Variant 'product': the project's real BERT (post-LN, embedding LayerNorm, MLM transform, tied
head, N(0, 0.02)) against the GPT stack, both with the product's embedding dropout.
"""
import ml_collections

from configs import common

VARIANTS = ('chapter', 'product')


def _chapter_model(causal: bool) -> ml_collections.ConfigDict:
  m = ml_collections.ConfigDict()
  m.family = 'gpt'                  # one skeleton for both: the GPT family's pre-LN stack
  m.causal = causal                 # THE difference: GPT causal, BERT bidirectional (+ MLM)
  m.vocab_size = 0                  # filled in from the corpus characters (+ [MASK])
  m.num_layers = 2                  # transformer blocks
  m.emb_dim = 96                    # d_model
  m.num_heads = 4                   # attention heads
  m.head_dim = 24                   # d_model / heads
  m.mlp_dim = 256                   # d_ff
  m.max_len = 48                    # context length
  m.activation = 'relu'             # feed-forward activation
  m.position_embedding = 'sinusoidal'  # fixed sin/cos positions, added to the token embedding
  m.kernel_init = 'torch_default'   # nn.Linear U(+-1/sqrt(fan_in)), nn.Embedding N(0, 1)
  m.dropout_rate = 0.1              # on the residual branches
  m.attention_dropout_rate = 0.1    # on the attention probabilities
  m.embedding_dropout = False       # the chapter adds embeddings and positions, no dropout
  m.layer_norm_eps = 1e-5           # PyTorch's LayerNorm epsilon
  m.tie_embeddings = False          # a Linear output head ...
  m.head_bias = not causal          # ... GPT without bias, BERT with
  return m


def _product_model(family: str) -> ml_collections.ConfigDict:
  m = ml_collections.ConfigDict()
  m.family = family                 # 'gpt' (pre-LN causal) or 'bert' (post-LN bidirectional)
  m.vocab_size = 0                  # filled in from the corpus characters (+ [MASK])
  m.num_layers = 2
  m.emb_dim = 96
  m.num_heads = 4
  m.head_dim = 24
  m.mlp_dim = 256
  m.max_len = 48
  m.activation = 'relu'
  m.position_embedding = 'sinusoidal'
  m.kernel_init = 'normal'          # N(0, 0.02); GPT below: 'fan_in' (N(0, 1/fan_in))
  m.dropout_rate = 0.1
  m.attention_dropout_rate = 0.1
  m.layer_norm_eps = 1e-5
  m.nsp = False
  m.tie_embeddings = True
  return m


def _train(steps: int) -> ml_collections.ConfigDict:
  t = common.train_config(batch_size=64, steps=steps, learning_rate=3e-3)
  t.update(warmup_steps=0, schedule='cosine', final_lr_fraction=0.0, optimizer='adamw',
           weight_decay=0.0, grad_clip=1.0)  # plain Adam, cosine to 0, clip at 1.0
  t.prng_impl = 'threefry2x32'      # philox4x32 draws dropout masks faster on one CPU device but
                                    # does not compile on a batch split over cpu_devices
  t.steps_per_call = 100            # train steps per jitted call (a lax.scan over 100 batches)
  return t


def get_config(variant: str = 'chapter') -> ml_collections.ConfigDict:
  if variant not in VARIANTS:
    raise ValueError(f'shakespeare_char variant {variant!r}; expected one of {VARIANTS}')
  c = ml_collections.ConfigDict()
  c.corpus = ''                     # path of tinyshakespeare.txt (required)
  c.train_chars = (0, 72_000)       # training characters
  c.valid_chars = (72_000, 80_000)  # GPT validation perplexity characters
  c.heldout_chars = (80_000, 100_000)  # BERT held-out masked-LM characters
  c.mlm_probability = 0.15          # BERT: selected share (80% [MASK] / 10% random / 10% kept)
  c.masking = 'token'               # BERT: 'token' (each character on its own) or 'span'
                                    # (SpanBERT: geometric(0.2) span lengths up to 10,
                                    # 80/10/10 per span; exercise 41.3); evaluation masks by
                                    # character either way
  c.span_length = 0                 # masking='span': > 0 gives every span this length
  c.models = 'gpt,bert'             # which to train: 'gpt,bert', 'gpt' or 'bert'
  c.finetune = ml_collections.ConfigDict()  # exercises 41.3 / 41.4: each model fine-tuned on
                                    # word order, one mean-pooled linear head for all
                                    # (pretrain_jax/experiments/char_transfer.py)
  c.finetune.steps = 0              # fine-tuning steps (every weight trains); 0 = none
  c.finetune.batch_size = 64
  c.finetune.learning_rate = 1e-3
  c.finetune.train_examples = 2000  # windows of the training characters, half words shuffled
  c.finetune.eval_examples = 1000   # windows of the held-out characters
  c.finetune.seed = 0               # task windows and head init (plus config.seed)
  c.finetune.scratch = False        # True: fine-tune the random-init models, no pre-training
                                    # (the baseline of the exercises)
  c.eval_seed = 1234                # fixed masking of the held-out windows
  c.eval_draws = 20                 # BERT: also the mean over this many maskings (seeds
                                    # eval_seed, eval_seed + 1, ...) and its spread
  c.seed = 0                        # added to every seed (data, masking, init, dropout)
  if variant == 'chapter':
    c.gpt = ml_collections.ConfigDict({'train': _train(600)})
    c.bert = ml_collections.ConfigDict({'train': _train(1500)})
    c.gpt.model = _chapter_model(causal=True)    # family='gpt': causal mask, next-character loss
    c.bert.model = _chapter_model(causal=False)  # the same stack, bidirectional, masked-LM loss
  else:
    c.gpt = ml_collections.ConfigDict({'model': _product_model('gpt'), 'train': _train(600)})
    c.gpt.model.kernel_init = 'fan_in'  # trains better here than N(0, 0.02) (docs/chapter41.md)
    c.gpt.model.tie_embeddings = False  # untied: a lower validation perplexity at this size
    c.bert = ml_collections.ConfigDict({'model': _product_model('bert'), 'train': _train(1500)})
    c.bert.train.warmup_steps = 100   # post-LN BERT at 3e-3 needs it
  c.mesh = common.mesh_config()
  c.cpu_devices = 2                 # pretrain-jax shakespeare splits the host CPU into this many
                                    # XLA devices (data parallel); 0 = leave JAX's default
  return c
