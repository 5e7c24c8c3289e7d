"""Soak: the SIGKILL-with-a-backlog failover test, run N times in a row.

    make services && eval "$(python3 scripts/services.py env)"
    .venv/bin/python bench/soak_failover.py [--runs 10] [-k defaults]

Each run is `tests/test_failover.py::test_sigkill_with_a_backlog_and_restart_is_exact`
(two instances, 3 partitions keyed by user, 2,000 events/s, one instance SIGKILLed
3 s into the stream and restarted at once; exact against replay). Prints each
run's outcome and time, then the count of exact runs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/test_failover.py::test_sigkill_with_a_backlog_and_restart_is_exact"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("-k", default="defaults", help="defaults or short-idle")
    args = parser.parse_args()
    exact = 0
    for run in range(1, args.runs + 1):
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TEST, "-k", args.k],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        ok = result.returncode == 0
        exact += ok
        lines = result.stdout.strip().splitlines()
        print(
            f"run {run}: {'exact' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s"
            f" ({lines[-1] if lines else ''})",
            flush=True,
        )
    print(f"{exact} of {args.runs} runs exact ({args.k} timeouts)")


if __name__ == "__main__":
    main()
