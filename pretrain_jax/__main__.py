"""`pretrain-jax COMMAND [flags]` (or `python -m pretrain_jax COMMAND`): runs scripts/COMMAND.py.

The commands are the checkout's scripts/ (train, train_tiny, evaluate, generate, fill_mask,
describe, benchmark, ...); the package is installed from the clone with `pip install -e .`.
"""
import os
import runpy
import sys

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'scripts')


def commands() -> list:
  if not os.path.isdir(SCRIPTS):
    return []
  return sorted(f[:-3] for f in os.listdir(SCRIPTS) if f.endswith('.py'))


def main() -> None:
  names = commands()
  if not names:
    print(f'error: no scripts/ beside the installed package ({SCRIPTS}); install it from a clone '
          'with `pip install -e <clone>`', file=sys.stderr)
    sys.exit(2)
  if len(sys.argv) < 2 or sys.argv[1] in ('-h', '--help'):
    print(f'usage: pretrain-jax COMMAND [flags]   (COMMAND --help for its flags)\n'
          f'commands: {", ".join(names)}', file=sys.stderr)
    sys.exit(0 if len(sys.argv) >= 2 else 2)
  command = sys.argv[1].replace('-', '_')
  if command not in names:
    print(f'error: unknown command {sys.argv[1]!r}; expected one of {", ".join(names)}',
          file=sys.stderr)
    sys.exit(2)
  sys.argv = [os.path.join(SCRIPTS, f'{command}.py')] + sys.argv[2:]
  runpy.run_path(sys.argv[0], run_name='__main__')


if __name__ == '__main__':
  main()
