"""One contract for every state store (embedded, Redis, Redis Cluster), run against each.

A :class:`Driver` plays a partition's owner: it feeds the pure engine and writes its
checkpoints to the store, and reloads the engine from the store (as a new owner
would) before every step, so every join rule below also holds across restarts.
"""

from __future__ import annotations

import dataclasses
import json
import random

import msgspec
import numpy as np
import pytest

from evaluator.config import load_settings
from evaluator.config.plain import engine_config
from evaluator.core.decode import decode_impressions, decode_interactions
from evaluator.core.finalise import FinaliseConfig, Finalised
from evaluator.core.relevance import BUILTIN_PROFILES
from evaluator.engine.checkpoint import Delta, Outcome, PartitionWrite
from evaluator.engine.commit_payload import USERS
from evaluator.engine.partition import PartitionEngine, StepCounts
from evaluator.engine.restore import restore_state

SETTINGS = load_settings(environ={})
CONFIG = SETTINGS.finalise_config()


def impression(rid: str, user: str, ts: int, items: list[str], **extra) -> bytes:
    """One impression payload; ``extra`` adds or overrides fields (variant, context ...)."""
    event = {
        "event_id": f"e-{rid}",
        "request_id": rid,
        "user_id": user,
        "variant": "A",
        "timestamp": ts,
        "items": items,
        **extra,
    }
    return json.dumps(event).encode()


def impressions(*rows: tuple[str, str, int, list[str]]):
    return decode_impressions([impression(*row) for row in rows])[0]


def interactions(*rows: tuple[str, str, str, str | None, int, str]):
    payloads = []
    for eid, user, item, rid, ts, kind in rows:
        event = {"event_id": eid, "user_id": user, "item_id": item, "type": kind, "timestamp": ts}
        if rid:
            event["request_id"] = rid
        payloads.append(json.dumps(event).encode())
    return decode_interactions(payloads, BUILTIN_PROFILES["ecommerce"])[0]


class Driver:
    """One partition's owner on a store: engine steps, each followed by a checkpoint."""

    def __init__(
        self, store, config: FinaliseConfig = CONFIG, partition: int = 0, settings=SETTINGS
    ) -> None:
        self.store, self.partition = store, partition
        self.config = dataclasses.replace(engine_config(settings), finalise=config)
        self.offsets = {"impressions": 0, "interactions": 0}
        self.reload()

    def reload(self) -> None:
        """Claim the partition and rebuild the engine from what the store holds."""
        stored = self.store.claim(self.partition)
        self.epoch, self.seq = stored.epoch, stored.seq
        state = restore_state(stored.fields, self.config.finalise.deadline, self.config.history_cap)
        self.engine = PartitionEngine(
            self.partition, self.config, state, stored.watermark_ms, stored.times
        )

    def write(self, done: list[Finalised], expect: Outcome = Outcome.WRITTEN) -> StepCounts:
        delta, counts = self.take(done)
        assert self.store.checkpoint(self.partition, self.epoch, self.seq, delta) is expect
        self.seq += 1
        return counts

    def take(self, done: list[Finalised]) -> tuple[Delta, StepCounts]:
        """The engine's checkpoint since the last one (not written)."""
        changes, counts = self.engine.take()
        delta = Delta(
            changes,
            {"finalised": counts.finalised, "duplicates": counts.duplicates, "late": counts.late},
            dict(self.offsets),
            self.engine.input_times(),
            self.engine.watermark_ms,
            self.engine.open_requests(),
            self.engine.watermark_ms,
            done,
            exposures=dict(counts.exposures),
        )
        return delta, counts

    def ingest(self, imps, ints, late_before: int | None = None) -> StepCounts:
        """Store events; ``late_before``: request-less interactions older than this are
        late (the watermark is that far past the join horizon)."""
        self.reload()
        if late_before is not None:
            self.engine.watermark_ms = late_before + self.config.horizon_ms
        self.engine.ingest(imps, ints)
        for name, times in (
            ("impressions", imps.timestamp_ms),
            ("interactions", ints.timestamp_ms),
        ):
            self.engine.observe(name, max(times) if times else None, caught_up=False, now_ms=0)
        self.offsets["impressions"] += len(imps.events)
        self.offsets["interactions"] += len(ints.events)
        return self.write([])

    def finalise(
        self, watermark: int, expect: Outcome = Outcome.WRITTEN, reload: bool = True
    ) -> list[Finalised]:
        """Finalise everything due at ``watermark``; returns what was finalised."""
        if reload:
            self.reload()
        self.engine.watermark_ms = max(self.engine.watermark_ms or watermark, watermark)
        done = self.engine.finalise_due()
        self.write(done, expect)
        return done


def finalised(done: list[Finalised]) -> int:
    return sum(len(d.requests) for d in done)


def test_checkpoints_round_trip_and_fence_stale_owners(make_store) -> None:
    store = make_store(SETTINGS.layout())
    first = store.claim(2)
    assert (first.epoch, first.seq, first.fields, first.offsets) == (1, 0, [], {})
    delta = Delta(
        {"r:a": b"1", "r:b": b"2"},
        {"finalised": 3},
        {"impressions": 7},
        {"impressions": 90},
        80,
        2,
        75,
        [],
    )
    assert store.checkpoint(2, first.epoch, 0, delta) is Outcome.WRITTEN
    gone = Delta({"r:a": None}, {}, {"impressions": 8}, {}, 81, 1, 76, [])
    assert store.checkpoint(2, first.epoch, 1, gone) is Outcome.WRITTEN
    second = store.claim(2)  # a new owner: the first is fenced from now on
    assert second.epoch == 2 and second.seq == 2
    assert sorted(second.fields) == [("r:b", b"2")]
    assert (second.offsets, second.times, second.watermark_ms) == (
        {"impressions": 8},
        {"impressions": 90},
        81,
    )
    stale = Delta({"r:z": b"9"}, {"finalised": 100}, {"impressions": 99}, {}, 99, 0, 99, [])
    assert store.checkpoint(2, first.epoch, 2, stale) is Outcome.FENCED
    assert store.checkpoint(2, second.epoch, 1, stale) is Outcome.STALE  # not its last write
    assert store.checkpoint(2, second.epoch + 1, 2, stale) is Outcome.STALE  # a lost claim
    third = store.claim(2)
    assert sorted(third.fields) == [("r:b", b"2")] and third.offsets == {"impressions": 8}
    assert store.counters()["finalised"] == 3
    assert store.open_requests(0) == (1, 0)
    assert store.frontier() == 76
    assert (
        store.checkpoint(5, store.claim(5).epoch, 0, Delta({}, {}, {}, {}, 50, 4, 50, []))
        is Outcome.WRITTEN
    )
    assert store.open_requests(0) == (5, 0)
    assert store.frontier() == 76  # the readout follows the furthest partition


