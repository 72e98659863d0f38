import os
import sys
import pytest

# pretrain_jax and configs come from the installed package (pip install -e '.[test]'); the
# tests' own helpers (modeling.py) from here.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def module_cache(tmp_path_factory):
  """A fresh PRETRAIN_JAX_CACHE (corpora, tokenizers, compilation cache) shared by one test
  module and restored after it; yields its path."""
  with pytest.MonkeyPatch.context() as patch:
    path = str(tmp_path_factory.mktemp('cache'))
    patch.setenv('PRETRAIN_JAX_CACHE', path)
    yield path
