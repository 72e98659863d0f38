"""The chapter-41 experiment in PyTorch: the reference side of `pretrain-jax shakespeare`.

  python scripts/shakespeare_torch.py --corpus tinyshakespeare.txt [--seed 0]

The chapter's one skeleton trained twice (token embedding + fixed sinusoidal positions, two
pre-LN blocks with separate q/k/v/o Linear layers, a final LayerNorm and a Linear head; the
causal mask for GPT, none for BERT), PyTorch's default initialisation, Adam at 3e-3 with cosine
decay to 0, clip 1.0, batch 64, context 48. Data splits, training batches (same generator and
seed) and evaluation batches are the project's (`pretrain_jax.experiments.char_lm`), so the two
runs differ only in the framework. Needs torch (the `test` extra). Prints a summary on
stderr and one JSON line whose shared keys mean what `pretrain-jax shakespeare`'s do: seed;
gpt.train_seconds, final_train_loss, valid_perplexity; bert.train_seconds, final_train_loss,
heldout_top1, heldout_top5 and the means over config.eval_draws maskings (heldout_top1_mean,
...; char_lm.mlm_draws), plus framework and threads; no random-init baselines.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
from torch import nn

from configs import shakespeare_char
from pretrain_jax.experiments import char_lm


class Block(nn.Module):
  def __init__(self, d, heads, ff, dropout):
    super().__init__()
    self.heads = heads
    self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
    self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
    self.ff = nn.Sequential(nn.Linear(d, ff), nn.ReLU(), nn.Linear(ff, d))
    self.drop = nn.Dropout(dropout)
    self.p = dropout

  def forward(self, x, causal):                                  # (B, T, D)
    b, t, d = x.shape
    h = self.ln_1(x)
    def split(y):
      return y.view(b, t, self.heads, d // self.heads).transpose(1, 2)  # (B, N, T, H)
    a = nn.functional.scaled_dot_product_attention(
        split(self.q(h)), split(self.k(h)), split(self.v(h)), is_causal=causal,
        dropout_p=self.p if self.training else 0.0)
    x = x + self.drop(self.o(a.transpose(1, 2).reshape(b, t, d)))
    return x + self.drop(self.ff(self.ln_2(x)))


class Model(nn.Module):
  def __init__(self, vocab, m, causal):
    super().__init__()
    self.causal = causal
    self.tok = nn.Embedding(vocab, m.emb_dim)
    half = m.emb_dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half) / half)
    angles = torch.arange(m.max_len)[:, None] * freqs
    self.register_buffer('pos', torch.cat([angles.sin(), angles.cos()], -1))
    self.blocks = nn.ModuleList(Block(m.emb_dim, m.num_heads, m.mlp_dim, m.dropout_rate)
                                for _ in range(m.num_layers))
    self.ln_f = nn.LayerNorm(m.emb_dim)
    self.head = nn.Linear(m.emb_dim, vocab, bias=m.head_bias)

  def forward(self, ids):                                        # (B, T)
    x = self.tok(ids) + self.pos[:ids.shape[1]]
    for block in self.blocks:
      x = block(x, self.causal)
    return self.head(self.ln_f(x))                               # (B, T, V)


def train(family, ids, vocab, seed, mlm_probability):
  m, t = family.model, family.train
  torch.manual_seed(t.seed + seed)
  model = Model(vocab, m, causal=m.causal)
  opt = torch.optim.Adam(model.parameters(), lr=t.learning_rate, betas=(t.adam_b1, t.adam_b2))
  sched = torch.optim.lr_scheduler.LambdaLR(
      opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, t.steps) / t.steps)))
  make = char_lm.batch_maker('clm' if m.causal else 'mlm', ids, m.max_len, t.batch_size,
                             vocab, np.random.default_rng(seed), mlm_probability)
  model.train()
  start = time.perf_counter()
  for _ in range(t.steps):
    b = make()
    logits = model(torch.from_numpy(b['inputs']).long())
    nll = nn.functional.cross_entropy(logits.flatten(0, 1),
                                      torch.from_numpy(b['targets']).long().flatten(),
                                      reduction='none')
    w = torch.from_numpy(b['loss_weights']).flatten()
    loss = (nll * w).sum() / w.sum().clamp(min=1.0)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
    opt.step()
    sched.step()
  return model.eval(), time.perf_counter() - start, float(loss)


@torch.no_grad()
def evaluate_gpt(model, ids, length):
  b = char_lm.gpt_windows(ids, length)
  logits = model(torch.from_numpy(b['inputs']).long())
  nll = nn.functional.cross_entropy(logits.flatten(0, 1),
                                    torch.from_numpy(b['targets']).long().flatten())
  return float(torch.exp(nll))


@torch.no_grad()
def evaluate_bert(model, ids, length, vocab, seed, probability, draws):
  def logits_of(inputs):
    return model(torch.from_numpy(inputs).long()).numpy()
  return char_lm.mlm_draws(logits_of, ids, length, vocab, seed, probability, draws)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--corpus', required=True, help='path of tinyshakespeare.txt')
  parser.add_argument('--seed', type=int, default=0, help='added to the config seeds')
  parser.add_argument('--threads', type=int, default=0, help='torch threads; 0 = torch default')
  args = parser.parse_args()
  if not os.path.isfile(args.corpus):
    parser.error(f'--corpus={args.corpus!r} is not a file')
  if args.threads:
    torch.set_num_threads(args.threads)
  config = shakespeare_char.get_config()
  config.corpus = args.corpus
  vocab, splits = char_lm.load_splits(config)
  gpt, gpt_s, gpt_loss = train(config.gpt, splits['train'], len(vocab), args.seed, 0.0)
  ppl = evaluate_gpt(gpt, splits['valid'], config.gpt.model.max_len)
  bert, bert_s, bert_loss = train(config.bert, splits['train'], len(vocab), args.seed,
                                  config.mlm_probability)
  acc = evaluate_bert(bert, splits['heldout'], config.bert.model.max_len, len(vocab),
                      config.eval_seed, config.mlm_probability, config.eval_draws)
  print(f'torch GPT  {config.gpt.train.steps} steps in {gpt_s:.1f}s: validation perplexity '
        f'{ppl:.2f}', file=sys.stderr)
  print(f"torch BERT {config.bert.train.steps} steps in {bert_s:.1f}s: held-out top-1 "
        f"{acc['top1']:.3f} top-5 {acc['top5']:.3f}", file=sys.stderr)
  draws = {f'heldout_{k}': acc[k] for k in char_lm.DRAW_KEYS}
  print(char_lm.draws_line(draws), file=sys.stderr)
  print(json.dumps({'framework': 'torch', 'threads': torch.get_num_threads(), 'seed': args.seed,
                    'gpt': {'train_seconds': round(gpt_s, 2), 'final_train_loss': gpt_loss,
                            'valid_perplexity': ppl},
                    'bert': {'train_seconds': round(bert_s, 2), 'final_train_loss': bert_loss,
                             'heldout_top1': acc['top1'], 'heldout_top5': acc['top5'],
                             **draws}}))


if __name__ == '__main__':
  main()