def test_a_polls_checkpoints_are_written_together_each_fenced_on_its_own(make_store) -> None:
    """``checkpoint_many``: each partition's write is judged alone (written, fenced by a
    newer owner, stale), and the coverage sketches of the written ones hold the union
    of their items (two partitions touch the same sketch: both count, once each). (A
    refused write's sketch part may land, as Redis writes sketches before the
    checkpoints: harmless, since the owner that finalises those requests again adds
    the same items; here they are items of the written lists.)"""
    store = make_store(SETTINGS.layout())
    lists = {0: ["a", "b", "c"], 1: ["a"], 2: ["d"], 3: ["c", "d"]}
    owners = {p: Driver(store, partition=p) for p in lists}
    for p, items in lists.items():
        owners[p].ingest(impressions((f"r{p}", f"u{p}", 1_000, items)), interactions())
    writes = []
    for p, owner in owners.items():
        owner.reload()
        owner.engine.watermark_ms = CONFIG.deadline(1_000)
        delta, _ = owner.take(owner.engine.finalise_due())
        assert finalised(delta.finalised) == 1
        writes.append(PartitionWrite(p, owner.epoch, owner.seq, delta))
    store.claim(1)  # a newer owner of partition 1: its write is fenced
    writes[2] = dataclasses.replace(writes[2], seq=writes[2].seq + 1)  # not its last write
    outcomes = store.checkpoint_many(writes)
    assert outcomes == [Outcome.WRITTEN, Outcome.FENCED, Outcome.STALE, Outcome.WRITTEN]
    assert store.counters()["finalised"] == 2
    assert store.open_requests(0)[0] == 2  # partitions 1 and 2 still hold theirs
    window = max(SETTINGS.layout().windows_ms)
    start = int(SETTINGS.layout().bucket_start(window, np.array([CONFIG.deadline(1_000)]))[0])
    counts, catalog = store.distinct_items(window, [start], ["A"])
    assert counts[("A", 10)] == pytest.approx(4, abs=0.5)  # a b c d, each once
    assert 1.5 < counts[("A", USERS)] < 4.5  # u0 and u3 (u1, u2 maybe: see above)
    assert catalog == pytest.approx(4, abs=0.5)
    assert store.checkpoint_many([]) == []


def test_ingest_is_idempotent_and_counts_duplicates(make_store) -> None:
    store = make_store(SETTINGS.layout())
    imps = impressions(("r1", "u1", 1_000, ["a", "b"]))
    ints = interactions(("i1", "u1", "b", "r1", 2_000, "click"))
    assert Driver(store).ingest(imps, ints).duplicates == 0
    assert Driver(store).ingest(imps, ints).duplicates == 2
    assert Driver(store).finalise(CONFIG.deadline(1_000) - 1) == []
    owner = Driver(store)
    assert owner.engine.state.users["u1"].history == [(2_000, "i1")]
    done = owner.finalise(CONFIG.deadline(1_000))
    finalised = done[0]
    assert [
        (r.request_id, tuple(items), len(r.interactions))
        for r, items in zip(finalised.requests, finalised.shown(), strict=True)
    ] == [("r1", ("a", "b"), 1)]
    assert store.counters() == {"finalised": 1, "duplicates": 2}
    assert Driver(store).finalise(10**15) == []  # finalised once, whoever owns it next


def test_finalised_rows_reach_the_window_blocks(make_store) -> None:
    store = make_store(SETTINGS.layout())
    Driver(store).ingest(
        impressions(("r1", "u1", 1_000, ["a"]), ("r2", "u2", 1_000, ["a"])),
        interactions(("i1", "u1", "a", "r1", 1_500, "purchase")),
    )
    assert finalised(Driver(store).finalise(CONFIG.deadline(1_000))) == 2
    assert store.counters()["finalised"] == 2
    blocks = store.blocks(max(SETTINGS.layout().windows_ms))
    assert sum(b[:, :, 0].sum() for b in blocks.values()) == 2  # two requests counted
    assert sum(b[:, :, 1].sum() for b in blocks.values()) == 1  # one engaged


EXPERIMENTS = load_settings(
    environ={},
    overrides={
        "ab": {
            "experiments": {
                "all": {},
                "late": {"start": 5_000, "end": 9_000},
                "bc": {"variants": ["B", "C"]},
            }
        }
    },
)


def test_users_are_counted_once_at_their_first_exposure(make_store) -> None:
    """Exact users per variant and experiment: a user's later impressions (another
    variant, a redelivery, another owner after a reload) add nobody."""
    store = make_store(SETTINGS.layout())

    def step(partition: int, *rows: tuple[str, str, int, str]) -> None:
        payloads = [impression(rid, user, ts, ["a"], variant=v) for rid, user, ts, v in rows]
        imps = decode_impressions(payloads)[0]
        Driver(store, partition=partition, settings=EXPERIMENTS).ingest(imps, interactions())

    step(0, ("r1", "u1", 1_000, "A"), ("r2", "u2", 1_000, "B"), ("r3", "u1", 2_000, "B"))
    step(0, ("r1", "u1", 1_000, "A"), ("r4", "u3", 6_000, "C"))  # r1 redelivered
    step(1, ("r5", "u5", 5_000, "B"), ("r6", "u6", 9_000, "B"), ("r7", "u5", 9_500, "A"))
    assert store.exposures("all") == {"A": 1, "B": 3, "C": 1}
    assert store.exposures("late") == {"B": 1, "C": 1}  # 5_000 <= t < 9_000 only
    assert store.exposures("bc") == {"B": 4, "C": 1}  # u1 counts from their first B
    assert store.exposures("none") == {}


def test_experiment_statistics_are_cumulative_from_the_start(make_store) -> None:
    """Every finalised request since the experiment's start stays in its statistics,
    however far apart in time (the sliding windows forget them)."""
    store = make_store(SETTINGS.layout())
    day = 86_400_000
    for p, (t, variant) in enumerate([(1_000, "A"), (6_000, "B"), (30 * day, "B")]):
        owner = Driver(store, partition=p % 2, settings=EXPERIMENTS)
        rid = f"r{p}"
        owner.ingest(
            decode_impressions([impression(rid, f"u{p}", t, ["a", "b"], variant=variant)])[0],
            interactions((f"i{p}", f"u{p}", "a", rid, t + 500, "purchase")),
        )
        Driver(store, partition=p % 2, settings=EXPERIMENTS).finalise(CONFIG.deadline(t))
    blocks = store.experiment_blocks("all")
    assert {v: b[..., 0].sum() for v, b in blocks.items()} == {"A": 1, "B": 2}
    assert {v: b[..., 1].sum() for v, b in blocks.items()} == {"A": 1, "B": 2}
    late = store.experiment_blocks("late")
    assert {v: b[..., 0].sum() for v, b in late.items()} == {"B": 1}
    assert set(store.experiment_blocks("bc")) == {"B"}
    longest = max(SETTINGS.layout().windows_ms)
    window = store.blocks(longest, 30 * day - longest, 31 * day + longest)
    assert sum(b[..., 0].sum() for b in window.values()) == 1  # the window forgot two


def exposure_experiments(fields: list[tuple[str, bytes]]) -> set[str]:
    """The experiments that ``v:`` fields hold users of."""
    return {msgspec.msgpack.decode(raw)[1] for name, raw in fields if name.startswith("v:")}


