"""One contract for every state store (embedded and Redis), run against each."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from evaluator.config import load_settings
from evaluator.events import decode_impressions, decode_interactions
from evaluator.finalise import finalise
from evaluator.relevance import BUILTIN_PROFILES
from evaluator.stores.base import PartitionProgress
from evaluator.windows import shard_of

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


def ingest(store, imps, ints, late_before=-(2**62)):
    deadlines = [CONFIG.deadline(ts) for ts in imps.timestamp_ms]
    return store.ingest(imps, ints, deadlines, late_before)


def finalise_all(store, watermark: int) -> int:
    due = store.due(watermark, 1000)
    requests, users = store.load(due)
    return store.commit(finalise(requests, users, CONFIG))


def test_ingest_is_idempotent_and_counts_duplicates(make_store) -> None:
    store = make_store(SETTINGS.layout())
    imps = impressions(("r1", "u1", 1_000, ["a", "b"]))
    ints = interactions(("i1", "u1", "b", "r1", 2_000, "click"))
    assert ingest(store, imps, ints).duplicates == 0
    assert ingest(store, imps, ints).duplicates == 2
    assert store.due(CONFIG.deadline(1_000) - 1, 10) == []
    due = store.due(CONFIG.deadline(1_000), 10)
    assert [d.request_id for d in due] == ["r1"]
    requests, users = store.load(due)
    assert [(r.request_id, r.items, len(r.interactions)) for r in requests] == [
        ("r1", ["a", "b"], 1)
    ]
    assert users["u1"].history_ms == [2_000]


def test_commit_claims_each_request_once(make_store) -> None:
    store = make_store(SETTINGS.layout())
    ingest(
        store,
        impressions(("r1", "u1", 1_000, ["a"]), ("r2", "u2", 1_000, ["a"])),
        interactions(("i1", "u1", "a", "r1", 1_500, "purchase")),
    )
    due = store.due(CONFIG.deadline(1_000), 10)
    requests, users = store.load(due)
    done = finalise(requests, users, CONFIG)
    assert store.commit(done) == 2
    assert store.commit(done) == 0  # a racing instance, or a retry after a crash
    assert store.due(10**15, 10) == []
    assert store.counters()["finalised"] == 2
    blocks = store.blocks(max(SETTINGS.layout().windows_ms))
    assert sum(b[:, :, 0].sum() for b in blocks.values()) == 2  # two requests counted
    assert sum(b[:, :, 1].sum() for b in blocks.values()) == 1  # one engaged


@pytest.mark.parametrize("sizes", [["5m", "1h", "24h"], ["7m", "1h"]])
def test_longer_windows_hold_the_union_of_their_buckets(make_store, sizes) -> None:
    """Requests finalised in several short buckets, in separate commits, all count in
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
        ingest(store, impressions((f"r{n}", f"u{n}", ts, lists[f"r{n}"])), interactions())
        requests, users = store.load(store.due(config.deadline(ts), 10))
        assert store.commit(finalise(requests, users, config)) == 1
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
    ingest(
        store,
        impressions(*((rid, f"u{rid}", 1_000, items) for rid, items in lists.items())),
        interactions(),
    )
    requests, users = store.load(store.due(config.deadline(1_000), 10))
    assert store.commit(finalise(requests, users, config)) == 3
    window = max(layout.windows_ms)
    start = int(layout.bucket_start(window, np.array([config.deadline(1_000)]))[0])
    counts, catalogue = store.distinct_items(window, [start], ["A"])
    assert counts[("A", 3)] == pytest.approx(7, abs=0.5)  # a b c f g h i
    assert catalogue == pytest.approx(10, abs=0.5)  # a..j


