"""The tiny GPT as a prefix LM (the T5 paper's prefix LM objective, UniLM): each document's
first tokens, split at random, see each other bidirectionally and the rest is predicted left
to right. The GPT stack and its training are tiny_gpt's; the mask is the only difference
(docs/chapter41.md, "Four masks")."""
from configs import tiny_gpt


def get_config():
  c = tiny_gpt.get_config()
  c.model.prefix_lm = True          # the mask: each document's prefix sees itself both ways
  c.data.objective = 'prefix_lm'    # the loss: on the tokens after the prefix
  return c