def test_an_ended_experiment_drops_its_exposure_records(make_store) -> None:
    store = make_store(SETTINGS.layout())
    owner = Driver(store, settings=EXPERIMENTS)
    payloads = [impression("r1", "u1", 6_000, ["a"], variant="B")]
    owner.ingest(decode_impressions(payloads)[0], interactions())
    assert "late" in exposure_experiments(store.claim(0).fields)
    after = 9_000 + CONFIG.deadline(0) * 3  # the data's own time passes end + horizon
    Driver(store, settings=EXPERIMENTS).ingest(
        decode_impressions([impression("r9", "u9", after, ["a"], variant="B")])[0],
        interactions(),
    )
    Driver(store, settings=EXPERIMENTS).finalise(after)
    held = exposure_experiments(store.claim(0).fields)
    assert "late" not in held
    assert "all" in held  # still running
    assert store.exposures("late") == {"B": 1}  # the count stays


def test_partitions_write_their_own_blocks_and_readers_sum_them(make_store) -> None:
    layout = SETTINGS.layout()
    store = make_store(layout)
    for p in range(3):
        owner = Driver(store, partition=p)
        owner.ingest(impressions((f"r{p}", f"u{p}", 1_000, ["a"])), interactions())
        assert finalised(owner.finalise(CONFIG.deadline(1_000))) == 1
    blocks = store.blocks(max(layout.windows_ms))
    assert sum(b[:, :, 0].sum() for b in blocks.values()) == 3
    for block in blocks.values():
        counted = np.flatnonzero(block[..., 0].sum(axis=0))
        assert sorted(int(b) % layout.shards for b in counted) == [0, 1, 2]


@pytest.mark.parametrize("sizes", [["5m", "1h", "24h"], ["7m", "1h"]])
def test_longer_windows_hold_the_union_of_their_buckets(make_store, sizes) -> None:
    """Requests finalised in several short buckets, in separate checkpoints, all count in
    the longer windows' buckets (merged sketches, or fed directly when the bucket
    widths do not nest)."""
    settings = load_settings(environ={}, overrides={"windows": {"sizes": sizes}})
    layout, config = settings.layout(), settings.finalise_config()
    store = make_store(layout)
    step = layout.bucket_width(min(layout.windows_ms))
    base = 10 * max(layout.windows_ms)  # bucket-aligned for every window
    lists = {}
    for n in range(4):  # one request per short bucket, all in one long bucket
        ts = base - config.deadline(0) + n * step + 1
        lists[f"r{n}"] = [f"i{n}_{j}" for j in range(12)] + ["shared"]
        owner = Driver(store, config)
        owner.ingest(impressions((f"r{n}", f"u{n}", ts, lists[f"r{n}"])), interactions())
        assert finalised(owner.finalise(config.deadline(ts))) == 1
    everything = set().union(*lists.values())
    top10 = set().union(*(items[:10] for items in lists.values()))
    for window in layout.windows_ms[1:]:
        start = int(layout.bucket_start(window, np.array([base]))[0])
        counts, catalog = store.distinct_items(window, [start], ["A"])
        assert counts[("A", 10)] == pytest.approx(len(top10), abs=0.5), window
        assert counts[("A", 20)] == pytest.approx(len(everything), abs=0.5), window
    assert catalog == pytest.approx(len(everything), abs=0.5)


def test_catalogue_holds_items_beyond_the_largest_cutoff(make_store) -> None:
    """The catalogue (every shown item) also counts items below the largest K."""
    settings = load_settings(environ={}, overrides={"metrics": {"k": [2, 3]}})
    layout, config = settings.layout(), settings.finalise_config()
    store = make_store(layout)
    lists = {"r1": ["a", "b", "c", "d", "e"], "r2": ["a", "f"], "r3": ["g", "h", "i", "j"]}
    owner = Driver(store, config)
    owner.ingest(
        impressions(*((rid, f"u{rid}", 1_000, items) for rid, items in lists.items())),
        interactions(),
    )
    assert finalised(owner.finalise(config.deadline(1_000))) == 3
    window = max(layout.windows_ms)
    start = int(layout.bucket_start(window, np.array([config.deadline(1_000)]))[0])
    counts, catalogue = store.distinct_items(window, [start], ["A"])
    assert counts[("A", 3)] == pytest.approx(7, abs=0.5)  # a b c f g h i
    assert catalogue == pytest.approx(10, abs=0.5)  # a..j


def test_late_interactions_are_counted_once(make_store) -> None:
    store = make_store(SETTINGS.layout())
    Driver(store).ingest(impressions(("r1", "u1", 1_000, ["a"])), interactions())
    Driver(store).finalise(CONFIG.deadline(1_000))
    late = interactions(("i9", "u1", "a", "r1", 1_500, "click"))
    assert Driver(store).ingest(impressions(), late).late == 1
    assert Driver(store).ingest(impressions(), late).late == 0  # redelivered: a duplicate now
    again = impressions(("r1", "u1", 1_000, ["a"]))
    assert Driver(store).ingest(again, interactions()).duplicates == 1  # finalised request
    loose = interactions(("i10", "u1", "a", None, 1_500, "click"))
    assert Driver(store).ingest(impressions(), loose, late_before=2_000).late == 1
    assert store.counters()["late"] == 2


def test_history_keeps_the_earliest_relevant_interactions(make_store) -> None:
    """Cold start needs each user's first N relevant interactions, whatever order and
    batches they arrive in, redeliveries included."""
    store = make_store(SETTINGS.layout())
    cap = SETTINGS.cold_start.min_relevant_history
    batches = [[5_000, 4_000], [3_000, 6_000], [1_000], [3_000], [2_000, 7_000]]
    for times in batches:
        rows = [(f"h{ts}", "u1", "a", None, ts, "click") for ts in times]
        Driver(store).ingest(impressions(), interactions(*rows))
    history = Driver(store).engine.state.users["u1"].history
    assert [t for t, _ in history] == [1_000, 2_000, 3_000, 4_000, 5_000, 6_000, 7_000][:cap]


@pytest.mark.parametrize("seed", range(3))
def test_history_from_single_interaction_batches(make_store, seed) -> None:
    """One interaction per batch with ties and redeliveries keeps the same earliest ones
    as sorting everything would."""
    rng = random.Random(seed)
    store = make_store(SETTINGS.layout())
    cap = SETTINGS.cold_start.min_relevant_history
    sent: dict[str, int] = {}
    for n in range(12):
        if sent and rng.random() < 0.25:
            eid = rng.choice(list(sent))  # redelivered
        else:
            eid = f"h{n}"
            sent[eid] = rng.choice([1_000 + 100 * n, 1_000 + 100 * n, 800 + 100 * n])
        row = (eid, "u1", "a", None, sent[eid], "click")
        Driver(store).ingest(impressions(), interactions(row))
    history = Driver(store).engine.state.users["u1"].history
    assert [t for t, _ in history] == sorted(sent.values())[:cap]


