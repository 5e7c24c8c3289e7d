"""Decoding and validating events, one batch at a time.

Decoding and schema validation happen in one pass with msgspec. Semantic checks
(empty or over-long lists, duplicate items, unknown interaction types, negative
watch time) follow. An invalid event never raises: it becomes an
:class:`~evaluator.core.events.InvalidEvent` carrying its index in the input and the
reason, so every caller (file replay, Kafka consumer, simulator) counts and
dead-letters the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TypeVar

import msgspec

from evaluator.core.events import (
    Impression,
    ImpressionBatch,
    Interaction,
    InteractionBatch,
    InvalidEvent,
    InvalidReason,
)
from evaluator.core.relevance import RelevanceProfile
from evaluator.core.timeutil import datetime_to_ms, format_instant_ms

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


RESERVED = ("\x1c", "\x1d", "\x1e", "\x1f")
"""Control characters the state store uses as separators and name prefixes (the
history's maturity and provisional arrays); identifiers must not hold them."""


def _reserved(*texts: str) -> bool:
    joined = "".join(texts)
    return any(c in joined for c in RESERVED)


def may_hold_reserved(raw: Sequence[bytes]) -> bool:
    """Whether any payload could decode to a string holding a reserved character.

    JSON must escape control characters (msgspec rejects them raw), so a payload
    without the text ``\\u001`` cannot hold U+001C to U+001F: one byte search over the
    batch (newline-separated: no match spans two payloads) spares the per-string check
    on almost every batch."""
    return b"\\u001" in b"\n".join(raw)


def _impression_texts(event: Impression, items: Sequence[str] | None = None) -> list[str]:
    texts = [
        event.user_id,
        event.variant,
        event.context or "",
        *(event.items if items is None else items),
    ]
    for values in (event.item_attributes or {}).values():
        texts += values
    for name, ranking in (event.shadow or {}).items():
        texts += [name, *ranking]
    if event.interleaving:
        texts += [*event.interleaving, *event.interleaving.values()]
    return texts


def _check_teams(event: Impression, n_items: int) -> str | None:
    """What is wrong with an impression's interleaving fields (None: nothing)."""
    teams, rankers = event.teams, event.interleaving
    if teams is None or rankers is None:
        return "teams and interleaving come together"
    if len(rankers) != 2 or len(set(rankers.values())) != 2 or not all(rankers.values()):
        return "interleaving names two teams of two different, non-empty rankers"
    if len(teams) != n_items:
        return f"teams has {len(teams)} values for {n_items} items"
    if not set(teams) <= rankers.keys():
        return "teams holds a team that interleaving does not name"
    return None


def check_impression(
    event: Impression, max_list_length: int, reserved: bool = True
) -> tuple[InvalidReason, str] | None:
    """Semantic checks that the schema cannot express; ``None`` when valid.

    ``reserved=False`` skips the reserved-character check (see :func:`may_hold_reserved`)."""
    items = event.items
    texts = _impression_texts(event) if reserved else None
    return _check_listed(event, len(items), len(set(items)) != len(items), max_list_length, texts)


def _check_listed(
    event: Impression, n_items: int, repeats: bool, max_list_length: int, texts: list[str] | None
) -> tuple[InvalidReason, str] | None:
    """:func:`check_impression` of an impression of ``n_items`` items, ``repeats`` telling
    whether one appears twice, ``texts`` its strings (None: no reserved-character check)."""
    if isinstance(event.timestamp, datetime) and to_ms(event.timestamp) < 0:
        return InvalidReason.INVALID_FIELD, "timestamp is before 1970"
    if not n_items:
        return InvalidReason.EMPTY_LIST, "items is empty"
    if n_items > max_list_length:
        return (
            InvalidReason.LIST_TOO_LONG,
            f"{n_items} items > max_list_length {max_list_length}",
        )
    if repeats:
        return InvalidReason.DUPLICATE_ITEM, "an item appears twice in items"
    rnd = event.randomization
    if rnd is not None:
        span = rnd.k if rnd.type == "swap" else rnd.n
        if not 2 <= span <= n_items:
            field_name = "k" if rnd.type == "swap" else "n"
            return (
                InvalidReason.INVALID_FIELD,
                f"randomization.{field_name} = {span} is not in 2..{n_items}",
            )
    if event.item_attributes:
        for name, values in event.item_attributes.items():
            if len(values) != n_items:
                return (
                    InvalidReason.INVALID_FIELD,
                    f"item_attributes.{name} has {len(values)} values for {n_items} items",
                )
    if event.teams is not None or event.interleaving is not None:
        wrong = _check_teams(event, n_items)
        if wrong:
            return InvalidReason.INVALID_FIELD, wrong
    if texts is not None and _reserved(*texts):
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
