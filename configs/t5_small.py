"""T5-small v1.0 (60.5M): span corruption on C4-style text. The base of every T5 config."""
import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  m = c.model = ml_collections.ConfigDict()
  m.family = 't5'                   # model family: encoder-decoder
  m.vocab_size = 32128              # T5's 32k sentencepiece vocabulary + sentinels, padded to 128s
  m.num_layers = 6                  # encoder blocks
  m.num_decoder_layers = 6          # decoder blocks (0 = same as num_layers)
  m.emb_dim = 512                   # d_model
  m.num_heads = 8                   # attention heads
  m.head_dim = 64                   # d_kv
  m.mlp_dim = 2048                  # d_ff
  m.max_len = 512                   # longest input the data pipeline may produce
  m.dtype = 'auto'                  # compute dtype: bfloat16 on TPU and GPU, float32 on CPU;
                                    # or 'float32' | 'bfloat16' anywhere
  m.param_dtype = 'float32'         # parameter and optimizer-state storage dtype
  m.attention_impl = 'auto'         # per backend (attention.runnable_implementation); or
                                    # 'reference' | 'xla' | 'cudnn' | 'splash'
  m.activation = 'relu'             # v1.0: ReLU; v1.1: 'gated-gelu'
  m.position_embedding = 'relative' # T5 relative position bias (the only choice for T5)
  m.relative_buckets = 32           # relative position buckets
  m.relative_max_distance = 128     # distance beyond which buckets are shared
  m.tie_embeddings = True           # v1.0: LM head = shared embedding (logits * d_model**-0.5)
  m.dropout_rate = 0.1              # dropout on embeddings, sublayer outputs and FF activations
  m.attention_dropout_rate = 0.0    # T5 has no dropout on attention probabilities
  m.layer_norm_eps = 1e-6           # RMSNorm epsilon
  m.norm = 'rmsnorm'                # scale-only RMSNorm, statistics in fp32 (BERT/GPT: layernorm)
  m.dense_bias = False              # no biases on dense layers
  m.kernel_init = 'fan_in'          # N(0, 1/fan_in), as Mesh TensorFlow
  m.fold_query_scale = True         # no 1/sqrt(d_kv) on the logits: the query init carries it
  m.mlp_dropout = True              # dropout on the feed-forward activations too
  m.scan_layers = False             # nn.scan over blocks
  m.remat = 'none'                  # per-block rematerialisation: models/config.py REMAT_POLICIES
  c.data = common.data_config('span_corruption', seq_len=512)
  c.train = common.train_config(batch_size=128, steps=524_288, learning_rate=1e-2)
  c.train.update(optimizer='adafactor', schedule='rsqrt', warmup_steps=10_000,
                 weight_decay=0.0, grad_clip=0.0)
  c.mesh = common.mesh_config()
  return c
