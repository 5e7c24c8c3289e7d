"""Finalised markers as hashed runs, against a plain dict of what they must hold."""

from __future__ import annotations

import random

import msgspec
import numpy as np
import pytest

from evaluator.engine import hashruns
from evaluator.engine.hashruns import NONE_MS, HashRuns
from evaluator.engine.markers import Markers, decode_segment


class Log:
    """A changelog that keeps the fields as a store would."""

    def __init__(self) -> None:
        self.fields: dict[str, bytes | None] = {}

    def set(self, name: str, value: bytes | None) -> None:
        self.fields[name] = value


@pytest.mark.parametrize("seed", range(6))
def test_runs_find_the_largest_live_deadline_of_each_hash(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of hashes (some repeated, within a batch and across them and the three
    levels, with other deadlines), merged as they come, and an expiry bound that
    moves: every lookup equals the dict's largest deadline at or after the bound (what
    expired between merges may still be found, but only with its own deadline)."""
    monkeypatch.setattr(hashruns, "SMALL_ROWS", 64)  # every level in play
    monkeypatch.setattr(hashruns, "BASE_ROWS", 256)
    rng = random.Random(seed)
    runs, held = HashRuns(), {}
    before = -(2**62)
    levels = set()
    for step in range(400):
        n = rng.randrange(1, 40)
        keys = [rng.randrange(2**64) if rng.random() < 0.8 else rng.randrange(50) for _ in range(n)]
        keys += [rng.choice(sorted(held)) for _ in range(3)] if held else []  # held already
        deadlines = [step * 10 + rng.randrange(100) for _ in keys]
        runs.add(np.array(keys, np.uint64), np.array(deadlines, np.int64), before)
        for k, d in zip(keys, deadlines, strict=True):
            if d >= before:
                held[k] = max(d, held.get(k, NONE_MS))
        if rng.random() < 0.2:
            before = max(before, step * 10 - rng.randrange(200))  # never back
            runs.expire(before)
        levels |= {name for name in ("base", "middle") if getattr(runs, name) is not None}
        asked = [*rng.sample(sorted(held), min(30, len(held))), *range(50), 2**64 - 1]
        asked += [rng.randrange(2**64) for _ in range(20)]
        found = runs.find(np.array(asked, np.uint64)).tolist()
        for key, got in zip(asked, found, strict=True):
            want = held.get(key, NONE_MS)
            if want >= before or got >= before:
                assert got == want, (step, key)
        assert sum(run.keys.size for run in runs.runs) < 64  # small runs settle
    assert levels == {"base", "middle"}
    assert runs.live(before) == {k: d for k, d in held.items() if d >= before}


def test_a_lookup_reads_a_directory_bucket_of_the_large_runs() -> None:
    """The base and middle runs' directories hold about eight hashes a bucket, every
    hash in the bucket of its top bits, so a lookup's search stays within a few
    entries however many are held."""
    rng = np.random.default_rng(3)
    runs = HashRuns()
    for _ in range(20):
        keys = rng.integers(0, 2**63, 20_000, dtype=np.int64).astype(np.uint64) * np.uint64(2)
        runs.add(keys, np.full(keys.size, 10**12, np.int64), 0)
    assert runs.base is not None and runs.middle is not None
    for level in (runs.base, runs.middle):
        starts, held = level.starts, level.run.keys
        sizes = np.diff(starts)
        assert sizes.sum() == held.size and 4 <= sizes.mean() <= 16
        bucket = np.repeat(np.arange(sizes.size), sizes)
        assert (held >> np.uint64(64 - level.bits)).astype(np.int64).tolist() == bucket.tolist()
    assert len(runs) == 400_000


def test_segments_round_trip_and_old_rows_are_hashed_alike() -> None:
    """A segment decodes to the hashes and deadlines written (4-byte offsets, or 8 when
    they span more); rows of ids of the previous format give the same hashes."""
    log = Log()
    markers = Markers(log)
    markers.add(["q1", "q2"], [10, 2**40], [("c1", 10)])
    out: dict[str, bytes | None] = {}
    markers.write(out, rows=100)
    assert set(out) == {"k:", "g:0"}
    raw = out["g:0"]
    assert raw is not None
    keys, deadlines, pairs, pair_deadlines = decode_segment(msgspec.msgpack.decode(raw))
    assert keys.tolist() == markers.keys(["q1", "q2"]).tolist()
    assert deadlines.tolist() == [10, 2**40] and pair_deadlines.tolist() == [10]
    assert pairs.tolist() == markers.seen_keys(["c1"]).tolist()  # by event id alone
    other = Markers(Log(), seed=markers.seed, seed_written=True)
    other.load([("g:7", [["q1", 10, ["c1"]], ["q2", 2**40, []]])], [])
    assert other.live() == markers.live()
    assert other.next_segment == 8


def test_seeds_key_the_hashes() -> None:
    """Two partitions' seeds give unrelated hashes of the same ids."""
    a, b = Markers(Log()), Markers(Log())
    assert a.seed != b.seed
    ids = [f"r{n}" for n in range(1000)]
    assert not set(a.keys(ids).tolist()) & set(b.keys(ids).tolist())


def test_an_id_hashes_alike_whatever_else_its_batch_holds() -> None:
    """A redelivery comes in another batch: an id (ending in U+0000, or not ASCII)
    hashes the same beside ASCII ids and beside others, and not as the id without
    its trailing U+0000."""
    markers = Markers(Log())
    ids = ["q\x00", "q", "é\x00", "é", "ab"]
    alone = [int(markers.keys([i])[0]) for i in ids]
    assert markers.keys(ids).tolist() == alone
    assert markers.keys(["q\x00", "é"]).tolist() == [alone[0], alone[3]]
    assert len(set(alone)) == len(ids)
