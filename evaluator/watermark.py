"""Event-time watermark over partitions.

watermark = min over active partitions of (largest event time seen) - max_out_of_orderness.
A partition that has not delivered anything for ``idle_timeout`` (wall clock)
stops holding the watermark back; when every partition is idle the largest
event time seen anywhere is used, so a quiet stream still finalises what it can.
"""

from __future__ import annotations

from collections.abc import Mapping

from evaluator.stores.base import PartitionProgress


def global_watermark(
    progress: Mapping[str, PartitionProgress],
    now_ms: int,
    max_out_of_orderness_ms: int,
    idle_timeout_ms: int,
) -> int | None:
    """The watermark, or None before any partition has reported."""
    if not progress:
        return None
    active = [p.max_event_ms for p in progress.values() if now_ms - p.updated_ms < idle_timeout_ms]
    seen = [p.max_event_ms for p in progress.values()]
    base = min(active) if active else max(seen)
    return base - max_out_of_orderness_ms
