"""GPT-2 small (124M): causal LM on C4-style text. The base of every GPT config."""
import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  m = c.model = ml_collections.ConfigDict()
  m.family = 'gpt'                  # model family: decoder-only, causal mask
  m.vocab_size = 50257              # embedding rows; must equal the tokenizer's vocab_size
  m.num_layers = 12                 # transformer blocks
  m.emb_dim = 768                   # residual stream width
  m.num_heads = 12                  # attention heads
  m.head_dim = 64                   # width of one head
  m.mlp_dim = 3072                  # feed-forward hidden width
  m.max_len = 1024                  # learned position table rows (longest sequence)
  m.dtype = 'auto'                  # compute dtype: bfloat16 on TPU and GPU, float32 on CPU;
                                    # or 'float32' | 'bfloat16' anywhere
  m.param_dtype = 'float32'         # parameter and optimizer-state storage dtype
  m.attention_impl = 'auto'         # per backend (attention.runnable_implementation); or
                                    # 'reference' | 'xla' | 'cudnn' | 'splash'
  m.activation = 'gelu_tanh'        # GPT-2's tanh-approximated GELU
  m.position_embedding = 'learned'  # 'learned' or 'sinusoidal'
  m.dropout_rate = 0.1              # embedding and residual dropout
  m.attention_dropout_rate = 0.1    # dropout on attention probabilities; > 0 keeps training
                                    # attention on 'reference' (no kernel has it)
  m.layer_norm_eps = 1e-5           # LayerNorm epsilon
  m.scan_layers = False             # nn.scan over blocks (faster compiles for deep models)
  m.remat = 'none'                  # per-block rematerialisation: models/config.py REMAT_POLICIES
  c.data = common.data_config('clm', seq_len=1024)
  c.train = common.train_config(batch_size=512, steps=100_000, learning_rate=6e-4)
  c.train.weight_decay = 0.1
  c.mesh = common.mesh_config()
  return c
