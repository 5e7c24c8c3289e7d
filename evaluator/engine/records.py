"""The records of a partition's join state: one user's part, and an open request
as an impression starts it (a changelog segment's row). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from evaluator.core.ab.interleaving import draft
from evaluator.core.due import OpenRequest, PendingInteraction
from evaluator.core.events import Impression

encode = msgspec.msgpack.Encoder().encode
decode = msgspec.msgpack.Decoder().decode

EMPTY: tuple[str, ...] = ()


@dataclass(slots=True)
class UserState:
    """One user's part of the join state."""

    loose: dict[str, PendingInteraction] = field(default_factory=dict)
    """Request-less interactions by event id (each also in
    :attr:`~evaluator.engine.state.PartitionState.loose_user`)."""
    history: list[tuple[int, str]] = field(default_factory=list)
    """The earliest relevant interactions, sorted (time, event id), at most the cap."""
    active_ms: int = 0
    """The first relevant interaction of the user's latest active day: the history
    expires a TTL after it."""
    days: list[int] | tuple[()] = ()
    """Relevant interactions per day, flat (day, count) pairs over the CUPED lookback
    (:mod:`evaluator.engine.activity`); a list once the user has any (no list per
    user while CUPED is off)."""

    def empty(self) -> bool:
        return not (self.loose or self.history or self.days)


def impression_row(
    event: Impression, timestamp_ms: int, attribute: str, shadow_of: str = ""
) -> tuple[Any, ...]:
    """The open request an impression starts, as a changelog row (see
    :data:`evaluator.engine.columns.Row`). Of its shadow rankings it keeps the one of
    ``shadow_of`` (the control the RBO series is labelled with; none if it has none),
    or, with no control configured, the first by variant name."""
    shadow_variant = ""
    shadow: Sequence[str] = EMPTY
    if event.shadow:
        shadow_variant = shadow_of or min(event.shadow)
        ranking = event.shadow.get(shadow_variant)
        if ranking is None:
            shadow_variant = ""
        else:
            shadow = ranking
    attributes = event.item_attributes
    rnd = event.randomization.key() if event.randomization else None
    return (
        event.request_id,
        event.user_id,
        event.variant,
        timestamp_ms,
        event.items,
        (attributes.get(attribute, EMPTY) if attributes else EMPTY),
        shadow_variant,
        shadow,
        event.context or "",
        list(rnd) if rnd else None,
        draft(event.teams, event.interleaving) if event.teams and event.interleaving else "",
    )


def request_row(r: OpenRequest) -> tuple[Any, ...]:
    """An open request as a changelog row (its id first; see :func:`impression_row`)."""
    return (
        r.request_id,
        r.user_id,
        r.variant,
        r.timestamp_ms,
        r.items,
        r.attributes,
        r.shadow_variant,
        r.shadow,
        r.context,
        list(r.randomization) if r.randomization else None,
        r.draft,
    )