def test_interactions_before_their_impression_wait_for_it(make_store) -> None:
    store = make_store(SETTINGS.layout())
    early = interactions(("i1", "u1", "b", "r1", 1_500, "purchase"))
    assert Driver(store).ingest(impressions(), early).duplicates == 0
    assert Driver(store).finalise(10**12) == []  # nothing open yet
    Driver(store).ingest(impressions(("r1", "u1", 1_000, ["a", "b"])), interactions())
    assert Driver(store).ingest(impressions(), early).duplicates == 1
    done = Driver(store).finalise(10**12)
    assert [(r.request_id, [i.event_id for i in r.interactions]) for r in done[0].requests] == [
        ("r1", ["i1"])
    ]
    counts = Driver(store).ingest(impressions(), early)
    assert (counts.late, counts.duplicates) == (0, 1)


def test_late_interactions_find_requests_finalised_hours_apart(make_store) -> None:
    """Finalised requests are remembered for ``finalised_ttl`` of data time: late
    interactions naming requests finalised half a TTL apart are each counted once."""
    store = make_store(SETTINGS.layout())
    gap = SETTINGS.redis.ms("finalised_ttl") // 2
    Driver(store).ingest(
        impressions(("r1", "u1", 1_000, ["a"]), ("r2", "u2", 1_000 + gap, ["a"])),
        interactions(),
    )
    Driver(store).finalise(CONFIG.deadline(1_000 + gap))
    late = interactions(
        ("i1", "u1", "a", "r1", 1_500, "click"), ("i2", "u2", "a", "r2", 1_500 + gap, "click")
    )
    assert Driver(store).ingest(impressions(), late).late == 2
    assert Driver(store).ingest(impressions(), late).duplicates == 2
    again = impressions(("r1", "u1", 1_000, ["a"]), ("r2", "u2", 1_000 + gap, ["a"]))
    assert Driver(store).ingest(again, interactions()).duplicates == 2
    assert Driver(store).finalise(10**14) == []


def test_redelivery_after_finalisation_is_a_duplicate_not_late(make_store) -> None:
    """At-least-once delivery after a crash: events applied before their request was
    finalised (or pruned afterwards) must not be counted as late when they come again."""
    store = make_store(SETTINGS.layout())
    imps = impressions(("r1", "u1", 1_000, ["a", "b"]))
    ints = interactions(
        ("i1", "u1", "a", "r1", 1_500, "click"), ("i2", "u1", "b", None, 1_600, "click")
    )
    Driver(store).ingest(imps, ints)
    # far enough on that the request-less interaction is pruned too
    assert finalised(Driver(store).finalise(CONFIG.deadline(1_000) + CONFIG.deadline(0))) == 1
    counts = Driver(store).ingest(imps, ints, late_before=2_000)
    assert (counts.late, counts.duplicates) == (0, 3)
    assert store.counters().get("late", 0) == 0


def test_user_join_sees_the_users_open_impressions(make_store) -> None:
    store = make_store(SETTINGS.layout())
    Driver(store).ingest(
        impressions(("r1", "u1", 1_000, ["a", "b"]), ("r2", "u1", 2_000, ["b", "c"])),
        interactions(("i1", "u1", "b", None, 2_500, "click")),
    )
    done = Driver(store).finalise(CONFIG.deadline(2_000))[0]
    engaged = {r.request_id: row[1] for r, row in zip(done.requests, done.rows, strict=True)}
    assert engaged == {"r1": 0.0, "r2": 1.0}  # the most recent impression with the item wins


def test_distinct_items_for_coverage(make_store) -> None:
    store = make_store(SETTINGS.layout())
    Driver(store).ingest(
        impressions(("r1", "u1", 1_000, ["a", "b", "c"]), ("r2", "u2", 1_000, ["c", "d"])),
        interactions(),
    )
    Driver(store).finalise(CONFIG.deadline(1_000))
    window = max(SETTINGS.layout().windows_ms)
    start = int(SETTINGS.layout().bucket_start(window, np.array([CONFIG.deadline(1_000)]))[0])
    counts, catalog = store.distinct_items(window, [start], ["A"])
    assert counts[("A", 10)] == pytest.approx(4, abs=0.5)
    assert catalog == pytest.approx(4, abs=0.5)


def test_distinct_items_per_variant_cutoff_and_window(make_store) -> None:
    """Top-k cuts, variants and every window keep their own item sets, and user sets."""
    layout = SETTINGS.layout()
    store = make_store(layout)
    a1 = [f"a{i}" for i in range(12)]
    a2 = [f"a{i}" for i in range(5, 17)]
    b1 = [f"b{i}" for i in range(3)] + ["a0"]
    payloads = [
        impression(rid, user, 1_000, items, variant=variant)
        for rid, user, variant, items in (
            ("r1", "u1", "A", a1),
            ("r2", "u2", "A", a2),
            ("r3", "u3", "B", b1),
        )
    ]
    Driver(store).ingest(decode_impressions(payloads)[0], interactions())
    Driver(store).finalise(CONFIG.deadline(1_000))
    for window in layout.windows_ms:
        start = int(layout.bucket_start(window, np.array([CONFIG.deadline(1_000)]))[0])
        counts, catalog = store.distinct_items(window, [start], ["A", "B"])
        want = {
            ("A", 10): len(set(a1[:10]) | set(a2[:10])),
            ("A", 20): len(set(a1) | set(a2)),
            ("B", 10): 4,
            ("B", 20): 4,
            ("A", USERS): 2,  # and the distinct users
            ("B", USERS): 1,
        }
        for key, n in want.items():
            assert counts[key] == pytest.approx(n, abs=0.5), (window, key)
        assert catalog == pytest.approx(len(set(a1) | set(a2) | set(b1)), abs=0.5)


def stored_request(store, **extra):
    """Store one impression with extra fields; the request as a new owner finalises it."""
    payload = impression("r", "u", 1_000, ["a", "b"], variant="B", **extra)
    Driver(store).ingest(decode_impressions([payload])[0], interactions())
    done = Driver(store).finalise(CONFIG.deadline(1_000))
    assert finalised(done) == 1
    return done[0].requests[0]


def test_attribute_values_round_trip(make_store) -> None:
    request = stored_request(
        make_store(SETTINGS.layout()), item_attributes={"category": ["x", "y"]}
    )
    assert list(request.attributes) == ["x", "y"]


def test_shadow_ranking_round_trips(make_store) -> None:
    request = stored_request(make_store(SETTINGS.layout()), shadow={"A": ["b", "c"]})
    assert (request.shadow_variant, list(request.shadow)) == ("A", ["b", "c"])


def test_blocks_reflect_every_checkpoint_between_reads(make_store) -> None:
    store = make_store(SETTINGS.layout())
    window = max(SETTINGS.layout().windows_ms)
    totals = []
    for n, ts in enumerate((1_000, 1_500, 2_000), start=1):
        Driver(store).ingest(impressions((f"r{n}", f"u{n}", ts, ["a"])), interactions())
        Driver(store).finalise(CONFIG.deadline(ts))
        blocks = store.blocks(window, 0, CONFIG.deadline(10_000))
        totals.append(sum(float(b[..., 0].sum()) for b in blocks.values()))
    assert totals == [1.0, 2.0, 3.0]
    assert store.blocks(window, 10**14, 10**15) == {}


