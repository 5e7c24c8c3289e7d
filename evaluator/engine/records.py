"""The records of a partition's join state: one user's part, and an open request
as an impression starts it and as a changelog segment stores it. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from evaluator.core.events import Impression
from evaluator.core.finalise import OpenRequest, PendingInteraction

encode = msgspec.msgpack.Encoder().encode
decode = msgspec.msgpack.Decoder().decode

SHARED_LIMIT = 1 << 19
"""Distinct strings :class:`SharedStrings` remembers before it starts afresh."""


class SharedStrings:
    """One object per distinct item id or attribute value among the open requests.

    Decoding gives every impression its own strings: 20 item ids of ~55 bytes each,
    and as many attribute values, most of them repeated across requests (a catalog's
    items, a handful of categories), about two thirds of an open request's memory.
    Equal strings are replaced by the one seen first. Bounded: at
    :data:`SHARED_LIMIT` entries it forgets them all (those already shared stay so)."""

    def __init__(self, limit: int = SHARED_LIMIT) -> None:
        self.limit = limit
        self._known: dict[str, str] = {}

    def __call__(self, values: Iterable[str]) -> tuple[str, ...]:
        """The values, shared, as a tuple (exactly sized; empty: the one empty tuple)."""
        known = self._known
        if len(known) >= self.limit:
            known.clear()
        return tuple(map(known.setdefault, values, values))

    def __len__(self) -> int:
        return len(self._known)


EMPTY: tuple[str, ...] = ()

share = SharedStrings()
"""The process's strings shared among open requests (the engine runs on one thread)."""


@dataclass(slots=True)
class UserState:
    """One user's part of the join state."""

    open: dict[str, int] = field(default_factory=dict)
    """Open request id -> impression time."""
    loose: dict[str, PendingInteraction] = field(default_factory=dict)
    """Request-less interactions by event id."""
    history: list[tuple[int, str]] = field(default_factory=list)
    """The earliest relevant interactions, sorted (time, event id), at most the cap."""
    active_ms: int = 0
    """The first relevant interaction of the user's latest active day: the history
    expires a TTL after it."""

    def empty(self) -> bool:
        return not (self.open or self.loose or self.history)


def request_row(r: OpenRequest) -> tuple[Any, ...]:
    """An open request as one row of a segment (its id first)."""
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
    )


def request_of(rid: str, fields: list[Any]) -> OpenRequest:
    """An open request from a segment row (without its id) or a legacy ``r:`` value."""
    uid, variant, ts, items, attrs, shadow_variant, shadow, context, rnd = fields
    return OpenRequest(
        rid,
        uid,
        variant,
        ts,
        share(items),
        attributes=share(attrs),
        shadow_variant=shadow_variant,
        shadow=share(shadow),
        context=context,
        randomization=(rnd[0], rnd[1]) if rnd else None,
    )


def open_request(
    event: Impression, timestamp_ms: int, attribute: str, shadow_of: str = ""
) -> OpenRequest:
    """The open request an impression starts, with its item ids and attribute values
    shared (:data:`share`). Of its shadow rankings it keeps the one of ``shadow_of``
    (the control the RBO series is labelled with; none if it has none), or, with no
    control configured, the first by variant name."""
    shadow_variant, shadow = "", EMPTY
    if event.shadow:
        shadow_variant = shadow_of or min(event.shadow)
        ranking = event.shadow.get(shadow_variant)
        if ranking is None:
            shadow_variant = ""
        else:
            shadow = share(ranking)
    attributes = event.item_attributes
    return OpenRequest(
        event.request_id,
        event.user_id,
        event.variant,
        timestamp_ms,
        share(event.items),
        (),
        share(attributes.get(attribute, ())) if attributes else (),
        shadow_variant,
        shadow,
        event.context or "",
        event.randomization.key() if event.randomization else None,
    )
