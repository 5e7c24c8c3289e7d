"""Generated bad payloads: every way an event line can be broken, deterministic by seed.

Each payload is one line (no newline inside, as a JSON Lines file or a Kafka
message holds it) and must be rejected by both decoders. Kinds: random bytes,
truncated JSON, deep nesting, huge strings and lists, wrong types, NaN and
infinities, out-of-range timestamps, non-UTF-8, missing fields, empty and
duplicate-item lists, control characters the store reserves.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

GOOD_IMPRESSION = {
    "event_id": "fz-i",
    "request_id": "fz-r",
    "user_id": "fz-u",
    "variant": "A",
    "timestamp": 1_767_225_600_000,
    "items": ["a", "b", "c"],
}
GOOD_INTERACTION = {
    "event_id": "fz-e",
    "user_id": "fz-u",
    "item_id": "a",
    "type": "click",
    "timestamp": 1_767_225_601_000,
}


def _one_line(raw: bytes) -> bytes:
    return raw.replace(b"\n", b" ").replace(b"\r", b" ")


def _random_bytes(rng: random.Random) -> bytes:
    raw = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200)))
    return _one_line(raw).strip() or b"\x00"


def _truncated(rng: random.Random) -> bytes:
    text = json.dumps(rng.choice([GOOD_IMPRESSION, GOOD_INTERACTION])).encode()
    return text[: rng.randint(1, len(text) - 1)]


def _deep(rng: random.Random) -> bytes:
    depth = rng.choice([50, 500, 5_000, 20_000])
    opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
    return opener * depth + b"1" + closer * depth


def _huge(rng: random.Random) -> bytes:
    event = dict(rng.choice([GOOD_IMPRESSION, GOOD_INTERACTION]))
    if rng.random() < 0.5 or "items" not in event:
        event["user_id"] = 123  # wrong type, after a huge string that must not matter
        event["variant" if "variant" in event else "type"] = "x" * rng.choice([10_000, 100_000])
    else:
        event["items"] = [f"i{n}" for n in range(rng.choice([1_001, 5_000]))]
    return json.dumps(event).encode()


def _wrong_type(rng: random.Random) -> bytes:
    event = dict(rng.choice([GOOD_IMPRESSION, GOOD_INTERACTION]))
    key = rng.choice(sorted(event))
    event[key] = rng.choice([None, True, [], {}, 3.5, -1, "", [1, 2]])
    empty_ok = event[key] == "" and key in {"type", "item_id"}
    if empty_ok or (key == "timestamp" and event[key] == 3.5):
        event[key] = None  # "" or a float can be valid in a few fields: make it wrong
    return json.dumps(event).encode()


def _non_finite(rng: random.Random) -> bytes:
    text = json.dumps(rng.choice([GOOD_IMPRESSION, GOOD_INTERACTION]))
    value = rng.choice(["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
    return text.replace('"timestamp": 17672256', f'"timestamp": {value}, "x": 17672256').encode()


def _timestamp(rng: random.Random) -> bytes:
    event = dict(rng.choice([GOOD_IMPRESSION, GOOD_INTERACTION]))
    event["timestamp"] = rng.choice(
        [-1, -(2**63), 2**63, 10**30, 253_402_300_800_000, "0001-01-01T00:00:00Z", "yesterday"]
    )
    return json.dumps(event).encode()


def _non_utf8(rng: random.Random) -> bytes:
    text = json.dumps(rng.choice([GOOD_IMPRESSION, GOOD_INTERACTION])).encode()
    return text.replace(b"fz-u", rng.choice([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80"]))


def _missing(rng: random.Random) -> bytes:
    event = dict(rng.choice([GOOD_IMPRESSION, GOOD_INTERACTION]))
    # fields both kinds require (so the payload is bad for either decoder)
    del event[rng.choice(["event_id", "user_id", "timestamp"])]
    return json.dumps(event).encode()


def _reserved(rng: random.Random) -> bytes:
    event = dict(rng.choice([GOOD_IMPRESSION, GOOD_INTERACTION]))
    event["user_id"] = "u" + rng.choice(["\x1e", "\x1f"]) + "x"
    return json.dumps(event).encode()


def _not_an_object(rng: random.Random) -> bytes:
    return rng.choice([b"[]", b"1", b'"text"', b"null", b"true", b"{}", b"  x ", b"\x00"])


KINDS: dict[str, Callable[[random.Random], bytes]] = {
    "random_bytes": _random_bytes,
    "truncated": _truncated,
    "deep_nesting": _deep,
    "huge": _huge,
    "wrong_type": _wrong_type,
    "non_finite": _non_finite,
    "timestamp_range": _timestamp,
    "non_utf8": _non_utf8,
    "missing_field": _missing,
    "reserved_chars": _reserved,
    "not_an_object": _not_an_object,
}


def bad_payloads(count: int, seed: int = 0) -> list[bytes]:
    """``count`` bad payloads, cycling through the kinds (big ones sparingly)."""
    rng = random.Random(seed)
    names = sorted(KINDS)
    out = []
    for n in range(count):
        name = names[n % len(names)]
        if name in {"huge", "deep_nesting"} and rng.random() < 0.9:
            name = "truncated"  # keep the total size modest: 1 in 10 of these is big
        out.append(KINDS[name](rng))
    return out