def test_propensity_counters_follow_the_checkpoints(make_store) -> None:
    settings = load_settings(environ={}, overrides={"propensity": {"estimator": "em"}})
    fconfig = settings.finalise_config()
    store = make_store(settings.layout())
    payloads = [
        impression(rid, user, 1_000, ["a", "b", "c"], context="home", randomization=rnd)
        for rid, user, rnd in (("r1", "u1", None), ("r2", "u2", {"type": "topn", "n": 3}))
    ]
    ints = interactions(
        ("i1", "u1", "b", "r1", 1_500, "click"), ("i2", "u2", "a", "r2", 1_500, "purchase")
    )
    Driver(store, fconfig).ingest(decode_impressions(payloads)[0], ints)
    done = Driver(store, fconfig).finalise(fconfig.deadline(1_000))
    assert {r.request_id: (r.context, r.randomization) for r in done[0].requests} == {
        "r1": ("home", None),
        "r2": ("home", ("topn", 3)),
    }
    assert Driver(store, fconfig).finalise(fconfig.deadline(1_000)) == []
    click = 1 << 32
    sep = "\x1f"
    assert store.propensity_counts() == {
        f"h{sep}home{sep}a{sep}1": 2 + click,  # shown twice, clicked in r2
        f"h{sep}home{sep}b{sep}2": 2 + click,  # shown twice, clicked in r1
        f"h{sep}home{sep}c{sep}3": 2,
        f"r{sep}base{sep}1": 1,  # r1 was not randomised; its position 1 was not clicked
        f"r{sep}topn{sep}1": 1 + click,
        f"r{sep}topn{sep}2": 1,
        f"r{sep}topn{sep}3": 1,
    }


def test_propensity_counters_cover_the_newest_days_of_the_history(make_store) -> None:
    """Counters are kept per day of finalisation; only the newest ``history`` days count,
    older ones are dropped (the counters stay bounded)."""
    day = 86_400_000
    settings = load_settings(
        environ={}, overrides={"propensity": {"estimator": "em", "history": "2d"}}
    )
    fconfig = settings.finalise_config()
    store = make_store(settings.layout(), propensity_history_ms=2 * day)
    base = 20_000 * day - fconfig.deadline(0) + 1_000  # deadlines 1 s into a day

    def finalise_one(n: int, ts: int) -> dict[str, int]:
        owner = Driver(store, fconfig, partition=n % 3)
        owner.ingest(impressions((f"r{n}", f"u{n}", ts, [f"item{n}"])), interactions())
        assert finalised(owner.finalise(fconfig.deadline(ts))) == 1
        return store.propensity_counts()

    def items(counts: dict[str, int]) -> set[str]:
        return {key.split("\x1f")[2] for key in counts if key.startswith("h")}

    assert items(finalise_one(1, base)) == {"item1"}
    assert items(finalise_one(2, base + day)) == {"item1", "item2"}  # 2 days: both
    assert items(finalise_one(3, base + 2 * day)) == {"item2", "item3"}  # day 1 dropped
    assert items(finalise_one(4, base + 5 * day)) == {"item4"}
    assert items(store.propensity_counts()) == {"item4"}


def test_propensity_curve_of_a_bucket_is_fixed_by_the_first_proposal(make_store) -> None:
    store = make_store(SETTINGS.layout())
    assert store.propensity_curve(60_000, (1.0, 0.5)) == (1.0, 0.5)
    assert store.propensity_curve(60_000, (1.0, 0.9)) == (1.0, 0.5)
    assert store.propensity_curve(120_000, (1.0, 0.25)) == (1.0, 0.25)


def test_redis_refuses_state_of_another_layout(redis_url: str, key_prefix: str) -> None:
    from evaluator.adapters.redis.store import LayoutMismatchError, RedisStore, connect

    RedisStore(connect(redis_url), SETTINGS.layout(), prefix=key_prefix).check_layout()
    other = load_settings(environ={}, overrides={"metrics": {"k": [5]}}).layout()
    with pytest.raises(LayoutMismatchError):
        RedisStore(connect(redis_url), other, prefix=key_prefix).check_layout()


def test_redis_refuses_open_requests_of_the_shared_state_layout(
    redis_url: str, key_prefix: str
) -> None:
    from evaluator.adapters.redis.store import LayoutMismatchError, RedisStore, connect

    client = connect(redis_url)
    store = RedisStore(client, SETTINGS.layout(), prefix=key_prefix)
    store.check_layout()  # empty, or written by this version: fine
    Driver(store).ingest(impressions(("r1", "u1", 1_000, ["a"])), interactions())
    store.check_layout()
    client.zadd(store.tag(3) + "dl", {"old": 5})  # as the earlier version kept a request
    with pytest.raises(LayoutMismatchError, match="shared-state layout"):
        store.check_layout()
    store.close()


def test_redis_scripts_are_reloaded_after_a_script_flush(redis_url: str, key_prefix: str) -> None:
    """After a restart or failover the server may have lost the scripts: the checkpoint
    fails once (the owner reloads and retries) and then works again."""
    from redis.exceptions import NoScriptError

    from evaluator.adapters.redis.store import RedisStore, connect

    client = connect(redis_url)
    store = RedisStore(client, SETTINGS.layout(), prefix=key_prefix)
    imps = impressions(("r1", "u1", 1_000, ["a"]))
    client.script_flush()
    with pytest.raises(NoScriptError):
        Driver(store).ingest(imps, interactions())
    assert Driver(store).ingest(imps, interactions()).duplicates == 0
    assert finalised(Driver(store).finalise(CONFIG.deadline(1_000))) == 1
    store.close()


def assert_all_four_items_counted(store) -> None:
    """Both requests (r1: a b c, r2: c d, impressions at 1 s) were finalised once, and
    the coverage sketches hold their four distinct items."""
    assert store.counters()["finalised"] == 2
    window = max(SETTINGS.layout().windows_ms)
    start = int(SETTINGS.layout().bucket_start(window, np.array([CONFIG.deadline(1_000)]))[0])
    counts, catalog = store.distinct_items(window, [start], ["A"])
    assert counts[("A", 10)] == pytest.approx(4, abs=0.5)
    assert catalog == pytest.approx(4, abs=0.5)


