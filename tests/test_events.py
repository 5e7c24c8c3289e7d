import json
from pathlib import Path

import pytest

from evaluator.core.decode import decode_impressions, decode_interactions
from evaluator.core.events import InvalidReason, json_schemas
from evaluator.core.relevance import BUILTIN_PROFILES

ECOM = BUILTIN_PROFILES["ecommerce"]
VIDEO = BUILTIN_PROFILES["video"]


def imp(**kw) -> bytes:
    base = {
        "event_id": "e",
        "request_id": "r",
        "user_id": "u",
        "variant": "A",
        "timestamp": 1_700_000_000_000,
        "items": ["a", "b"],
    }
    base.update(kw)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


def inter(**kw) -> bytes:
    base = {
        "event_id": "e",
        "user_id": "u",
        "item_id": "a",
        "type": "click",
        "timestamp": 1_700_000_000_000,
    }
    base.update(kw)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


def test_valid_impression_with_rfc3339_timestamp() -> None:
    batch, invalid = decode_impressions([imp(timestamp="2023-11-14T22:13:20.123+00:00")])
    assert invalid == []
    assert batch.timestamp_ms == [1_700_000_000_123]
    batch, _ = decode_impressions([imp(timestamp="2023-11-14T23:13:20+01:00")])
    assert batch.timestamp_ms == [1_700_000_000_000]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"{not json", InvalidReason.UNDECODABLE),
        (b"", InvalidReason.UNDECODABLE),
        (imp(user_id=...), InvalidReason.MISSING_FIELD),
        (imp(items=[]), InvalidReason.EMPTY_LIST),
        (imp(items=["a", "b", "a"]), InvalidReason.DUPLICATE_ITEM),
        (imp(items=[f"i{n}" for n in range(6)]), InvalidReason.LIST_TOO_LONG),
        (imp(timestamp="2023-11-14T22:13:20"), InvalidReason.INVALID_FIELD),  # no timezone
        (imp(items="a,b"), InvalidReason.INVALID_FIELD),
        (imp(item_attributes={"category": ["x"]}), InvalidReason.INVALID_FIELD),
        (imp(variant=""), InvalidReason.INVALID_FIELD),
        (imp(randomization={"type": "swap", "k": 3}), InvalidReason.INVALID_FIELD),
        # the state store's separators cannot appear in stored strings
        (imp(items=["a", "b\x1fc"]), InvalidReason.INVALID_FIELD),
        (imp(context="home\x1e"), InvalidReason.INVALID_FIELD),
        (imp(item_attributes={"category": ["x", "y\x1f"]}), InvalidReason.INVALID_FIELD),
        # nor the history's name prefixes in a variant (its arrays would be taken for
        # another variant's provisional or maturity ones)
        (imp(variant="\x1dA"), InvalidReason.INVALID_FIELD),
        (imp(variant="\x1cA"), InvalidReason.INVALID_FIELD),
    ],
)
def test_invalid_impressions(payload: bytes, reason: InvalidReason) -> None:
    batch, invalid = decode_impressions([imp(), payload], max_list_length=5)
    assert len(batch.events) == 1
    assert [(i.index, i.reason) for i in invalid] == [(1, reason)]


def test_reserved_characters_in_any_escape_spelling() -> None:
    """The byte pre-filter must catch upper-case escapes and a single suspect line."""
    upper = imp(items=["a", "b"]).replace(b'"b"', b'"b\\u001Fc"')
    assert upper.count(b"\\u001F") == 1
    batch, invalid = decode_impressions([imp(), upper, imp(event_id="e3", request_id="r3")])
    assert [(i.index, i.reason) for i in invalid] == [(1, InvalidReason.INVALID_FIELD)]
    assert len(batch.events) == 2
    other_control, invalid = decode_impressions([imp(items=["a", "b\x1ac"])])
    assert invalid == [] and other_control.events[0].items == ["a", "b\x1ac"]


