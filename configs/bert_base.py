"""BERT-base (110M) with MLM + NSP heads. The base of every BERT config."""
import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  m = c.model = ml_collections.ConfigDict()
  m.family = 'bert'                 # model family: encoder-only, bidirectional mask
  m.vocab_size = 30522              # embedding rows; must equal the tokenizer's vocab_size
  m.num_layers = 12                 # transformer blocks
  m.emb_dim = 768                   # hidden size
  m.num_heads = 12                  # attention heads
  m.head_dim = 64                   # width of one head
  m.mlp_dim = 3072                  # intermediate size
  m.max_len = 512                   # position table rows
  m.type_vocab_size = 2             # token types (sentence A / B)
  m.nsp = True                      # next-sentence-prediction head (pooler + 2-way classifier)
  m.dtype = 'auto'                  # compute dtype: bfloat16 on TPU and GPU, float32 on CPU;
                                    # or 'float32' | 'bfloat16' anywhere
  m.param_dtype = 'float32'         # parameter and optimizer-state storage dtype
  m.attention_impl = 'auto'         # per backend (attention.runnable_implementation); or
                                    # 'reference' | 'xla' | 'cudnn' | 'splash'
  m.activation = 'gelu'             # exact (erf) GELU
  m.position_embedding = 'learned'  # 'learned', 'sinusoidal' or 'alibi'
  m.alibi_bias_max = 8.0            # alibi: head h of N has slope 2**(-8 h / N)
  m.dropout_rate = 0.1              # hidden dropout
  m.attention_dropout_rate = 0.1    # dropout on attention probabilities; > 0 keeps training
                                    # attention on 'reference' (no kernel has it)
  m.layer_norm_eps = 1e-12          # LayerNorm epsilon
  m.scan_layers = False             # nn.scan over blocks
  m.remat = 'none'                  # per-block rematerialisation: models/config.py REMAT_POLICIES
  c.data = common.data_config('mlm', seq_len=512)
  c.data.nsp = True
  c.train = common.train_config(batch_size=256, steps=1_000_000, learning_rate=1e-4)
  c.train.warmup_steps = 10_000
  c.train.schedule = 'linear'
  c.mesh = common.mesh_config()
  return c
