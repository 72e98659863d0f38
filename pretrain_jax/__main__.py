"""`pretrain-jax COMMAND [flags]` and `python -m pretrain_jax COMMAND [flags]`."""
from pretrain_jax import commands


def main() -> None:
  commands.main()


if __name__ == '__main__':
  main()
