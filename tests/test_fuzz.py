"""Fuzzing: generated bad payloads through the decoders, replay and the live path.

Asserted: no crash, every bad payload counted with a reason (and dead-lettered
live), and the good events mixed in give exactly the metrics they give alone.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from evaluator.app.replay import evaluate_files
from evaluator.config import load_settings
from evaluator.core.decode import decode_impressions, decode_interactions
from evaluator.core.events import InvalidReason
from evaluator.core.relevance import BUILTIN_PROFILES
from tests.eventgen import generate
from tests.fuzz import bad_payloads

PAYLOADS = 100_000


@pytest.fixture(scope="module")
def payloads() -> list[bytes]:
    return bad_payloads(PAYLOADS, seed=11)


def test_decoders_reject_every_fuzzed_payload_with_a_reason(payloads: list[bytes]) -> None:
    reasons = set(InvalidReason)
    for decode in (
        lambda raw: decode_impressions(raw, 1000),
        lambda raw: decode_interactions(raw, BUILTIN_PROFILES["ecommerce"]),
    ):
        valid, invalid = decode(payloads)
        assert not valid.events
        assert [i.index for i in invalid] == list(range(len(payloads)))
        assert {i.reason for i in invalid} <= reasons


def assert_close(got: object, want: object, path: str = "") -> None:
    """Equal structures; floats within 1e-12 (sums in another order), the rest exact."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), path
        for key in want:
            assert_close(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, float):
        assert got == pytest.approx(want, abs=1e-12), path
    else:
        assert got == want, path


def _interleave(good: list[str], bad: list[bytes], seed: int) -> bytes:
    lines = [g.encode() for g in good] + list(bad)
    random.Random(seed).shuffle(lines)
    return b"\n".join(lines) + b"\n"


def test_replay_counts_fuzzed_lines_and_keeps_the_good_ones_exact(
    payloads: list[bytes], tmp_path
) -> None:
    """All 100,000 payloads go through replay (half in each file), shuffled among a
    generated data set: the metrics equal replay of the data set alone."""
    import json

    settings = load_settings(environ={})
    events = generate(7, requests=400)
    clean = evaluate_files(*events.write(tmp_path), settings, progress=False)
    half = len(payloads) // 2
    imp, inter = tmp_path / "fuzzed-impressions.jsonl", tmp_path / "fuzzed-interactions.jsonl"
    imp.write_bytes(_interleave([json.dumps(e) for e in events.impressions], payloads[:half], 1))
    inter.write_bytes(_interleave([json.dumps(e) for e in events.interactions], payloads[half:], 2))
    fuzzed = evaluate_files(imp, inter, settings, progress=False)
    # equal but for the order of float additions (the lines are shuffled)
    assert_close(fuzzed["variants"], clean["variants"])
    got, want = fuzzed["events"], clean["events"]
    assert got["invalid"] == want["invalid"] + len(payloads)
    assert sum(got["invalid_by_reason"].values()) == got["invalid"]
    for key in ("impressions", "interactions", "attributed", "unmatched", "duplicates"):
        assert got[key] == want[key], key


@pytest.mark.services
def test_live_path_dead_letters_fuzzed_payloads(kafka_bootstrap, redis_url, tmp_path) -> None:
    """A share of the payloads through the real broker and Redis, among a data set:
    each bad one is dead-lettered with its reason, and the aggregates equal replay."""
    from tests.live import dead_letters, new_env
    from tests.test_live_kafka import dataset, finish, produce_events

    env = new_env(kafka_bootstrap, redis_url)
    events, late = dataset(41, env.settings())
    bad = bad_payloads(1_000, seed=12)
    produce_events(env, events, 41, invalid=False)
    env.produce("impressions", [("fuzz", p) for p in bad[:500]])
    env.produce("interactions", [("fuzz", p) for p in bad[500:]])
    proc = env.start(tmp_path / "run.log")
    finish(env, events, late, [proc], tmp_path)
    letters = dead_letters(env)
    assert len(letters) == len(bad)
    topics = Counter(topic.rsplit("-", 1)[-1] for topic, _, _ in letters)
    assert topics == {"impressions.dlq": 500, "interactions.dlq": 500}
    assert {h["reason"].decode() for _, h, _ in letters} <= {r.value for r in InvalidReason}
    assert "Traceback" not in (tmp_path / "run.log").read_text()
