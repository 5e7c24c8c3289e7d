"""Cold-start cohorts.

A request belongs to ``cold_start`` when its user had fewer than
``min_relevant_history`` relevant interactions (grade > 0) strictly before the
impression's time, and to ``established`` otherwise. Only the first
``min_relevant_history`` relevant timestamps of a user matter for that
decision, so a streaming store can keep a bounded history per user and still
agree exactly with a batch replay.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

COHORTS = ("all", "cold_start", "established")
COLD_START = 1
ESTABLISHED = 2

I64 = npt.NDArray[np.int64]


def earlier_counts(
    history_user: I64, history_ms: I64, request_user: I64, request_ms: I64, cap: int
) -> I64:
    """For each request, how many of its user's history events are strictly earlier, capped.

    Users are integer codes. Vectorised: one lexicographic sort and two binary searches.
    """
    if history_user.size == 0 or request_user.size == 0:
        return np.zeros(request_user.shape, dtype=np.int64)
    order = np.lexsort((history_ms, history_user))
    users = history_user[order]
    times = history_ms[order]
    start = np.searchsorted(users, request_user, side="left")
    stop = np.searchsorted(users, request_user, side="right")
    t_min = int(min(times.min(), request_ms.min()))
    span = int(max(times.max(), request_ms.max())) - t_min + 1
    n_users = int(max(users.max(), request_user.max())) + 1
    if n_users * span < 2**62:
        key = users * span + (times - t_min)
        probe = request_user * span + (request_ms - t_min)
        below = np.searchsorted(key, probe, side="left")
    else:  # pragma: no cover - astronomically wide keys; fall back to a loop over requests
        below = np.array(
            [
                s + np.searchsorted(times[s:e], t)
                for s, e, t in zip(start, stop, request_ms, strict=True)
            ]
        )
    counts = np.clip(below - start, 0, None)
    capped: I64 = np.minimum(np.minimum(counts, stop - start), cap).astype(np.int64)
    return capped


def cohort_codes(earlier: I64, min_relevant_history: int) -> I64:
    """``COLD_START`` or ``ESTABLISHED`` for each request."""
    return np.where(earlier < min_relevant_history, COLD_START, ESTABLISHED).astype(np.int64)
