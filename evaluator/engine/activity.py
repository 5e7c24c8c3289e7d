"""Each user's relevant interactions by day, and the CUPED covariate of each exposure.

A user's activity is flat ``(day, count)`` pairs (:func:`evaluator.core.ab.cuped.count_day`)
on their :class:`~evaluator.engine.records.UserState`, written as changelog field
``u:<user>`` once per checkpoint for the users whose activity changed, and dropped
once the watermark is ``lookback`` days past it.

A first exposure's covariate (:func:`evaluator.core.ab.cuped.pre_exposure`: the
activity on the whole days before the exposure's day) is read once the watermark has
reached that day: every interaction before it has then come (a later one is late), so
the covariate does not depend on how far one topic's consumption ran ahead of the
other's, and replay, which reads whole files, finds the same. Until then the exposure
waits in the partition's pending list (changelog field ``p:``), usually for the few
seconds of out-of-orderness after midnight, or while the interactions lag behind.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

from evaluator.core.ab.cuped import DAY_MS, count_day, pre_exposure
from evaluator.core.experiments import SEP, Experiment
from evaluator.engine.records import UserState, encode

Covariates = dict[str, list[tuple[str, int]]]
"""Per ``experiment US variant``: (user, covariate) of the users exposed who have one."""


class PartitionState(Protocol):
    """What of a partition's state (:class:`evaluator.engine.state.PartitionState`,
    which calls this module) the activity reads and writes."""

    users: dict[str, UserState]
    counted: set[str]
    pending: list[tuple[int, str, str]]
    pending_changed: bool
    lookback_days: int

    def expose(self, experiment: str, users: list[str]) -> list[bool]: ...


class StepCounts(Protocol):
    """What of a step's counters (:class:`evaluator.engine.partition.StepCounts`) an
    exposure adds to."""

    exposures: Counter[str]
    covariates: Covariates


def count(
    users: dict[str, UserState], changed: set[str], relevant: Sequence[tuple[str, str, int]]
) -> None:
    """Count a batch's relevant interactions (user, event, time) on their users' days."""
    for user_id, _, timestamp_ms in relevant:
        user = users.get(user_id)
        if user is None:
            user = users[user_id] = UserState()
        if not user.days:
            user.days = []
        count_day(user.days, timestamp_ms // DAY_MS)
        changed.add(user_id)


def write(state: PartitionState, out: dict[str, bytes | None]) -> None:
    """The changed users' activity (deleted when none is left) and the pending list,
    as changelog fields."""
    users = state.users
    for user_id in state.counted:
        user = users.get(user_id)
        out["u:" + user_id] = encode(user.days) if user is not None and user.days else None
    state.counted.clear()
    if state.pending_changed:
        out["p:"] = encode(state.pending) if state.pending else None
        state.pending_changed = False


def expire(state: PartitionState, before_day: int) -> None:
    """Drop every day of activity before ``before_day``, and the users left with
    nothing."""
    users, emptied = state.users, []
    for user_id, user in users.items():
        days = user.days
        if isinstance(days, list) and days and days[0] < before_day:
            cut = 0
            while cut < len(days) and days[cut] < before_day:
                cut += 2
            del days[:cut]
            state.counted.add(user_id)
            if user.empty():
                emptied.append(user_id)
    for user_id in emptied:
        del users[user_id]


def expose(
    state: PartitionState,
    experiment: Experiment,
    events: list[Any],
    times: list[int],
    counts: StepCounts,
    *,
    watermark_ms: int | None,
) -> None:
    """Count the users first exposed to an experiment by new requests (impressions and
    their times), per variant; with CUPED on, their covariate is read now if the
    watermark has reached the exposure's day, else once it does (:func:`release`)."""
    includes = experiment.includes
    both = [(e, t) for e, t in zip(events, times, strict=True) if includes(e.variant, t)]
    if not both:
        return
    first = state.expose(experiment.name, [e.user_id for e, _ in both])
    exposures, lookback = counts.exposures, state.lookback_days
    for (event, t), new in zip(both, first, strict=True):
        if new:
            key = experiment.name + SEP + event.variant
            exposures[key] += 1
            if not lookback:
                continue
            day_ms = t - t % DAY_MS
            if watermark_ms is not None and day_ms <= watermark_ms:
                _read(state, key, event.user_id, day_ms, counts.covariates)
            else:
                state.pending.append((day_ms, key, event.user_id))
                state.pending_changed = True


def release(state: PartitionState, watermark_ms: int, covariates: Covariates) -> None:
    """Read the covariates of the pending exposures whose day the watermark reached."""
    if not state.pending or min(p[0] for p in state.pending) > watermark_ms:
        return
    due = [p for p in state.pending if p[0] <= watermark_ms]
    state.pending = [p for p in state.pending if p[0] > watermark_ms]
    state.pending_changed = True
    for day_ms, key, user_id in due:
        _read(state, key, user_id, day_ms, covariates)


def _read(state: PartitionState, key: str, user_id: str, day_ms: int, out: Covariates) -> None:
    user = state.users.get(user_id)
    if user is not None and (x := pre_exposure(user.days, day_ms, state.lookback_days)):
        out.setdefault(key, []).append((user_id, x))