def test_interaction_arriving_between_load_and_commit_is_late(make_store) -> None:
    """Finalisation may run beside ingestion (another instance, or another thread):
    an interaction stored after the request was loaded is counted late, once."""
    store = make_store(SETTINGS.layout())
    ingest(
        store,
        impressions(("r1", "u1", 1_000, ["a", "b"])),
        interactions(("i1", "u1", "a", "r1", 1_500, "click")),
    )
    requests, users = store.load(store.due(CONFIG.deadline(1_000), 10))
    racing = interactions(("i2", "u1", "b", "r1", 1_600, "purchase"))
    assert ingest(store, impressions(), racing).late == 0  # still open when it arrived
    done = finalise(requests, users, CONFIG)
    assert store.commit(done) == 1
    assert store.counters().get("late", 0) == 1
    assert done.late == 1  # reported to the pipeline's late counter too
    again = ingest(store, impressions(), racing)  # redelivered: a duplicate now
    assert (again.late, again.duplicates) == (0, 1)
    assert store.counters().get("late", 0) == 1


def test_commit_skips_requests_another_instance_claimed(make_store) -> None:
    store = make_store(SETTINGS.layout())
    ingest(
        store,
        impressions(
            ("r1", "u1", 1_000, ["a"]), ("r2", "u1", 1_000, ["a"]), ("r3", "u2", 1_000, ["b"])
        ),
        interactions(("i1", "u1", "a", "r1", 1_500, "purchase")),
    )
    requests, users = store.load(store.due(CONFIG.deadline(1_000), 10))
    by_id = {r.request_id: r for r in requests}
    assert store.commit(finalise([by_id["r2"]], users, CONFIG)) == 1  # the other instance
    assert store.commit(finalise(requests, users, CONFIG)) == 2  # r1 and r3 only
    assert store.counters()["finalised"] == 3
    blocks = store.blocks(max(SETTINGS.layout().windows_ms))
    assert sum(b[:, :, 0].sum() for b in blocks.values()) == 3
    assert sum(b[:, :, 1].sum() for b in blocks.values()) == 1


def test_late_interactions_are_counted_once(make_store) -> None:
    store = make_store(SETTINGS.layout())
    ingest(store, impressions(("r1", "u1", 1_000, ["a"])), interactions())
    finalise_all(store, CONFIG.deadline(1_000))
    late = interactions(("i9", "u1", "a", "r1", 1_500, "click"))
    assert ingest(store, impressions(), late).late == 1
    assert ingest(store, impressions(), late).late == 0  # redelivered: a duplicate now
    again = impressions(("r1", "u1", 1_000, ["a"]))
    assert ingest(store, again, interactions()).duplicates == 1  # finalised request
    loose = interactions(("i10", "u1", "a", None, 1_500, "click"))
    assert ingest(store, impressions(), loose, late_before=2_000).late == 1
    assert store.counters()["late"] == 2


def test_history_keeps_the_earliest_relevant_interactions(make_store) -> None:
    """Cold start needs each user's first N relevant interactions, whatever order and
    batches they arrive in, redeliveries included."""
    store = make_store(SETTINGS.layout())
    cap = SETTINGS.cold_start.min_relevant_history
    batches = [[5_000, 4_000], [3_000, 6_000], [1_000], [3_000], [2_000, 7_000]]
    for times in batches:
        rows = [(f"h{ts}", "u1", "a", None, ts, "click") for ts in times]
        ingest(store, impressions(), interactions(*rows))
    ingest(store, impressions(("r1", "u1", 9_000, ["a"])), interactions())
    _, users = store.load(store.due(CONFIG.deadline(9_000), 10))
    assert users["u1"].history_ms == [1_000, 2_000, 3_000, 4_000, 5_000, 6_000, 7_000][:cap]


@pytest.mark.parametrize("seed", range(3))
def test_history_from_single_interaction_batches(make_store, seed) -> None:
    """One interaction per batch, mostly in event-time order with ties and redeliveries
    (the path appending to a stored history without re-sorting it), keeps the same
    earliest ones as sorting everything would."""
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
        ingest(store, impressions(), interactions(row))
    ingest(store, impressions(("r1", "u1", 9_000, ["a"])), interactions())
    _, users = store.load(store.due(CONFIG.deadline(9_000), 10))
    assert users["u1"].history_ms == sorted(sent.values())[:cap]


