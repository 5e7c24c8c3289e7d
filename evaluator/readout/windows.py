"""Reading sliding windows back: sum the buckets a window covers, per variant."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from evaluator.core.windows import AggregateLayout
from evaluator.engine.ports import FloatArray

OTHER = "other"


def window_totals(
    blocks: Mapping[tuple[int, str], FloatArray],
    window_ms: int,
    frontier_ms: int,
    layout: AggregateLayout,
) -> dict[str, FloatArray]:
    """Per variant, the sum of the buckets that overlap ``(frontier - window, frontier]``.

    Buckets are aligned, so the sum spans at least the window and at most one bucket
    width (``window / buckets_per_window``) more: the oldest bucket is counted whole.
    """
    lo = frontier_ms - window_ms
    out: dict[str, FloatArray] = {}
    for (start, variant), block in blocks.items():
        if lo < start + layout.bucket_width(window_ms) and start <= frontier_ms:
            if variant in out:
                out[variant] = out[variant] + block
            else:
                out[variant] = block.copy()
    return out


def cap_variants(
    totals: dict[str, FloatArray], allow: list[str], max_variants: int
) -> dict[str, FloatArray]:
    """Keep allowed variants (or the busiest ``max_variants``); fold the rest into ``other``."""
    if allow:
        keep = [v for v in totals if v in allow]
    else:
        ranked = sorted(totals, key=lambda v: (-float(totals[v][..., 0].sum()), v))
        keep = ranked[:max_variants]
    out = {v: totals[v] for v in keep}
    rest = [totals[v] for v in totals if v not in out]
    if rest:  # a kept variant really named "other" takes the rest in with it
        out[OTHER] = np.sum(rest, axis=0) + out.get(OTHER, 0.0)
    return out
