"""Process tuning at start-up: the C allocator returns the columns' memory."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
import numpy as np
from evaluator.engine.runtime import tune_malloc

def rss():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) * 1024

if sys.argv[1] == "tuned":
    assert tune_malloc()
big = np.ones(4 << 20, dtype=np.uint8)  # freed: glibc alone raises its mmap threshold past 1 MiB
del big
before = rss()
blocks = [np.ones(1 << 20, dtype=np.uint8) for _ in range(200)]
del blocks[:-1]  # the last one stays: nothing above the freed ones to trim
print(rss() - before)
"""


def grown(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], check=False, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_columns_go_back_to_the_system() -> None:
    """200 MiB of 1 MiB arrays allocated and freed but the last: with the threshold
    fixed they were mappings of their own, and only the last stays resident; left to
    glibc they came from the heap, and the freed ones stay resident below it."""
    assert grown("tuned") < 20 << 20
    assert grown("default") > 100 << 20  # what the tuning is for