def test_interactions_before_their_impression_wait_for_it(make_store) -> None:
    store = make_store(SETTINGS.layout())
    early = interactions(("i1", "u1", "b", "r1", 1_500, "purchase"))
    assert ingest(store, impressions(), early).duplicates == 0
    assert store.due(10**15, 10) == []  # nothing open yet
    ingest(store, impressions(("r1", "u1", 1_000, ["a", "b"])), interactions())
    assert ingest(store, impressions(), early).duplicates == 1
    requests, users = store.load(store.due(CONFIG.deadline(1_000), 10))
    assert [(r.request_id, [i.event_id for i in r.interactions]) for r in requests] == [
        ("r1", ["i1"])
    ]
    assert store.commit(finalise(requests, users, CONFIG)) == 1
    counts = ingest(store, impressions(), early)
    assert (counts.late, counts.duplicates) == (0, 1)


def test_late_interactions_find_requests_finalised_days_apart(make_store) -> None:
    """Finalised requests are remembered whatever their deadline: late interactions
    naming requests finalised a week apart are each counted once."""
    store = make_store(SETTINGS.layout())
    week = 7 * 86_400_000
    ingest(
        store,
        impressions(("r1", "u1", 1_000, ["a"]), ("r2", "u2", 1_000 + week, ["a"])),
        interactions(),
    )
    finalise_all(store, CONFIG.deadline(1_000 + week))
    late = interactions(
        ("i1", "u1", "a", "r1", 1_500, "click"), ("i2", "u2", "a", "r2", 1_500 + week, "click")
    )
    assert ingest(store, impressions(), late).late == 2
    assert ingest(store, impressions(), late).duplicates == 2
    again = impressions(("r1", "u1", 1_000, ["a"]), ("r2", "u2", 1_000 + week, ["a"]))
    assert ingest(store, again, interactions()).duplicates == 2
    assert store.due(10**15, 10) == []


def test_redelivery_after_finalisation_is_a_duplicate_not_late(make_store) -> None:
    """At-least-once delivery after a crash: events applied before their request was
    finalised (or pruned afterwards) must not be counted as late when they come again."""
    store = make_store(SETTINGS.layout())
    imps = impressions(("r1", "u1", 1_000, ["a", "b"]))
    ints = interactions(
        ("i1", "u1", "a", "r1", 1_500, "click"), ("i2", "u1", "b", None, 1_600, "click")
    )
    ingest(store, imps, ints)
    due = store.due(CONFIG.deadline(1_000), 10)
    requests, users = store.load(due)
    # prune the request-less interaction with the commit, as the pipeline does later on
    assert store.commit(finalise(requests, users, CONFIG), 2_000) == 1
    counts = ingest(store, imps, ints, late_before=2_000)
    assert (counts.late, counts.duplicates) == (0, 3)
    assert store.counters().get("late", 0) == 0


def test_user_join_sees_the_users_open_impressions(make_store) -> None:
    store = make_store(SETTINGS.layout())
    ingest(
        store,
        impressions(("r1", "u1", 1_000, ["a", "b"]), ("r2", "u1", 2_000, ["b", "c"])),
        interactions(("i1", "u1", "b", None, 2_500, "click")),
    )
    requests, users = store.load(store.due(CONFIG.deadline(2_000), 10))
    ctx = users["u1"]
    assert ctx.impression_ids == ["r1", "r2"]
    assert ctx.impression_items == [["a", "b"], ["b", "c"]]
    assert [(x.event_id, x.item_id, x.timestamp_ms, x.grade) for x in ctx.loose] == [
        ("i1", "b", 2_500, 1.0)
    ]
    done = finalise(requests, users, CONFIG)
    engaged = {r.request_id: row[1] for r, row in zip(done.requests, done.rows, strict=True)}
    assert engaged == {"r1": 0.0, "r2": 1.0}  # the most recent impression with the item wins


