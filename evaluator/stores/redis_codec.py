"""How open requests and pending interactions are stored as Redis strings, and the
ingest script's per-shard arguments (pure).

A request record is its fields joined by U+001E; list values are joined by U+001F.
Older records (without context and randomisation) still decode.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, cast

import msgspec

from evaluator.events import Impression, ImpressionBatch, InteractionBatch, Randomization
from evaluator.finalise import OpenRequest, PendingInteraction, UserContext
from evaluator.windows import AggregateLayout, shard_of

SEP = "\x1f"
"""Separates items, and the parts of a pending interaction."""
FIELD = "\x1e"
"""Separates the fields of a stored request: user, variant, time, items, attribute values,
shadow variant, shadow ranking, context, randomisation."""


def encode_request(event: Impression, ts: int, attribute: str) -> str:
    """The stored record of an open request."""
    attrs = (event.item_attributes or {}).get(attribute, [])
    shadow_variant = min(event.shadow) if event.shadow else ""
    shadow = event.shadow[shadow_variant] if event.shadow else []
    return FIELD.join(
        (
            event.user_id,
            event.variant,
            str(ts),
            SEP.join(event.items),
            SEP.join(attrs),
            shadow_variant,
            SEP.join(shadow),
            event.context or "",
            _randomization_text(event.randomization),
        )
    )


def pending_record(event_id: str, item_id: str, ts: int, grade: float) -> str:
    """An interaction waiting for its named request (the ``n:`` hashes hold these
    records joined by U+001E, event id first)."""
    return f"{event_id}{SEP}{item_id}{SEP}{ts}{SEP}{grade!r}"


def loose_member(event_id: str, item_id: str, grade: float) -> str:
    """Member of a request-less interaction in the user's ``ul:`` set (event id first:
    the commit script reads it up to the first separator)."""
    return f"{event_id}{SEP}{item_id}{SEP}{grade!r}"


def ingest_payloads(
    impressions: ImpressionBatch,
    interactions: InteractionBatch,
    deadlines_ms: Sequence[int],
    layout: AggregateLayout,
    attribute: str,
) -> dict[int, bytes]:
    """Per shard (of each event's user), the ingest script's msgpack argument:
    ``[impressions, interactions]`` as the script documents them."""
    per_shard: dict[int, tuple[list[Any], list[Any]]] = defaultdict(lambda: ([], []))
    imp_shards = shard_of([e.user_id for e in impressions.events], layout).tolist()
    for event, ts, deadline, shard in zip(
        impressions.events, impressions.timestamp_ms, deadlines_ms, imp_shards, strict=True
    ):
        value = encode_request(event, ts, attribute)
        per_shard[shard][0].append((event.request_id, event.user_id, ts, deadline, value))
    int_shards = shard_of([e.user_id for e in interactions.events], layout).tolist()
    for it, ts, grade, shard in zip(
        interactions.events, interactions.timestamp_ms, interactions.grade, int_shards, strict=True
    ):
        stored = (
            pending_record(it.event_id, it.item_id, ts, grade)
            if it.request_id
            else loose_member(it.event_id, it.item_id, grade)
        )
        row = (it.event_id, it.user_id, it.request_id or "", ts, grade, stored)
        per_shard[shard][1].append(row)
    return {shard: msgspec.msgpack.encode(pair) for shard, pair in per_shard.items()}


def _randomization_text(rnd: Randomization | None) -> str:
    return f"{rnd.key()[0]}{SEP}{rnd.key()[1]}" if rnd is not None else ""


def decode_request(rid: str, value: bytes, pending: bytes) -> OpenRequest:
    """A stored request and the records of the interactions naming it."""
    fields = value.decode().split(FIELD)
    fields += [""] * (9 - len(fields))  # records written before context/randomization
    user, variant, ts, items, attrs, shadow_variant, shadow, context, rnd = fields[:9]
    kind, _, span = rnd.partition(SEP)
    interactions = []
    for record in pending.decode().split(FIELD) if pending else ():
        event_id, item, its, grade = record.split(SEP)
        interactions.append(PendingInteraction(event_id, item, int(its), float(grade)))
    interactions.sort()
    return OpenRequest(
        rid,
        user,
        variant,
        int(ts),
        items.split(SEP),
        interactions,
        attrs.split(SEP) if attrs else [],
        shadow_variant,
        shadow.split(SEP) if shadow else [],
        context,
        (kind, int(span)) if rnd else None,
    )


def decode_context(
    history: bytes, extra: bytes | list[Any], known: dict[str, list[str]]
) -> UserContext:
    """A user's context from the load script's reply.

    ``history`` holds the user's stored history entries (event US time, RS-joined);
    ``extra`` is empty, or for a user with request-less interactions: their
    (member, score) pairs, the user's open requests as stored (request US time,
    RS-joined), and the other open requests' records (decoded only for their items).
    ``known`` maps the requests being loaded to their items."""
    times = sorted(int(entry.split(SEP)[1]) for entry in history.decode().split(FIELD) if entry)
    if not extra:  # most users: the cold-start history is all finalisation needs
        return UserContext(history_ms=times)
    loose, open_raw, others = cast("list[Any]", extra)
    items = {  # only the items field (the 4th) of each record is needed
        others[k].decode(): others[k + 1].decode().split(FIELD, 4)[3].split(SEP)
        for k in range(0, len(others), 2)
    }
    listed: dict[str, int] = {}
    for entry in open_raw.decode().split(FIELD):
        if entry:
            rid, ts = entry.split(SEP)
            listed.setdefault(rid, int(ts))
    order = sorted(listed.items(), key=lambda pair: (pair[1], pair[0]))  # time, then id
    pending = []
    for k in range(0, len(loose), 2):
        event_id, item, grade = loose[k].decode().split(SEP)
        pending.append(PendingInteraction(event_id, item, int(loose[k + 1]), float(grade)))
    return UserContext(
        impression_ms=[ts for _, ts in order],
        impression_ids=[rid for rid, _ in order],
        impression_items=[known.get(rid) or items.get(rid, []) for rid, _ in order],
        loose=pending,
        history_ms=times,
    )


def text(value: bytes | str | None) -> str:
    """A reply as text ("" for a missing value)."""
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value