def test_redis_coverage_survives_a_failure_between_sketches_and_checkpoint(
    redis_url: str, key_prefix: str
) -> None:
    """Sketches are unions, written before the checkpoint: a failure in between leaves
    the requests open in the store, the next owner finalises them again, and no item is
    lost or counted twice."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from evaluator.adapters.redis.store import RedisStore, connect

    store = RedisStore(connect(redis_url), SETTINGS.layout(), prefix=key_prefix)
    lists = {"r1": ["a", "b", "c"], "r2": ["c", "d"]}
    rows = [(rid, f"u{i}", 1_000, items) for i, (rid, items) in enumerate(lists.items())]
    Driver(store).ingest(impressions(*rows), interactions())
    add = store._sketches.add
    calls: list[int] = []

    def failing_after(parts) -> list[bool]:
        calls.append(sum(len(done.requests) for finalised, _ in parts for done in finalised))
        wrote = add(parts)
        if len(calls) == 1:
            raise RedisConnectionError("injected: Redis went away")
        return wrote

    store._sketches.add = failing_after  # type: ignore[method-assign]
    with pytest.raises(RedisConnectionError):
        Driver(store).finalise(CONFIG.deadline(1_000))
    assert finalised(Driver(store).finalise(CONFIG.deadline(1_000))) == 2  # still open
    assert calls == [2, 2]
    assert_all_four_items_counted(store)
    store.close()


def test_redis_refuses_a_checkpoint_whose_sketch_writes_a_restart_lost(tmp_path) -> None:
    """Redis restarts from an AOF that holds the owner's last checkpoint but not the
    sketch writes made just before its next one (they reached the old process, the
    checkpoint reaches the new one, as a client's retry across the restart does): the
    checkpoint is refused as stale, the owner reloads and finalises those requests
    again, and no shown item is missing from the coverage sketches."""
    from evaluator.adapters.redis.store import RedisStore, connect
    from tests.live import RedisServer

    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        store = RedisStore(connect(server.url), SETTINGS.layout(), prefix="lost")
        lists = {"r1": ["a", "b", "c"], "r2": ["c", "d"]}
        rows = [(rid, f"u{i}", 1_000, items) for i, (rid, items) in enumerate(lists.items())]
        driver = Driver(store)
        driver.ingest(impressions(*rows), interactions())
        driver.reload()  # the owner's claim and last checkpoint are in the AOF ...
        earlier = server.snapshot()
        add = store._sketches.add

        def restarted_after(parts) -> list[bool]:
            wrote = add(parts)  # ... these writes are not
            server.kill()
            server.restore(earlier)
            server.start()
            store._load_scripts()  # as any instance does after NOSCRIPT
            return wrote

        store._sketches.add = restarted_after  # type: ignore[method-assign]
        driver.finalise(CONFIG.deadline(1_000), expect=Outcome.STALE, reload=False)
        store._sketches.add = add  # type: ignore[method-assign]
        assert finalised(driver.finalise(CONFIG.deadline(1_000))) == 2  # open again
        assert_all_four_items_counted(store)
        store.close()
    finally:
        server.kill()


@pytest.mark.parametrize(("index", "value"), [(0, 1), (1, 63), (2, 5), (3, 40), (16383, 51)])
def test_dense_sketches_are_read_by_redis_register_by_register(
    redis_url: str, key_prefix: str, index: int, value: int
) -> None:
    """One non-zero register, wherever its six bits fall across bytes, is one register
    for Redis: PFCOUNT gives linear counting's estimate for one occupied register."""
    from evaluator.adapters.redis.sketches import dense_encoding
    from evaluator.adapters.redis.store import connect

    client = connect(redis_url)
    registers = np.zeros(1 << 14, dtype=np.uint8)
    registers[index] = value
    key = f"{{{key_prefix}:hcov}}:probe"
    client.set(key, dense_encoding(registers))
    assert client.pfcount(key) == 1
    registers[(index + 7) % registers.size] = 2
    client.set(key, dense_encoding(registers))
    assert client.pfcount(key) == 2
    client.close()


def test_dense_sketches_count_and_merge_like_redis_own(redis_url: str, key_prefix: str) -> None:
    """Sketches built in the process count within HyperLogLog's error (0.81% standard
    error at 16,384 registers) and merge with PFMERGE into the union."""
    from evaluator.adapters.redis.sketches import dense_hll
    from evaluator.adapters.redis.store import connect

    client = connect(redis_url)
    tag = f"{{{key_prefix}:hcov}}"
    a = [f"item-{i}" for i in range(30_000)]
    b = [f"item-{i}" for i in range(20_000, 60_000)]
    client.set(f"{tag}:a", dense_hll(a))
    client.set(f"{tag}:b", dense_hll(b))
    assert client.pfcount(f"{tag}:a") == pytest.approx(30_000, rel=0.03)
    client.execute_command("PFMERGE", f"{tag}:u", f"{tag}:a", f"{tag}:b")
    assert client.pfcount(f"{tag}:u") == pytest.approx(60_000, rel=0.03)
    client.set(f"{tag}:small", dense_hll(["x", "y", "z", "x"]))
    assert client.pfcount(f"{tag}:small") == 3
    client.close()


def test_a_user_is_counted_once_for_the_experiments_whole_life(make_store) -> None:
    """Exposed users are kept for the experiment's life (no TTL): a user back 95 days
    later, through new owners each time, is not counted again; the state holds a few
    ``v:`` fields, no field per user."""
    store = make_store(SETTINGS.layout())
    day = 86_400_000

    def step(rid: str, user: str, t: int) -> None:
        payloads = [impression(rid, user, t, ["a"], variant="B")]
        owner = Driver(store, settings=SETTINGS)
        owner.ingest(decode_impressions(payloads)[0], interactions())
        Driver(store, settings=SETTINGS).finalise(t)

    step("r1", "u1", day)
    step("r2", "u1", 5 * day)
    step("r3", "u2", 40 * day)
    step("r4", "u1", 95 * day)
    assert store.exposures("default") == {"B": 2}
    fields = [name for name, _ in store.claim(0).fields]
    assert not any(name.startswith("e:") for name in fields)
    assert 1 <= sum(name.startswith("v:") for name in fields) <= 3


def test_an_ended_experiment_counts_no_late_impression_again(make_store) -> None:
    store = make_store(SETTINGS.layout())
    owner = Driver(store, settings=EXPERIMENTS)
    owner.ingest(
        decode_impressions([impression("r1", "u1", 6_000, ["a"], variant="B")])[0],
        interactions(),
    )
    after = 9_000 + CONFIG.deadline(0) * 3
    owner = Driver(store, settings=EXPERIMENTS)
    owner.ingest(
        decode_impressions([impression("r2", "u9", after, ["a"], variant="B")])[0],
        interactions(),
    )
    Driver(store, settings=EXPERIMENTS).finalise(after)
    late = decode_impressions([impression("r3", "u1", 7_000, ["a"], variant="B")])[0]
    Driver(store, settings=EXPERIMENTS).ingest(late, interactions())  # dropped records
    assert store.exposures("late") == {"B": 1}


@pytest.mark.parametrize("cluster", [False, True], ids=["redis", "redis-cluster"])
def test_redis_grows_a_stored_layout_and_reads_its_old_blocks(
    request: pytest.FixtureRequest, key_prefix: str, cluster: bool
) -> None:
    """State written by a version without a metric (here: without recall) is read by
    one with it, on the same prefix: the stored columns keep their place, the new ones
    are appended, blocks the two versions share are widened in place, and the new
    metric is the mean over the requests finalised since (its own count)."""
    from evaluator.adapters.redis.store import RedisStore, connect
    from evaluator.core.metrics.registry import METRICS
    from evaluator.core.rows import fresh_columns

    url = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
    fresh = SETTINGS.layout()
    without = [m for m in METRICS if m != "recall"]
    before = dataclasses.replace(fresh, column_names=fresh_columns(fresh.ks, without))

    def owner(layout):
        store = RedisStore(connect(url, cluster=cluster), layout, prefix=key_prefix)
        store.check_layout()
        return store, dataclasses.replace(CONFIG, layout=store.layout)

    def batch(store, config, first: int, engaged: list[bool]) -> None:
        rows = [(f"r{first + i}", f"u{first + i}", 1_000, ["a", "b"]) for i in range(2)]
        clicks = [
            (f"i{first + i}", f"u{first + i}", "b", f"r{first + i}", 1_500, "purchase")
            for i, hit in enumerate(engaged)
            if hit
        ]
        Driver(store, config).ingest(impressions(*rows), interactions(*clicks))
        assert finalised(Driver(store, config).finalise(CONFIG.deadline(1_000))) == 2

    old, old_config = owner(before)
    assert old.layout.column_names == before.column_names
    batch(old, old_config, 0, [True, False])
    new, new_config = owner(fresh)
    added = [c for c in fresh.column_names if c not in before.column_names]
    assert added == ["sum:recall@10", "sum:recall@20", "sq:recall@10", "sq:recall@20"]
    assert new.layout.column_names == (*before.column_names, "count#1", "engaged#1", *added)
    batch(new, new_config, 2, [True, True])
    again, _ = owner(fresh)  # a restart keeps the grown layout
    assert again.layout.column_names == new.layout.column_names
    schema = new.layout.schema
    for read in (
        sum(new.blocks(max(fresh.windows_ms)).values()),
        sum(new.experiment_blocks("default").values()),
    ):
        assert read[..., schema.index("count")].sum() == 4
        assert read[..., schema.index("count#1")].sum() == 2
        # item b at rank 2 bought: nDCG@10 = 1/log2(3) for each engaged request, recall 1
        assert schema.mean(read, "ndcg", 10, "count") == pytest.approx(3 / np.log2(3) / 4)
        assert schema.mean(read, "recall", 10, "count") == pytest.approx(1.0)
        assert schema.mean(read, "recall", 10, "skip") == pytest.approx(1.0)
    for store in (old, new, again):
        store.close()


def test_window_state_is_bounded_by_event_time(make_store) -> None:
    """Over 72 h of event time, each window keeps only the buckets of its last two
    lengths: older blocks are dropped (the embedded store) or forgotten and deleted
    (Redis), so a long run's window state stays bounded; the windows read the same."""
    layout = SETTINGS.layout()
    store = make_store(layout)
    step = 20 * 60_000
    deadlines = []
    for n in range(72 * 3):
        ts = n * step + 1_000
        Driver(store).ingest(
            impressions((f"r{n}", f"u{n % 7}", ts, ["a", f"i{n}"])), interactions()
        )
        Driver(store).finalise(CONFIG.deadline(ts))
        deadlines.append(CONFIG.deadline(ts))
    newest = deadlines[-1]
    for window in layout.windows_ms:
        newest_start = int(layout.bucket_start(window, np.array([newest]))[0])
        starts = sorted({start for start, _ in store.blocks(window)})
        assert starts[-1] == newest_start
        assert starts[0] >= newest_start - 2 * window
        # the window itself still holds every request whose deadline falls in it
        since = newest - window - layout.bucket_width(window)
        held = sum(float(b[..., 0].sum()) for b in store.blocks(window, since, newest).values())
        first = int(layout.bucket_start(window, np.array([newest - window]))[0])
        assert held == sum(1 for d in deadlines if d >= first)
    if make_store.kind == "memory":  # what the process holds, not only what is read
        assert {key[1] for key in store._blocks} == {
            start for window in layout.windows_ms for start, _ in store.blocks(window)
        }
        oldest = newest - 2 * max(layout.windows_ms) - max(layout.windows_ms)
        assert min(key[1] for key in store._items) >= oldest
    elif make_store.kind == "redis":  # the forgotten blocks' keys are gone, not left to TTL
        alive = store.client.keys(f"{store.tag(0)}b:*")
        assert len(alive) == sum(len(store.blocks(w)) for w in layout.windows_ms)


def test_redis_sketches_live_as_long_as_their_windows_blocks(
    redis_url: str, key_prefix: str
) -> None:
    """A 5-minute window's coverage sketches expire with its blocks, not after the
    longest window's lifetime (its 25-second buckets would pile up for two days)."""
    from evaluator.adapters.redis.store import RedisStore, connect
    from evaluator.core.windows import block_ttl_s

    layout = SETTINGS.layout()
    store = RedisStore(connect(redis_url), layout, prefix=key_prefix)
    store.check_layout()
    Driver(store).ingest(impressions(("r1", "u1", 1_000, ["a", "b"])), interactions())
    Driver(store).finalise(CONFIG.deadline(1_000))
    ttls: dict[int, list[int]] = {}
    for key in store.client.scan_iter(match=f"{{{key_prefix}:hcov}}:*"):
        window = int(key.decode().split("}:", 1)[1].split(":", 1)[0])
        ttls.setdefault(window, []).append(store.client.ttl(key))
    assert set(ttls) == set(layout.windows_ms)
    for window, found in ttls.items():
        assert all(0 < ttl <= block_ttl_s(window) for ttl in found), (window, found)
    store.close()


def test_regression_history_sums_each_slot_and_is_bounded_by_event_time(make_store) -> None:
    """The regression detector's history: per (hour, variant) each slot's requests,
    engaged requests and nDCG sums, summed over partitions, equal to what the
    checkpointed rows hold (whole numbers: exact in any order), and per (day, variant)
    the maturity curve's arrays (another shape); a partition's arrays that fell the
    history's length behind its newest are dropped (memory) or deleted (Redis), so a
    long run's history stays bounded."""
    from evaluator.core.maturity import maturity_increments
    from evaluator.core.regression import HOUR_MS, RegressionRules, row_columns, variant_codes
    from evaluator.core.regression import history_increments as sums

    layout = SETTINGS.layout()
    assert layout.history_keep_ms > 3 * 7 * 24 * HOUR_MS  # on by default
    store = make_store(layout)
    rules = RegressionRules(ks=layout.ks, slot_ms=layout.history_slot_ms)
    written: dict[tuple[int, str, int], np.ndarray] = {}
    step = 7 * HOUR_MS
    for n in range(4 * 7 * 24 * HOUR_MS // step):
        for p, variant in ((0, "A"), (1, "B"), (2, "A")):
            ts = n * step + 1_000 + 60_000 * p
            rid, user = f"r{n}-{p}", f"u{p}"
            owner = Driver(store, partition=p)
            clicks = [(f"c{n}-{p}", user, "b", rid, ts + 500, "click")] if n % 3 else []
            payload = impression(rid, user, ts, ["a", "b", "c"], variant=variant)
            owner.ingest(decode_impressions([payload])[0], interactions(*clicks))
            for done in owner.finalise(CONFIG.deadline(ts)):
                rows = done.rows[:, row_columns(layout.schema, layout.ks)]
                assert done.maturity is not None  # kept by default
                final = (rows[:, 2::2], rows[:, 1] > 0)
                codes = variant_codes(done.due.variant)
                added = sums(rules, done.deadline_ms, done.due.variant, rows)
                added |= maturity_increments(done.deadline_ms, codes, final, done.maturity)
                for (hour, v), array in added.items():
                    written[(hour, v, p)] = written.get((hour, v, p), 0) + array
    kept: dict[tuple[int, str], np.ndarray] = {}
    alive = 0
    for p in range(3):
        newest = max(hour for hour, _, q in written if q == p)
        for (hour, v, q), array in written.items():
            if q == p and hour >= newest - layout.history_keep_ms:
                kept[(hour, v)] = kept.get((hour, v), 0) + array
                alive += 1
    assert alive < len(written)  # some fell out of the history
    found = store.history(0)
    assert found.keys() == kept.keys()
    for key, array in kept.items():
        assert np.array_equal(found[key], array), key
    assert sum(float(a[:, 1].sum()) for a in found.values()) > 0  # engaged requests
    shapes = {a.shape for a in found.values()}
    assert len(shapes) == 2  # hours of slots, days of ages
    later = max(hour for hour, _ in kept) - 5 * 24 * HOUR_MS
    assert store.history(later).keys() == {k for k in kept if k[0] >= later}
    if make_store.kind == "memory":
        assert len(store._history) == alive
    elif make_store.kind == "redis":  # deleted by event time, not left to their TTL
        assert sum(len(store.client.keys(f"{store.tag(p)}rh:*")) for p in range(3)) == alive


def test_blocks_sum_every_owners_checkpoints_and_no_refused_one(make_store) -> None:
    """The window and experiment blocks equal the sum of what every written checkpoint's
    requests add, through one owner's checkpoints in a row (Redis: the owner adds to
    the totals it wrote last and sends the sums, ``adapters/redis/totals.py``), a
    new owner on another store object (another process: it reads the stored totals),
    and writes refused as stale or fenced (they add nothing, also to the owner's
    next write)."""
    layout = SETTINGS.layout()
    expected: dict[tuple[int, int, str], np.ndarray] = {}
    experiment: dict[str, np.ndarray] = {}

    def added(done: list[Finalised]) -> None:
        for d in done:
            for n in range(len(d)):
                variant = d.due.variant[n]
                at = (d.cohort[n], d.user_bucket[n])
                for window in layout.windows_ms:
                    start = int(layout.bucket_start(window, np.array([d.deadline_ms[n]]))[0])
                    key = (window, start, variant)
                    block = expected.setdefault(key, np.zeros((2, layout.user_buckets, 1)))
                    block[at] += d.rows[n, :1]
                block = experiment.setdefault(variant, np.zeros((2, layout.user_buckets, 1)))
                block[at] += d.rows[n, :1]

    def step(owner: Driver, n: int, expect: Outcome = Outcome.WRITTEN) -> None:
        """Requests of 3 users at one time, finalised in one checkpoint: no reload."""
        ts = 1_000 + 40_000 * n
        rows = [(f"r{n}-{u}", f"u{u}", ts + u, ["a", "b"]) for u in range(3)]
        owner.engine.ingest(impressions(*rows), interactions())
        owner.engine.watermark_ms = CONFIG.deadline(ts + 10)
        done = owner.engine.finalise_due()
        assert finalised(done) == 3
        delta, _ = owner.take(done)
        assert owner.store.checkpoint(owner.partition, owner.epoch, owner.seq, delta) is expect
        if expect is Outcome.WRITTEN:
            owner.seq += 1
            added(done)

    store = make_store(layout)
    first = Driver(store)
    for n in range(4):  # one owner, checkpoints in a row (some in the same buckets)
        step(first, n)
    # a new owner in another process (the embedded store is one process's own)
    second = Driver(store if make_store.kind == "memory" else make_store(layout))
    for n in range(4, 7):
        step(second, n)
    second.seq += 1  # as if a write the store did not get: refused as stale, adds nothing
    step(second, 7, Outcome.STALE)
    second.seq -= 1  # the same owner's next write, in sequence (no reload)
    step(second, 8)
    Driver(store)  # a newer owner: the second one's next write is fenced
    step(second, 9, Outcome.FENCED)
    third = Driver(store)  # the store that held the first owner's totals
    for n in range(10, 13):
        step(third, n)
    for window in layout.windows_ms:
        found = {(window, start, v): b[..., :1] for (start, v), b in store.blocks(window).items()}
        want = {k: v for k, v in expected.items() if k[0] == window}
        assert found.keys() == want.keys()
        for key, block in want.items():
            assert np.array_equal(found[key], block), key
    got = store.experiment_blocks("default")
    assert got.keys() == experiment.keys()
    for variant, block in experiment.items():
        assert np.array_equal(got[variant][..., :1], block)
    assert sum(float(b.sum()) for b in experiment.values()) == 3 * 11


def test_a_history_array_deleted_as_it_is_written_starts_again_from_zero(make_store) -> None:
    """A checkpoint whose history arrays lie further apart than the history's length
    deletes the older ones as it writes them (bounded by event time); one written
    again later holds only what came since (Redis: its owner does not add to the
    total it wrote and the script deleted)."""
    from evaluator.core.regression import HOUR_MS
    from evaluator.engine.commit_payload import history_name, history_shape

    layout = SETTINGS.layout()
    store = make_store(layout)
    owner = Driver(store)
    shape = history_shape(layout, history_name(layout, (0, "A")))
    old, new = HOUR_MS, (layout.history_keep_ms // HOUR_MS + 3) * HOUR_MS

    def write(provisional: dict) -> None:
        delta = Delta({}, {}, {}, {}, new, 0, new, [], provisional=provisional)
        assert store.checkpoint(0, owner.epoch, owner.seq, delta) is Outcome.WRITTEN
        owner.seq += 1

    write({(old, "A"): np.ones(shape), (new, "A"): np.ones(shape)})
    assert store.history(0).keys() == {(new, "A")}
    write({(old, "A"): np.full(shape, 2.0)})
    found = store.history(0)
    assert found.keys() == {(old, "A"), (new, "A")}
    assert np.array_equal(found[(old, "A")], np.full(shape, 2.0))
    assert np.array_equal(found[(new, "A")], np.ones(shape))


def test_two_writes_of_a_partition_in_one_call_both_count(make_store) -> None:
    """``checkpoint_many`` with a partition's two checkpoints in sequence: the second
    adds to the first (Redis: to the totals the first computed)."""
    store = make_store(SETTINGS.layout())
    owner = Driver(store)
    writes = []
    for n in range(2):
        ts = 1_000 + n
        owner.engine.ingest(impressions((f"r{n}", f"u{n}", ts, ["a"])), interactions())
        owner.engine.watermark_ms = CONFIG.deadline(ts)
        delta, _ = owner.take(owner.engine.finalise_due())
        assert finalised(delta.finalised) == 1
        writes.append(PartitionWrite(0, owner.epoch, owner.seq + n, delta))
    assert store.checkpoint_many(writes) == [Outcome.WRITTEN, Outcome.WRITTEN]
    window = max(SETTINGS.layout().windows_ms)
    blocks = store.blocks(window)
    assert sum(float(b[..., 0].sum()) for b in blocks.values()) == 2
    assert sum(float(b[..., 0].sum()) for b in store.experiment_blocks("default").values()) == 2