def test_user_join_ignores_what_cannot_reach_the_loaded_requests(make_store) -> None:
    """Request-less interactions outside every loaded request's window, and open
    requests that cannot compete for the others, change nothing (the Redis store
    leaves them out of the context)."""
    store = make_store(SETTINGS.layout())
    window = CONFIG.rules.attribution_window_ms
    later = 1_000 + 3 * window
    ingest(
        store,
        impressions(("r1", "u1", 1_000, ["a", "b"]), ("r2", "u1", later, ["a", "b"])),
        interactions(
            ("i1", "u1", "b", None, 2_000, "click"),  # joins r1
            ("i2", "u1", "a", None, later + 1_000, "purchase"),  # joins r2 only
        ),
    )
    requests, users = store.load(store.due(CONFIG.deadline(1_000), 10))
    assert [r.request_id for r in requests] == ["r1"]
    assert "i1" in {x.event_id for x in users["u1"].loose}
    done = finalise(requests, users, CONFIG)
    assert done.rows[0][1] == 1.0  # engaged, by the click on b only
    assert done.outcomes["attributed"] == 1


def test_progress_merges_to_the_latest_event_time(make_store) -> None:
    store = make_store(SETTINGS.layout())
    store.record_progress({"impressions:0": PartitionProgress(500, 10)})
    store.record_progress(
        {"impressions:0": PartitionProgress(400, 20), "impressions:1": PartitionProgress(-1, 20)}
    )
    assert store.progress() == {
        "impressions:0": PartitionProgress(500, 20),
        "impressions:1": PartitionProgress(-1, 20),
    }


def test_redis_refuses_state_of_another_layout(redis_url: str, key_prefix: str) -> None:
    from evaluator.stores.redis import LayoutMismatchError, RedisStore, connect

    RedisStore(connect(redis_url), SETTINGS.layout(), prefix=key_prefix).check_layout()
    other = load_settings(environ={}, overrides={"metrics": {"k": [5]}}).layout()
    with pytest.raises(LayoutMismatchError):
        RedisStore(connect(redis_url), other, prefix=key_prefix).check_layout()


def test_distinct_items_for_coverage(make_store) -> None:
    store = make_store(SETTINGS.layout())
    ingest(
        store,
        impressions(("r1", "u1", 1_000, ["a", "b", "c"]), ("r2", "u2", 1_000, ["c", "d"])),
        interactions(),
    )
    finalise_all(store, CONFIG.deadline(1_000))
    window = max(SETTINGS.layout().windows_ms)
    start = int(SETTINGS.layout().bucket_start(window, np.array([CONFIG.deadline(1_000)]))[0])
    counts, catalog = store.distinct_items(window, [start], ["A"])
    assert counts[("A", 10)] == pytest.approx(4, abs=0.5)
    assert catalog == pytest.approx(4, abs=0.5)


def test_distinct_items_per_variant_cutoff_and_window(make_store) -> None:
    """Top-k cuts, variants and every window keep their own item sets."""
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
    ingest(store, decode_impressions(payloads)[0], interactions())
    finalise_all(store, CONFIG.deadline(1_000))
    for window in layout.windows_ms:
        start = int(layout.bucket_start(window, np.array([CONFIG.deadline(1_000)]))[0])
        counts, catalog = store.distinct_items(window, [start], ["A", "B"])
        want = {
            ("A", 10): len(set(a1[:10]) | set(a2[:10])),
            ("A", 20): len(set(a1) | set(a2)),
            ("B", 10): 4,
            ("B", 20): 4,
        }
        for key, n in want.items():
            assert counts[key] == pytest.approx(n, abs=0.5), (window, key)
        assert catalog == pytest.approx(len(set(a1) | set(a2) | set(b1)), abs=0.5)


