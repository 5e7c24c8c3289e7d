"""Each user's recent relevant interactions by day: the CUPED covariate's source.

A user's activity is flat ``(day, count)`` pairs (:func:`evaluator.core.ab.cuped.count_day`)
over the last ``lookback`` days, kept on their :class:`~evaluator.engine.records.UserState`
and written as changelog field ``u:<user>`` once per checkpoint for the users whose
activity changed. :func:`expose` reads it at a user's exposure
(:func:`evaluator.core.ab.cuped.pre_exposure`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from evaluator.core.ab.cuped import DAY_MS, count_day, pre_exposure
from evaluator.core.experiments import SEP, Experiment
from evaluator.engine.records import UserState, encode

if TYPE_CHECKING:
    from evaluator.engine.partition import StepCounts
    from evaluator.engine.state import PartitionState


def count(
    users: dict[str, UserState],
    changed: set[str],
    relevant: Sequence[tuple[str, str, int]],
    lookback_days: int,
) -> None:
    """Count a batch's relevant interactions (user, event, time) on their users' days."""
    for user_id, _, timestamp_ms in relevant:
        user = users.get(user_id)
        if user is None:
            user = users[user_id] = UserState()
        count_day(user.days, timestamp_ms // DAY_MS, lookback_days)
        changed.add(user_id)


def write(users: dict[str, UserState], changed: set[str], out: dict[str, bytes | None]) -> None:
    """The changed users' activity as changelog fields (deleted when none is left)."""
    for user_id in changed:
        user = users.get(user_id)
        out["u:" + user_id] = encode(user.days) if user is not None and user.days else None
    changed.clear()


def expire(users: dict[str, UserState], changed: set[str], before_day: int) -> list[str]:
    """Drop every day before ``before_day``; returns the users left with nothing."""
    emptied = []
    for user_id, user in users.items():
        days = user.days
        if days and days[0] < before_day:
            cut = 0
            while cut < len(days) and days[cut] < before_day:
                cut += 2
            del days[:cut]
            changed.add(user_id)
            if user.empty():
                emptied.append(user_id)
    return emptied


def expose(
    state: PartitionState,
    experiment: Experiment,
    events: list[Any],
    times: list[int],
    counts: StepCounts,
) -> None:
    """Count the users first exposed to an experiment by new requests (impressions and
    their times), per variant, with the CUPED covariate of those who have one (their
    activity on the days before the exposure's day)."""
    includes = experiment.includes
    both = [(e, t) for e, t in zip(events, times, strict=True) if includes(e.variant, t)]
    if not both:
        return
    first = state.expose(experiment.name, [e.user_id for e, _ in both])
    exposures, covariates = counts.exposures, counts.covariates
    lookback, users = state.lookback_days, state.users
    for (event, t), new in zip(both, first, strict=True):
        if new:
            key = experiment.name + SEP + event.variant
            exposures[key] += 1
            user = users.get(event.user_id) if lookback else None
            if user is not None and (x := pre_exposure(user.days, t, lookback)):
                covariates.setdefault(key, []).append((event.user_id, x))
