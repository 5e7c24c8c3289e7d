"""Allow ``python -m evaluator``."""

from evaluator.app.cli import main

if __name__ == "__main__":  # not when a spawned child process imports this module
    raise SystemExit(main())
