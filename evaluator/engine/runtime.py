"""Process-wide tuning the commands apply at start-up (the core never does this)."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Iterator
from contextlib import contextmanager

GC_THRESHOLDS = (50_000, 50, 100)
"""CPython's cyclic collector runs a young-generation pass every 700 net allocations by
default, and older passes every 10 of those. The engine allocates a few objects per
event and keeps ~10^5-10^6 long-lived containers (open requests, their item lists,
markers), none of them in reference cycles (reference counting frees them), so those
passes find nothing and re-traverse the state over and over: measured, about 40% of
the live path's CPU. Collections still run, 70x less often; garbage cycles (rare
here) live a little longer."""


def tune_gc() -> None:
    """Raise the cyclic garbage collector's thresholds (see :data:`GC_THRESHOLDS`)."""
    gc.set_threshold(*GC_THRESHOLDS)


MMAP_THRESHOLD = 128 * 1024
"""Allocations of this size and more get their own mapping, returned to the system
when freed. glibc raises its threshold (up to 32 MiB) each time such a block is
freed, after which the open-request columns (chunks of up to a few MB, rewritten
as they merge and as their requests finalise) come from the heap and leave holes
in it. Measured (bench/bench_open_memory.py, RSS per open request, medians of 4):
~300 bytes with ``MALLOC_MMAP_THRESHOLD_=131072`` in the environment from the start
(what the container image sets), ~360 with only this call at start-up, ~375-430
with neither."""

M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter number (malloc.h)."""


def tune_malloc() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` (the dynamic adjustment
    off); False where the C library is not glibc (nothing changed)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


@contextmanager
def long_lived() -> Iterator[None]:
    """A block that creates many long-lived objects (a partition's load): no cyclic
    collection inside it, and what exists at its end is frozen
    (``gc.freeze``: never traversed again). Loading a partition creates millions of
    objects, none in a cycle (reference counting frees them); left to the collector
    they are traversed as they pile up, once more when it is re-enabled and again
    in the older generations' passes: a 100,000-request load took 2-4x as long. The
    cost of freezing: a reference cycle through an object that existed at the end
    of the block is never collected (the engine's state has none)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
