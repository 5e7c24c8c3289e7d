"""Allow ``python -m evaluator``."""

from evaluator.cli import main

raise SystemExit(main())
