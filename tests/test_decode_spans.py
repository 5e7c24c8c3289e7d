"""The live decoder (items as hashed spans) against the reference decoder (items as
strings): the same valid events with the same items, the same invalid ones with the
same reasons and details, whatever the JSON spelling of the lists."""

from __future__ import annotations

import json
import random
from itertools import pairwise

import numpy as np
import pytest

from evaluator.core.decode import decode_impressions
from evaluator.core.decode_spans import decode_impression_spans
from evaluator.core.tokens import array_spans, hash_spans, string_spans
from evaluator.engine.codebook import ITEM_SEED, Codebook
from tests.fuzz import bad_payloads

ALPHABET = ["a", "b", "é", "ü", "中", '"', "\\", " ", ",", "[", "]", "\x1e", "\u2028", "/"]


def _item(rng: random.Random) -> str:
    if rng.random() < 0.8:
        return f"p{rng.randrange(60)}"
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 12)))


def _impression(rng: random.Random, n: int) -> bytes:
    items = [_item(rng) for _ in range(rng.choice([0, 1, 3, 8, 20, 40]))]
    if rng.random() < 0.1 and items:
        items.append(rng.choice(items))  # a repeat
    event: dict[str, object] = {
        "event_id": f"e{n}",
        "request_id": f"r{n}",
        "user_id": f"u{rng.randrange(9)}",
        "variant": rng.choice("AB"),
        "timestamp": 1_767_225_600_000 + rng.randrange(10**6),
        "items": items,
    }
    if rng.random() < 0.2:
        event["item_attributes"] = {"cat": [f"c{rng.randrange(3)}" for _ in items]}
    if rng.random() < 0.1:
        event["randomization"] = {"type": "topn", "n": rng.randrange(1, 5)}
    if rng.random() < 0.05:
        event["items"] = [1, "a"] if rng.random() < 0.5 else [["a"], "b"]
    separators = rng.choice([(",", ":"), (", ", ": "), (" ,  ", " : ")])
    text = json.dumps(event, ensure_ascii=rng.random() < 0.5, separators=separators)
    if rng.random() < 0.05:  # an item spelled with an escape it does not need
        text = text.replace('"p1"', '"\\u0070\\u0031"')
    return text.encode()


def _same(raw: list[bytes], max_list_length: int = 30) -> int:
    """Both decoders on ``raw``: equal results; returns the valid events."""
    want, want_bad = decode_impressions(raw, max_list_length, base_index=5)
    got, got_bad = decode_impression_spans(raw, ITEM_SEED, max_list_length, base_index=5)
    assert got_bad == want_bad
    assert got.timestamp_ms == want.timestamp_ms
    assert [e.event_id for e in got.events] == [e.event_id for e in want.events]
    spans = got.items
    assert spans is not None and spans.key is not None
    bounds = spans.off.tolist()
    texts = spans.texts(np.arange(spans.start.size))
    assert [texts[a:b] for a, b in pairwise(bounds)] == [e.items for e in want.events]
    assert spans.key.tolist() == hash_spans(string_spans(texts), ITEM_SEED).tolist()
    return len(want.events)


@pytest.mark.parametrize("seed", range(6))
def test_spelled_every_way_the_spans_decode_as_strings_do(seed: int) -> None:
    rng = random.Random(seed)
    raw = [_impression(rng, n) for n in range(300)]
    assert 50 < _same(raw) < 250  # valid and invalid ones both


def test_fuzzed_payloads_are_rejected_alike() -> None:
    raw = bad_payloads(5_000, seed=3)
    assert _same(raw, 1000) == 0


def test_codebook_codes_spans_and_strings_alike() -> None:
    """Items met as spans and as strings get one code each."""
    book = Codebook(["x", "p1"])
    spans, ok = array_spans([b'["p1", "q\xc3\xa9", "x"]', b'["r"]'])
    assert ok.all()
    codes = book.encode_spans(spans.hashed(ITEM_SEED))
    assert codes.tolist() == [1, 2, 0, 3]
    assert book.strings == ["x", "p1", "qé", "r"]
    assert book.find(["qé", "r", "zz"]).tolist() == [2, 3, -1]