@pytest.mark.parametrize(
    ("payload", "profile", "reason"),
    [
        (inter(type="teleport"), ECOM, InvalidReason.UNKNOWN_INTERACTION_TYPE),
        (inter(watch_time=-1), ECOM, InvalidReason.NEGATIVE_WATCH_TIME),
        (inter(item_id=...), ECOM, InvalidReason.MISSING_FIELD),
        (inter(type="watch"), VIDEO, InvalidReason.MISSING_FIELD),
        (inter(type="watch", watch_time=5, duration=0), VIDEO, InvalidReason.INVALID_FIELD),
        (b"[1, 2]", ECOM, InvalidReason.INVALID_FIELD),
        (inter(item_id="a\x1fb"), ECOM, InvalidReason.INVALID_FIELD),
    ],
)
def test_invalid_interactions(payload: bytes, profile, reason: InvalidReason) -> None:
    _, invalid = decode_interactions([payload], profile)
    assert [i.reason for i in invalid] == [reason]


def test_interactions_are_graded() -> None:
    batch, invalid = decode_interactions(
        [inter(type="purchase"), inter(type="add_to_cart"), inter(type="click")], ECOM
    )
    assert invalid == []
    assert batch.grade == [3.0, 2.0, 1.0]
    video, _ = decode_interactions(
        [inter(type="watch", watch_time=15_000), inter(type="watch", watch_time=9, duration=10)],
        VIDEO,
    )
    assert video.grade == pytest.approx([0.5, 0.9])


def test_committed_schemas_match_the_models() -> None:
    root = Path(__file__).resolve().parents[1] / "schemas"
    for name, schema in json_schemas().items():
        committed = json.loads((root / f"{name}.schema.json").read_text())
        assert committed == json.loads(json.dumps(schema)), f"run `make schemas` ({name})"


def test_events_stamped_after_the_limit_are_future_timestamps_in_input_order() -> None:
    latest = 1_700_000_060_000  # the clock at 1_700_000_000_000 + max_future 1m
    payloads = [
        imp(event_id="e0", request_id="r0", timestamp=latest),  # at the limit: valid
        imp(event_id="e1", request_id="r1", timestamp=latest + 1),
        b"{not json",
        imp(event_id="e3", request_id="r3", timestamp="2023-11-16T22:13:20Z"),  # 2 days on
        imp(event_id="e4", request_id="r4", timestamp=latest - 1),
    ]
    batch, invalid = decode_impressions(payloads, latest_ms=latest)
    assert [e.request_id for e in batch.events] == ["r0", "r4"]
    assert batch.timestamp_ms == [latest, latest - 1]
    assert [(b.index, b.reason) for b in invalid] == [
        (1, InvalidReason.FUTURE_TIMESTAMP),
        (2, InvalidReason.UNDECODABLE),
        (3, InvalidReason.FUTURE_TIMESTAMP),
    ]
    assert "2023-11-14T22:14:20.001Z is after 2023-11-14T22:14:20.000Z" in invalid[0].detail
    # without a limit (replay's old behaviour, the demo) every stamp is valid
    unlimited, bad = decode_impressions(payloads)
    assert len(unlimited.events) == 4 and len(bad) == 1
    # the index is the payload's position in the input, past an offset too
    _, shifted = decode_impressions(payloads, base_index=10, latest_ms=latest)
    assert [b.index for b in shifted] == [11, 12, 13]


def test_future_interactions_are_dropped_with_their_grades() -> None:
    latest = 1_700_000_000_000
    batch, invalid = decode_interactions(
        [
            inter(event_id="a", type="purchase", timestamp=latest + 172_800_000),
            inter(event_id="b", type="click", timestamp=latest),
        ],
        ECOM,
        latest_ms=latest,
    )
    assert [e.event_id for e in batch.events] == ["b"]
    assert batch.grade == [1.0] and batch.timestamp_ms == [latest]
    assert [(b.index, b.reason) for b in invalid] == [(0, InvalidReason.FUTURE_TIMESTAMP)]
