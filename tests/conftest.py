import os
import sys

# pretrain_jax and configs come from the installed package (pip install -e '.[test]'); the
# tests' own helpers (modeling.py) from here.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

