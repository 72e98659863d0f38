"""pretrain-jax train_tokenizer and pretrain-jax benchmark_data run and print their JSON lines."""
import importlib
import json
import os

import pytest

from pretrain_jax.data import corpus


def load(name):
  return importlib.import_module(f'pretrain_jax.commands.{name}')


@pytest.fixture()
def corpus_file(tmp_path, monkeypatch):
  monkeypatch.setenv('PRETRAIN_JAX_CACHE', str(tmp_path / 'cache'))
  docs = corpus.embedded_documents()[:60]
  path = tmp_path / 'docs.jsonl'
  path.write_text(''.join(json.dumps({'text': d}) + '\n' for d in docs))
  return str(path)


def test_train_tokenizer_script(tmp_path, corpus_file, capsys):
  out = str(tmp_path / 'char.model')
  load('train_tokenizer').main(['pretrain-jax train_tokenizer', '--output', out, '--files',
                                corpus_file, '--type', 'char', '--vocab_size', '300'])
  out_text, err = capsys.readouterr()
  line = json.loads(out_text.strip().splitlines()[-1])
  assert line['path'] == out and line['vocab_size'] == 384 and line['type'] == 'char'
  assert f'{out}: a char tokenizer of 384 pieces ({line["learned_pieces"]} learned)' in err
  assert 50 < line['learned_pieces'] < 200 and os.path.isfile(out)


def test_benchmark_script(tmp_path, corpus_file, capsys):
  load('benchmark_data').main(['pretrain-jax benchmark_data', '--files', corpus_file,
                               '--seq_len', '32', '--batch_size', '2',
                               '--batches', '3', '--warmup', '1',
                               '--objectives', 'clm,nsp,span_corruption'])
  lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
  assert [r['objective'] for r in lines] == ['clm', 'nsp', 'span_corruption']
  assert all(r['tokens_per_s'] > 0 and 0 < r['real_fraction'] <= 1 for r in lines)