def stored_request(store, **extra):
    """Ingest one impression with extra fields and load it back as the store returns it."""
    payload = impression("r", "u", 1_000, ["a", "b"], variant="B", **extra)
    ingest(store, decode_impressions([payload])[0], interactions())
    requests, _ = store.load(store.due(CONFIG.deadline(1_000), 10))
    assert len(requests) == 1
    return requests[0]


def test_attribute_values_round_trip(make_store) -> None:
    request = stored_request(
        make_store(SETTINGS.layout()), item_attributes={"category": ["x", "y"]}
    )
    assert request.attributes == ["x", "y"]


def test_shadow_ranking_round_trips(make_store) -> None:
    request = stored_request(make_store(SETTINGS.layout()), shadow={"A": ["b", "c"]})
    assert (request.shadow_variant, request.shadow) == ("A", ["b", "c"])


def test_blocks_reflect_every_commit_between_reads(make_store) -> None:
    store = make_store(SETTINGS.layout())
    window = max(SETTINGS.layout().windows_ms)
    totals = []
    for n, ts in enumerate((1_000, 1_500, 2_000), start=1):
        ingest(store, impressions((f"r{n}", f"u{n}", ts, ["a"])), interactions())
        finalise_all(store, CONFIG.deadline(ts))
        blocks = store.blocks(window, 0, CONFIG.deadline(10_000))
        totals.append(sum(float(b[..., 0].sum()) for b in blocks.values()))
    assert totals == [1.0, 2.0, 3.0]
    assert store.blocks(window, 10**14, 10**15) == {}


def test_propensity_counters_follow_claims_and_survive_recommits(make_store) -> None:
    """Counters are written with the claim: a retried or racing commit adds nothing."""
    config = load_settings(environ={}, overrides={"propensity": {"estimator": "em"}})
    fconfig = config.finalise_config()
    store = make_store(config.layout())
    payloads = [
        impression(rid, user, 1_000, ["a", "b", "c"], context="home", randomization=rnd)
        for rid, user, rnd in (("r1", "u1", None), ("r2", "u2", {"type": "topn", "n": 3}))
    ]
    imps = decode_impressions(payloads)[0]
    ints = interactions(
        ("i1", "u1", "b", "r1", 1_500, "click"), ("i2", "u2", "a", "r2", 1_500, "purchase")
    )
    ingest(store, imps, ints)
    requests, users = store.load(store.due(fconfig.deadline(1_000), 10))
    assert {r.request_id: (r.context, r.randomization) for r in requests} == {
        "r1": ("home", None),
        "r2": ("home", ("topn", 3)),
    }
    done = finalise(requests, users, fconfig)
    assert store.commit(done) == 2
    assert store.commit(done) == 0
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
    config = load_settings(
        environ={}, overrides={"propensity": {"estimator": "em", "history": "2d"}}
    )
    fconfig = config.finalise_config()
    store = make_store(config.layout(), propensity_history_ms=2 * day)
    base = 20_000 * day - fconfig.deadline(0) + 1_000  # deadlines 1 s into a day

    def finalise_one(n: int, ts: int) -> dict[str, int]:
        ingest(store, impressions((f"r{n}", f"u{n}", ts, [f"item{n}"])), interactions())
        requests, users = store.load(store.due(fconfig.deadline(ts), 10))
        assert store.commit(finalise(requests, users, fconfig)) == 1
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


def test_redis_refuses_open_requests_of_the_per_request_key_format(
    redis_url: str, key_prefix: str
) -> None:
    from evaluator.stores.redis import LayoutMismatchError, RedisStore, connect

    client = connect(redis_url)
    store = RedisStore(client, SETTINGS.layout(), prefix=key_prefix)
    store.check_layout()  # empty, or written by this version: fine
    ingest(store, impressions(("r1", "u1", 1_000, ["a"])), interactions())
    store.check_layout()
    shard = store.tag(3)
    client.zadd(shard + "dl", {"old": 5})  # as the earlier version stored a request
    client.set(shard + "r:old", "u9\x1eA\x1e1\x1ea")
    with pytest.raises(LayoutMismatchError, match="one key per request"):
        store.check_layout()
    store.close()


