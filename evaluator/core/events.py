"""The event contract: impression and interaction models, decoding and validation.

Decoding and schema validation happen in one pass with msgspec. Semantic checks
(empty or over-long lists, duplicate items, unknown interaction types, negative
watch time) follow. An invalid event never raises: it becomes an
:class:`InvalidEvent` carrying its index in the input and the reason, so every
caller (file replay, Kafka consumer, simulator) counts and dead-letters the same way.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Literal, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from evaluator.core.relevance import RelevanceProfile
from evaluator.core.timeutil import datetime_to_ms, format_instant_ms

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


_IMPRESSION_DECODER = msgspec.json.Decoder(Impression)
_INTERACTION_DECODER = msgspec.json.Decoder(Interaction)


def _decode_error(index: int, exc: msgspec.DecodeError) -> InvalidEvent:
    message = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        if "missing required field" in message:
            return InvalidEvent(index, InvalidReason.MISSING_FIELD, message)
        return InvalidEvent(index, InvalidReason.INVALID_FIELD, message)
    return InvalidEvent(index, InvalidReason.UNDECODABLE, message)


def to_ms(value: int | datetime) -> int:
    """Normalise a decoded :data:`Timestamp` to epoch milliseconds."""
    return value if isinstance(value, int) else datetime_to_ms(value)


RESERVED = ("\x1e", "\x1f")
"""Control characters the state store uses as separators; identifiers must not hold them."""


def _reserved(*texts: str) -> bool:
    joined = "".join(texts)
    return RESERVED[0] in joined or RESERVED[1] in joined


def may_hold_reserved(raw: Sequence[bytes]) -> bool:
    """Whether any payload could decode to a string holding a reserved character.

    JSON must escape control characters (msgspec rejects them raw), so a payload
    without the text ``\\u001`` cannot hold U+001E or U+001F: one byte search over the
    batch (newline-separated: no match spans two payloads) spares the per-string check
    on almost every batch."""
    return b"\\u001" in b"\n".join(raw)


def _impression_texts(event: Impression) -> list[str]:
    texts = [event.user_id, event.variant, event.context or "", *event.items]
    for values in (event.item_attributes or {}).values():
        texts += values
    for name, ranking in (event.shadow or {}).items():
        texts += [name, *ranking]
    return texts


def check_impression(
    event: Impression, max_list_length: int, reserved: bool = True
) -> tuple[InvalidReason, str] | None:
    """Semantic checks that the schema cannot express; ``None`` when valid.

    ``reserved=False`` skips the reserved-character check (see :func:`may_hold_reserved`)."""
    if isinstance(event.timestamp, datetime) and to_ms(event.timestamp) < 0:
        return InvalidReason.INVALID_FIELD, "timestamp is before 1970"
    items = event.items
    if not items:
        return InvalidReason.EMPTY_LIST, "items is empty"
    if len(items) > max_list_length:
        return (
            InvalidReason.LIST_TOO_LONG,
            f"{len(items)} items > max_list_length {max_list_length}",
        )
    if len(set(items)) != len(items):
        return InvalidReason.DUPLICATE_ITEM, "an item appears twice in items"
    rnd = event.randomization
    if rnd is not None:
        span = rnd.k if rnd.type == "swap" else rnd.n
        if not 2 <= span <= len(items):
            field_name = "k" if rnd.type == "swap" else "n"
            return (
                InvalidReason.INVALID_FIELD,
                f"randomization.{field_name} = {span} is not in 2..{len(items)}",
            )
    if event.item_attributes:
        for name, values in event.item_attributes.items():
            if len(values) != len(items):
                return (
                    InvalidReason.INVALID_FIELD,
                    f"item_attributes.{name} has {len(values)} values for {len(items)} items",
                )
    if reserved and _reserved(*_impression_texts(event)):
        return InvalidReason.INVALID_FIELD, "a string holds U+001E or U+001F (reserved)"
    return None


def check_interaction(
    event: Interaction, profile: RelevanceProfile, reserved: bool = True
) -> tuple[InvalidReason, str] | None:
    """Semantic checks under ``profile``; ``None`` when valid (``reserved`` as for
    :func:`check_impression`)."""
    if reserved and _reserved(event.event_id, event.user_id, event.item_id):
        return InvalidReason.INVALID_FIELD, "a string holds U+001E or U+001F (reserved)"
    if isinstance(event.timestamp, datetime) and to_ms(event.timestamp) < 0:
        return InvalidReason.INVALID_FIELD, "timestamp is before 1970"
    if event.watch_time is not None and event.watch_time < 0:
        return InvalidReason.NEGATIVE_WATCH_TIME, f"watch_time {event.watch_time} < 0"
    if not profile.accepts(event.type):
        return (
            InvalidReason.UNKNOWN_INTERACTION_TYPE,
            f"type {event.type!r} is not graded by profile {profile.name!r}",
        )
    if profile.kind == "video" and event.watch_time is None:
        return InvalidReason.MISSING_FIELD, "watch_time is required by the video profile"
    if event.duration is not None and event.duration <= 0:
        return InvalidReason.INVALID_FIELD, f"duration {event.duration} <= 0"
    return None


E = TypeVar("E", Impression, Interaction)


def _decode_valid(
    raw: Sequence[bytes],
    decoder: msgspec.json.Decoder[E],
    check: Callable[[E], tuple[InvalidReason, str] | None],
    base_index: int,
) -> tuple[list[E], list[InvalidEvent]]:
    """Decode each payload and run the semantic check; split valid from invalid."""
    valid: list[E] = []
    invalid: list[InvalidEvent] = []
    decode = decoder.decode
    for offset, payload in enumerate(raw):
        try:
            event = decode(payload)
        except msgspec.DecodeError as exc:
            invalid.append(_decode_error(base_index + offset, exc))
            continue
        except RecursionError:  # msgspec's own limit on nesting, not a decode error
            invalid.append(
                InvalidEvent(base_index + offset, InvalidReason.UNDECODABLE, "nested too deeply")
            )
            continue
        problem = check(event)
        if problem is None:
            valid.append(event)
        else:
            invalid.append(InvalidEvent(base_index + offset, *problem))
    return valid, invalid


def latest_accepted_ms(now_ms: int | None, max_future_ms: int) -> int | None:
    """The latest event time accepted at clock ``now_ms``: ``max_future_ms`` after it
    (None: no limit, when either is unset or 0)."""
    return None if now_ms is None or not max_future_ms else now_ms + max_future_ms


def _without_future(
    events: list[E], invalid: list[InvalidEvent], latest_ms: int | None, base_index: int
) -> tuple[list[E], list[int], list[InvalidEvent]]:
    """The valid events with their epoch-ms timestamps, less those stamped after
    ``latest_ms`` (None: no limit), which join ``invalid`` as ``future_timestamp`` (kept
    in input order). One ``max`` over the batch spares the search on almost every batch."""
    times = [to_ms(e.timestamp) for e in events]
    if latest_ms is None or not times or max(times) <= latest_ms:
        return events, times, invalid
    bad = {b.index for b in invalid}
    positions = (i for i in itertools.count(base_index) if i not in bad)
    limit = format_instant_ms(latest_ms)
    kept: list[E] = []
    kept_times: list[int] = []
    for event, ts, index in zip(events, times, positions, strict=False):
        if ts <= latest_ms:
            kept.append(event)
            kept_times.append(ts)
        else:
            detail = f"timestamp {format_instant_ms(ts)} is after {limit} (now + max_future)"
            invalid.append(InvalidEvent(index, InvalidReason.FUTURE_TIMESTAMP, detail))
    invalid.sort(key=lambda b: b.index)
    return kept, kept_times, invalid


def decode_impressions(
    raw: Sequence[bytes],
    max_list_length: int = 1000,
    base_index: int = 0,
    latest_ms: int | None = None,
) -> tuple[ImpressionBatch, list[InvalidEvent]]:
    """Decode and validate JSON impressions; invalid ones are returned, never raised.
    ``latest_ms``: events stamped after it are invalid (``future_timestamp``)."""
    reserved = may_hold_reserved(raw)
    events, invalid = _decode_valid(
        raw,
        _IMPRESSION_DECODER,
        lambda e: check_impression(e, max_list_length, reserved),
        base_index,
    )
    events, times, invalid = _without_future(events, invalid, latest_ms, base_index)
    return ImpressionBatch(events, times), invalid


def decode_interactions(
    raw: Sequence[bytes],
    profile: RelevanceProfile,
    base_index: int = 0,
    latest_ms: int | None = None,
) -> tuple[InteractionBatch, list[InvalidEvent]]:
    """Decode, validate and grade JSON interactions; invalid ones are returned, never
    raised (``latest_ms`` as for :func:`decode_impressions`)."""
    reserved = may_hold_reserved(raw)
    events, invalid = _decode_valid(
        raw, _INTERACTION_DECODER, lambda e: check_interaction(e, profile, reserved), base_index
    )
    events, times, invalid = _without_future(events, invalid, latest_ms, base_index)
    grade = profile.grade
    return (
        InteractionBatch(
            events,
            times,
            [grade(e.type, e.watch_time, e.duration) for e in events],
        ),
        invalid,
    )


def json_schemas() -> dict[str, dict[str, object]]:
    """JSON Schema documents for the two event types, generated from the models."""
    return {
        "impression": msgspec.json.schema(Impression),
        "interaction": msgspec.json.schema(Interaction),
    }
