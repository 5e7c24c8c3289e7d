"""The event contract: impression and interaction models, the reasons an event is
invalid, and the decoded batches (decoding itself: :mod:`evaluator.core.decode`)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Literal

import msgspec
import numpy as np
import numpy.typing as npt

from evaluator.core.tokens import Spans

MAX_TIMESTAMP_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z: event times lie in [1970, 9999] (as epoch ms they fit int64
with a wide margin, so no arithmetic on them can overflow)."""

Timestamp = (
    Annotated[int, msgspec.Meta(ge=0, le=MAX_TIMESTAMP_MS)]
    | Annotated[datetime, msgspec.Meta(tz=True)]
)
"""Epoch milliseconds, or an RFC 3339 string with a timezone, from 1970 to 9999."""

NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]


class Randomization(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """How the serving system randomised this list, for propensity estimation.

    ``swap``: the items at position 1 and position ``k`` were exchanged.
    ``topn``: the top ``n`` items were shuffled uniformly at random.
    """

    type: Literal["swap", "topn"]
    k: int = 0
    n: int = 0

    def key(self) -> tuple[str, int]:
        """``("swap", k)`` or ``("topn", n)``."""
        return (self.type, self.k if self.type == "swap" else self.n)


# Events never take part in a reference cycle (they hold strings, numbers, lists and
# dicts of strings, a Randomization), so the cyclic collector does not track them
# (gc=False): cheaper to decode, and nothing for a collection to traverse.
class Impression(msgspec.Struct, frozen=True, gc=False):
    """A ranked list shown to a user; ``items[0]`` is position 1."""

    event_id: NonEmptyStr
    request_id: NonEmptyStr
    user_id: NonEmptyStr
    variant: NonEmptyStr
    timestamp: Timestamp
    items: list[str]
    experiment: str | None = None
    surface: str | None = None
    item_attributes: dict[str, list[str]] | None = None
    """Per-attribute lists parallel to ``items``, e.g. ``{"category": ["shoes", ...]}``."""
    shadow: dict[str, list[str]] | None = None
    """Rankings other variants would have shown for this request, by variant, e.g.
    ``{"control": [...]}``; used for rank-biased overlap between variants."""
    context: str | None = None
    """Comparable-request key (query, page or user segment): the propensity estimators
    assume an item shown in the same context has the same relevance at every position."""
    randomization: Randomization | None = None
    teams: list[str] | None = None
    """Team-draft interleaving: the team that contributed each position, parallel to
    ``items``, e.g. ``["A", "B", "B", "A"]``; a key of ``interleaving`` each."""
    interleaving: dict[str, str] | None = None
    """The ranker behind each of the two teams, e.g. ``{"A": "ranker-x", "B": "ranker-y"}``."""


class ImpressionHead(Impression, frozen=True, gc=False):
    """An impression whose items are left as their JSON text (the live engine locates
    and hashes the items of a whole poll at once: :mod:`evaluator.core.tokens`)."""

    items: msgspec.Raw  # type: ignore[assignment]


class Interaction(msgspec.Struct, frozen=True, gc=False):
    """A user's action on an item: click, add_to_cart, purchase, watch ..."""

    event_id: NonEmptyStr
    user_id: NonEmptyStr
    item_id: NonEmptyStr
    type: NonEmptyStr
    timestamp: Timestamp
    request_id: str | None = None
    watch_time: float | None = None
    """Milliseconds watched (video profile)."""
    duration: float | None = None
    """Milliseconds of content (video profile); the profile's target duration otherwise."""


class InvalidReason(enum.StrEnum):
    """Why an event was rejected; used as a bounded metric label and DLQ header."""

    UNDECODABLE = "undecodable"
    MISSING_FIELD = "missing_field"
    INVALID_FIELD = "invalid_field"
    EMPTY_LIST = "empty_list"
    DUPLICATE_ITEM = "duplicate_item"
    LIST_TOO_LONG = "list_too_long"
    UNKNOWN_INTERACTION_TYPE = "unknown_interaction_type"
    NEGATIVE_WATCH_TIME = "negative_watch_time"
    TOO_LARGE_TO_FORWARD = "too_large_to_forward"
    """Valid, but on another user's partition and larger than the repartition topic or
    the producer takes (live path only)."""
    FUTURE_TIMESTAMP = "future_timestamp"
    """Stamped later than the clock's now + ``event_time.max_future``: its producer's
    clock is wrong, and the event must not move event time for everyone."""


@dataclass(frozen=True, slots=True)
class InvalidEvent:
    """An input that failed decoding or validation; ``index`` is its position in the input."""

    index: int
    reason: InvalidReason
    detail: str


@dataclass(frozen=True, slots=True)
class Damage:
    """Where an input file stopped being readable (its lines before were read): the
    sibling of :class:`InvalidEvent` for damage no line can be blamed for."""

    path: str
    line: int
    """Lines read before the damage (all of them were yielded)."""
    offset: int
    """Compressed bytes read when the damage was found."""
    reason: str

    def describe(self) -> str:
        return (
            f"{self.path} is damaged after line {self.line} (compressed byte {self.offset}): "
            f"{self.reason}; the lines before it were evaluated"
        )


@dataclass(slots=True)
class ImpressionBatch:
    """Valid impressions in input order, timestamps normalised to epoch ms."""

    events: list[Impression] = field(default_factory=list)
    timestamp_ms: list[int] = field(default_factory=list)
    items: Spans | None = None
    """The events' items as hashed spans, one owner per event (their ``items`` are then
    raw JSON); None: the events hold their items."""

    def take(self, keep: Sequence[int]) -> ImpressionBatch:
        """The given events (indexes, in order)."""
        if len(keep) == len(self.events):
            return self
        return ImpressionBatch(
            [self.events[j] for j in keep],
            [self.timestamp_ms[j] for j in keep],
            None if self.items is None else self.items.take(np.asarray(keep, dtype=np.int64)),
        )


@dataclass(slots=True)
class InteractionBatch:
    """Valid interactions in input order with their relevance grade under the active profile."""

    events: list[Interaction] = field(default_factory=list)
    timestamp_ms: list[int] = field(default_factory=list)
    grade: list[float] = field(default_factory=list)

    def grades(self) -> npt.NDArray[np.float64]:
        return np.asarray(self.grade, dtype=np.float64)


@dataclass(slots=True)
class InteractionColumns:
    """Valid interactions as plain columns (cheap to pass between processes);
    ``request_id`` is empty when the event had none."""

    event_id: list[str] = field(default_factory=list)
    user_id: list[str] = field(default_factory=list)
    item_id: list[str] = field(default_factory=list)
    request_id: list[str] = field(default_factory=list)
    timestamp_ms: list[int] = field(default_factory=list)
    grade: list[float] = field(default_factory=list)

    def extend(self, batch: InteractionBatch) -> None:
        events = batch.events
        self.event_id += [e.event_id for e in events]
        self.user_id += [e.user_id for e in events]
        self.item_id += [e.item_id for e in events]
        self.request_id += [e.request_id or "" for e in events]
        self.timestamp_ms += batch.timestamp_ms
        self.grade += batch.grade

    def __len__(self) -> int:
        return len(self.event_id)


def json_schemas() -> dict[str, dict[str, object]]:
    """JSON Schema documents for the two event types, generated from the models."""
    return {
        "impression": msgspec.json.schema(Impression),
        "interaction": msgspec.json.schema(Interaction),
    }