def test_redis_markers_live_for_the_configured_ttls(redis_url: str, key_prefix: str) -> None:
    from evaluator.stores.redis import MARKER_PERIOD_MS, RedisStore, connect

    client = connect(redis_url)
    store = RedisStore(
        client, SETTINGS.layout(), prefix=key_prefix, state_ttl_s=5_000, finalised_ttl_s=7_200
    )
    ingest(store, impressions(("r1", "u1", 1_000, ["a"])), interactions())
    shard = store.tag(int(shard_of(["u1"], SETTINGS.layout())[0]))
    assert 4_900 < client.ttl(shard + "o") <= 5_000  # open requests
    requests, users = store.load(store.due(CONFIG.deadline(1_000), 10))
    assert store.commit(finalise(requests, users, CONFIG)) == 1
    period = CONFIG.deadline(1_000) // MARKER_PERIOD_MS * MARKER_PERIOD_MS
    assert client.hexists(shard + f"fin:{period}", "r1")  # markers by period of the deadline
    assert 7_100 < client.ttl(shard + f"fin:{period}") <= 7_200
    late = interactions(("i9", "u1", "a", None, 500, "click"))
    assert ingest(store, impressions(), late, late_before=10_000).late == 1
    assert 7_100 < client.ttl(shard + "ux:u1") <= 7_200
    store.close()


def test_redis_scripts_are_reloaded_after_a_script_flush(redis_url: str, key_prefix: str) -> None:
    """After a restart or failover the server may have lost the scripts: the batch fails
    once (the caller retries it; every script is idempotent) and then works again."""
    from redis.exceptions import NoScriptError

    from evaluator.stores.redis import RedisStore, connect

    client = connect(redis_url)
    store = RedisStore(client, SETTINGS.layout(), prefix=key_prefix)
    imps = impressions(("r1", "u1", 1_000, ["a"]))
    client.script_flush()
    with pytest.raises(NoScriptError):
        ingest(store, imps, interactions())
    assert ingest(store, imps, interactions()).duplicates == 0
    assert [d.request_id for d in store.due(CONFIG.deadline(1_000), 10)] == ["r1"]
    store.close()


def test_redis_coverage_survives_a_failure_between_sketches_and_claims(
    redis_url: str, key_prefix: str
) -> None:
    """Sketches are sets, so the commit adds the items before claiming the requests: a
    failure in between leaves them open, finalising them again adds nothing twice, and
    no item is lost (added after the claim, a failure there lost them for good)."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from evaluator.stores.redis import RedisStore, connect

    store = RedisStore(connect(redis_url), SETTINGS.layout(), prefix=key_prefix)
    lists = {"r1": ["a", "b", "c"], "r2": ["c", "d"]}
    rows = [(rid, f"u{i}", 1_000, items) for i, (rid, items) in enumerate(lists.items())]
    ingest(store, impressions(*rows), interactions())
    add = store._sketches.add
    calls: list[int] = []

    def failing_once(finalised) -> None:
        calls.append(len(finalised.requests))
        if len(calls) == 1:
            raise RedisConnectionError("injected: Redis went away")
        add(finalised)

    store._sketches.add = failing_once  # type: ignore[method-assign]
    with pytest.raises(RedisConnectionError):
        finalise_all(store, CONFIG.deadline(1_000))
    assert finalise_all(store, CONFIG.deadline(1_000)) == 2  # still open: finalised now
    assert calls == [2, 2]
    window = max(SETTINGS.layout().windows_ms)
    start = int(SETTINGS.layout().bucket_start(window, np.array([CONFIG.deadline(1_000)]))[0])
    counts, catalog = store.distinct_items(window, [start], ["A"])
    assert counts[("A", 10)] == pytest.approx(4, abs=0.5)
    assert catalog == pytest.approx(4, abs=0.5)
    store.close()
