"""What a fine-tune is scored by at each evaluation, beside its loss: callables params -> metrics
(run/loop.py's `evaluators`).

  T5            its targets decoded (greedy, or a beam: inference/beam.py): exact match, and
                for labels the class metrics of the label decoded, for free text (a
                summary) ROUGE-1/2/L (rouge_scores)
  GPT, format   the labels ranked by their log-likelihood after the prompt (inference/
  'generation'  scoring.py): the class metrics of the most likely label
"""
import jax
import jax.numpy as jnp
import numpy as np

from pretrain_jax.data import classification, prompts
from pretrain_jax.inference import beam, sampling, scoring
from pretrain_jax.models import ModelConfig
from pretrain_jax.training import task as task_lib

ROUGE_KEYS = ('rouge1', 'rouge2', 'rougeL')


def rouge_scores(decoded: list, targets: list) -> dict:
  """Mean ROUGE-1, ROUGE-2 and ROUGE-L F-measures of `decoded` against `targets`, by the
  rouge-score package (Google's reimplementation of ROUGE-1.5.5, as t5x / seqio score
  summaries) with its Porter stemmer; each in [0, 1]."""
  from rouge_score import rouge_scorer  # noqa: PLC0415 (rouge-score: nltk is slow to import)
  scorer = rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)
  scores = [scorer.score(target, prediction)
            for prediction, target in zip(decoded, targets, strict=True)]
  return {k: float(np.mean([s[k].fmeasure for s in scores])) if scores else 0.0
          for k in ROUGE_KEYS}


def exact_match_scores(decoded: list, targets: list, truth, label_forms: tuple) -> dict:
  """Decoded strings against target strings (whitespace-stripped): exact_match, and for a
  labelled task class_accuracy / class_mcc / class_f1 with `truth` the (N,) class ids and
  `label_forms` the labels as decoding gives them back (classification.label_forms); a decoded
  string that is no label counts as a wrong class ((truth + 1) mod C)."""
  hits = [d.strip() == t.strip() for d, t in zip(decoded, targets, strict=True)]
  out = {'exact_match': float(np.mean(hits))}
  if label_forms:
    index = {form: c for c, form in enumerate(label_forms)}
    truth = np.asarray(truth)
    predicted = np.array([index.get(d.strip(), -1) for d in decoded])
    predicted = np.where(predicted < 0, (truth + 1) % len(label_forms), predicted)
    confusion = np.zeros((len(label_forms), len(label_forms)), np.float32)
    np.add.at(confusion, (truth, predicted), 1.0)
    out.update(class_accuracy=float(np.mean(truth == predicted)),
               **{f'class_{k}': float(v) for k, v in
                  task_lib.confusion_metrics(jnp.asarray(confusion)).items()})
  return out


def exact_match_evaluator(cfg: ModelConfig, encoded, tokenizer, labels: tuple,
                          batch_size: int, target_len: int, beam_size: int = 1):
  """params -> the scores of T5's decoded targets (greedy, or a beam of `beam_size`):
  exact_match, and {class_accuracy, class_mcc, class_f1} for labels, else rouge1 / rouge2 /
  rougeL (rouge_scores)."""
  rows = encoded.rows
  forms = classification.label_forms(tokenizer, labels) if labels else ()
  targets = [tokenizer.decode([int(t) for t in row if t not in (0, tokenizer.eos_id)])
             for row in rows['decoder_target_tokens']]

  def evaluate(params):
    decoded = []
    for start in range(0, len(targets), batch_size):
      stop = min(start + batch_size, len(targets))
      pad = batch_size - (stop - start)
      inputs = np.pad(rows['encoder_input_tokens'][start:stop], [(0, pad), (0, 0)])
      segments = np.pad(rows['encoder_segment_ids'][start:stop], [(0, pad), (0, 0)])
      segments[stop - start:, 0] = 1   # a padding row still has one token (no empty encoder row)
      kw = dict(max_new_tokens=target_len, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)
      if beam_size > 1:
        out, _ = beam.t5_beam_search(params, cfg, jnp.asarray(inputs), jnp.asarray(segments),
                                     beam_size=beam_size, **kw)
      else:
        out = sampling.t5_generate(params, cfg, jnp.asarray(inputs), jnp.asarray(segments),
                                   jax.random.key(0), **kw)
      for row in np.asarray(out)[:stop - start]:
        ids = [int(t) for t in row]
        ids = ids[:ids.index(tokenizer.eos_id)] if tokenizer.eos_id in ids else ids
        decoded.append(tokenizer.decode([t for t in ids if t != tokenizer.pad_id]))
    out = exact_match_scores(decoded, targets, rows.get('class_ids'), forms)
    return out if labels else dict(out, **rouge_scores(decoded, targets))
  return evaluate


def choice_evaluator(cfg: ModelConfig, task, split: str, tokenizer, question: str,
                     seq_len: int, max_examples: int = 0, batch_size: int = 32):
  """params -> {class_accuracy, class_mcc, class_f1, class_accuracy_norm}: each example of
  `split` classified by the most likely of the task's labels after its prompt (the
  generation format's evaluation; the prompt cut as its training rows are, to seq_len)."""
  examples = task.splits[split][:max_examples or None]
  contexts = [prompts.context(ex, question) for ex in examples]
  truth = np.array([task.labels.index(ex['label']) for ex in examples])

  def evaluate(params):
    out = scoring.score_labels(params, cfg, tokenizer, contexts, task.labels, truth,
                               length=seq_len + 1, batch_size=batch_size)
    return {'class_accuracy': out['acc'], 'class_mcc': out['mcc'], 'class_f1': out['f1'],
            'class_accuracy_norm': out['acc_norm']}
  return evaluate
