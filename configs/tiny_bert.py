"""A BERT (MLM only, packed rows) that trains on the embedded corpus on a 2-core CPU in about a
minute (the main job, pretrain-jax train_tiny).

Chosen for a 400-step budget: a 1,024-piece vocabulary (the softmax is a third of the FLOPs at
2,048, and the probe's words are single pieces either way); no dropout (the run sees each
document ~5 times); and ALiBi positions with steep slopes (MosaicBERT's choice of positions;
`alibi_bias_max` 1: heads' slopes 0.84 / 0.71 / 0.59 / 0.5 per token of distance). With fixed
sinusoidal positions 400 steps end on the masked-LM plateau (it predicts frequencies, not yet
from its neighbours, because attention starts out uniform and must first learn where to look);
ALiBi makes every head look at the neighbours from step 0. docs/performance.md has the
held-out losses of each choice.
"""
from configs import bert_base


def get_config():
  c = bert_base.get_config()
  c.model.update(vocab_size=1024, num_layers=2, emb_dim=128, num_heads=4, head_dim=32,
                 mlp_dim=512, max_len=128, nsp=False, position_embedding='alibi',
                 dropout_rate=0.0, attention_dropout_rate=0.0, alibi_bias_max=1.0)
  c.data.update(seq_len=128, nsp=False, tokenizer_vocab_size=1024, validation_fraction=0.05)
  c.train.update(batch_size=16, steps=400, learning_rate=2e-3, warmup_steps=30,
                 schedule='cosine', eval_every=400, checkpoint_every=200, log_every=50)
  return c
