"""The live path (partition tasks and engines) agrees with `evaluator replay` on the
same events, on every store."""

from __future__ import annotations

import numpy as np
import pytest

from evaluator.adapters.memory import MemoryStore
from evaluator.config import load_settings
from evaluator.config.plain import tasks_config
from evaluator.engine.tasks import Tasks
from tests.eventgen import EventSet, generate
from tests.livecheck import FakeClock, compare_with_replay, expected_late, feed

PARTITIONS = 3


def tasks_on(store, settings, write_behind: bool = False) -> Tasks:
    tasks = Tasks(
        store, tasks_config(settings, PARTITIONS), clock_ms=FakeClock(), write_behind=write_behind
    )
    tasks.assign(range(PARTITIONS))
    return tasks


@pytest.mark.parametrize(
    ("seed", "write_behind", "follow"),
    [(21, False, True), (22, False, True), (21, True, True), (21, False, False)],
)
def test_live_path_equals_replay(
    tmp_path, make_store, seed: int, write_behind: bool, follow: bool
) -> None:
    """Keyed producers (``trust``): every partition on its own event time; checkpoints
    written before each poll returns, or behind it (as ``evaluator run`` does); the
    wall clock following the data (a checkpoint each poll), or a backlog consumed in
    a few milliseconds (many polls behind one checkpoint)."""
    event_time = {"max_out_of_orderness": "5s", "max_future": "1m" if follow else 0}
    settings = load_settings(
        environ={},
        overrides={"event_time": event_time, "kafka": {"partitioner": "trust"}},
    )
    store = make_store(settings.layout(PARTITIONS))
    tasks = tasks_on(store, settings, write_behind)
    events = generate(seed)
    seen_at = feed(tasks, events, seed, follow=follow)
    compare_with_replay(store, events, settings, tmp_path)
    # Interactions naming a request whose deadline the watermark had passed are late;
    # replay finds them outside the attribution window, so the aggregates agree regardless.
    assert tasks.stats.late == expected_late(events, settings, seen_at)
    assert tasks.stats.late > 0
    assert store.counters()["late"] == tasks.stats.late


def test_no_cold_start_history_needed(tmp_path) -> None:
    """``cold_start.min_relevant_history = 0``: every user is established, live as in
    replay (the live engine kept a history of size 0 and crashed on its last entry)."""
    settings = load_settings(
        environ={},
        overrides={"cold_start": {"min_relevant_history": 0}, "kafka": {"partitioner": "trust"}},
    )
    store = MemoryStore(settings.layout(PARTITIONS))
    tasks = tasks_on(store, settings)
    events = generate(23)
    feed(tasks, events, 23)
    report = compare_with_replay(store, events, settings, tmp_path)
    cohorts = report["variants"]["A"]["cohorts"]
    assert cohorts["cold_start"]["requests"] == 0 and cohorts["established"]["requests"] > 0


def test_redelivery_changes_nothing(make_store) -> None:
    settings = load_settings(environ={})
    events = generate(3)
    once = make_store(settings.layout(PARTITIONS))
    feed(tasks_on(once, settings), events, 3)
    twice = make_store(settings.layout(PARTITIONS))
    doubled = EventSet(events.impressions * 2, events.interactions * 2)
    feed(tasks_on(twice, settings), doubled, 3)
    for window in settings.layout().windows_ms:
        a, b = once.blocks(window), twice.blocks(window)
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(a[key], b[key], atol=1e-9)


def test_events_on_the_wrong_partition_are_forwarded_to_their_users(tmp_path) -> None:
    """Producers that do not key by user (round robin): every event reaches its user's
    partition through forwarding, and the results equal replay exactly."""
    settings = load_settings(environ={})
    store = MemoryStore(settings.layout(PARTITIONS))
    tasks = tasks_on(store, settings)
    events = generate(23)
    feed(tasks, events, 23, keyed=False)
    assert tasks.stats.repartitioned > len(events.impressions)  # most went elsewhere
    compare_with_replay(store, events, settings, tmp_path)


def test_an_untagged_repartition_payload_is_counted_not_dropped() -> None:
    from evaluator.engine.batches import PartitionBatch
    from evaluator.engine.partitioner import PartitionOf
    from evaluator.engine.routing import Decoder

    settings = load_settings(environ={})
    decoder = Decoder(PartitionOf("murmur2", 3), settings.relevance.active())
    tagged = b"I" + b"{oops"  # an impression tag on an undecodable payload
    batch = PartitionBatch("repartition", "repartition:1", [b"?{}", tagged], [7, 8])
    routed = decoder.route(batch, 0, 1)
    assert [(r.offset, r.event.reason.value) for r in routed.rejected] == [
        (7, "undecodable"),
        (8, "undecodable"),
    ]
    # dead-lettered as read from the repartition topic, a tagged one without its tag
    assert {r.partition for r in routed.rejected} == {"repartition:1"}
    assert [r.payload for r in routed.rejected] == [b"?{}", b"{oops"]


@pytest.mark.parametrize("write_behind", [False, True])
def test_a_failed_checkpoint_drops_its_partition_and_nothing_writes_it_later(
    tmp_path, make_store, write_behind: bool
) -> None:
    """A poll's checkpoints that raise have taken their changes already: their
    partitions are dropped (any of the writes may or may not have landed), so a
    later flush (a clean stop) or revocation cannot write their offsets without them;
    a new owner resumes from the last checkpoint and the results equal replay.
    Written behind, the error surfaces at the next poll."""
    settings = load_settings(environ={}, overrides={"kafka": {"partitioner": "trust"}})
    store = make_store(settings.layout(PARTITIONS))
    events = generate(24)
    original = store.checkpoint_many
    written: list[int] = []
    failed: set[int] = set()

    def failing(writes):
        """The first call after four writes: the writes before its last land, then the
        store goes away."""
        written.extend(w.partition for w in writes)
        if not failed and len(written) > 4:
            failed.update(w.partition for w in writes)
            original(writes[:-1])
            raise ConnectionError("injected: the store went away")
        return original(writes)

    store.checkpoint_many = failing
    tasks = tasks_on(store, settings, write_behind)
    with pytest.raises(ConnectionError):
        feed(tasks, events, 24)
    lost = tasks.take_dropped()
    assert lost == failed and len(lost) > 1 and not lost & set(tasks.owned)
    assert len(tasks.owned) == PARTITIONS - len(lost)
    before = {p: written.count(p) for p in lost}
    tasks.flush()
    tasks.revoke(range(PARTITIONS))
    assert {p: written.count(p) for p in lost} == before  # never again
    assert tasks.owned == {}
    store.checkpoint_many = original
    # a new owner of every partition consumes again from the stored offsets
    fresh = tasks_on(store, settings)
    feed(fresh, events, 24)
    compare_with_replay(store, events, settings, tmp_path)


@pytest.mark.parametrize("write_behind", [False, True])
def test_offsets_committed_to_kafka_are_those_the_store_accepted(
    make_store, write_behind: bool
) -> None:
    """``evaluator run`` commits each partition's ``durable`` offsets to Kafka (for lag
    monitoring and tools): after every poll they are the offsets of a checkpoint the
    store accepted, never of one still in flight or refused (a newer owner claimed the
    partition), and the latest accepted once the writes are settled."""
    import json
    from collections import defaultdict

    from evaluator.engine.batches import PartitionBatch
    from evaluator.engine.checkpoint import Outcome
    from tests.livecheck import partition_of

    settings = load_settings(environ={}, overrides={"kafka": {"partitioner": "trust"}})
    store = make_store(settings.layout(PARTITIONS))
    original = store.checkpoint_many
    accepted: dict[int, list[dict[str, int]]] = {p: [{}] for p in range(PARTITIONS)}
    refused: list[int] = []

    def recording(writes):
        outcomes = original(writes)
        for w, outcome in zip(writes, outcomes, strict=True):
            if outcome is Outcome.WRITTEN:
                accepted[w.partition].append(dict(w.delta.offsets))
            else:
                refused.append(w.partition)
        return outcomes

    store.checkpoint_many = recording
    tasks = tasks_on(store, settings, write_behind)
    held = dict(tasks.owned)
    events = generate(25)
    stream = [("impressions", e) for e in events.impressions] + [
        ("interactions", e) for e in events.interactions
    ]
    stream.sort(key=lambda ke: ke[1]["timestamp"])
    offsets: dict[str, int] = defaultdict(int)
    chunks = range(0, len(stream), 16)
    for poll, start in enumerate(chunks):
        if poll == len(chunks) // 2:  # a newer owner claims partition 0
            Tasks(store, tasks_config(settings, PARTITIONS), clock_ms=FakeClock()).assign([0])
        parts: dict[str, list[bytes]] = defaultdict(list)
        for kind, e in stream[start : start + 16]:
            p = partition_of(e["user_id"], PARTITIONS)
            if p in tasks.owned:  # a lost partition is paused
                parts[f"{kind}:{p}"].append(json.dumps(e).encode())
        batches = []
        for name, payloads in parts.items():
            first = offsets[name]
            offsets[name] += len(payloads)
            batches.append(
                PartitionBatch(
                    name.split(":")[0], name, payloads, range(first, first + len(payloads))
                )  # type: ignore[arg-type]
            )
        newest = max(e["timestamp"] for _, e in stream[start : start + 16])
        clock = tasks.clock_ms
        clock.now = max(clock.now, newest)  # type: ignore[attr-defined]: live, after the data
        tasks.apply(batches, {})
        tasks.clock_ms.now += 1_000  # type: ignore[attr-defined]: a checkpoint each poll
        for p, owned in held.items():
            assert owned.durable in accepted[p]
            assert all(owned.durable[k] <= owned.offsets[k] for k in owned.durable)
    tasks.settle()
    assert refused and set(refused) == {0} and 0 not in tasks.owned
    for p, owned in held.items():
        assert owned.durable == accepted[p][-1]
        assert len(accepted[p]) > 5  # several checkpoints, each checked


@pytest.mark.parametrize("write_behind", [False, True])
def test_a_partition_fenced_then_assigned_again_is_neither_paused_nor_reloaded(
    make_store, write_behind: bool
) -> None:
    """A zombie's checkpoint is refused while the group takes the partition away; the
    group then gives it back and this member claims it anew: ``apply`` must not report
    it as fenced (``evaluator run`` would pause the partition it now owns, for good)."""
    import json

    from evaluator.engine.batches import PartitionBatch

    settings = load_settings(environ={}, overrides={"kafka": {"partitioner": "trust"}})
    store = make_store(settings.layout(1))
    tasks = Tasks(store, tasks_config(settings, 1), clock_ms=FakeClock(), write_behind=write_behind)
    tasks.assign([0])

    def impression(n: int) -> PartitionBatch:
        event = {"event_id": f"e{n}", "request_id": f"r{n}", "user_id": "u", "variant": "v"}
        payload = json.dumps({**event, "timestamp": 1_000 + n, "items": ["a", "b"]}).encode()
        return PartitionBatch("impressions", "impressions:0", [payload], range(n, n + 1))

    tasks.apply([impression(0)], {})
    tasks.settle()
    Tasks(store, tasks_config(settings, 1), clock_ms=FakeClock()).assign([0])  # a newer owner
    tasks.clock_ms.now += 1_000  # type: ignore[attr-defined]: a checkpoint at this poll
    tasks.apply([impression(1)], {})  # its checkpoint is refused (now, or when settled)
    tasks.revoke([0])  # the group moved the partition away...
    tasks.assign([0])  # ...and back to this member
    assert list(tasks.owned) == [0]
    assert tasks.apply([], {}) == ([], [])


def test_at_the_end_of_its_inputs_a_partition_checkpoints_once_an_interval(make_store) -> None:
    """Keeping up with live traffic, each poll brings a few events and the broker says
    the partition is at its end: it checkpoints every ``engine.checkpoint_interval``
    (1 s), not after every poll (a checkpoint's fixed cost, paid ~8 times a second),
    and what it checkpoints is everything consumed up to then."""
    import json

    from evaluator.engine.batches import PartitionBatch

    settings = load_settings(environ={}, overrides={"kafka": {"partitioner": "trust"}})
    store = make_store(settings.layout(1))
    written: list[dict[str, int]] = []
    original = store.checkpoint_many

    def recording(writes):
        written.extend(dict(w.delta.offsets) for w in writes)
        return original(writes)

    store.checkpoint_many = recording
    tasks = Tasks(store, tasks_config(settings, 1), clock_ms=FakeClock(1_000_000))
    tasks.assign([0])
    for n in range(50):  # 5 s of polls 100 ms apart, one impression each
        event = {"event_id": f"e{n}", "request_id": f"r{n}", "user_id": "u", "variant": "v"}
        payload = json.dumps({**event, "timestamp": 1_000_000 + 100 * n, "items": ["a"]})
        batch = PartitionBatch("impressions", "impressions:0", [payload.encode()], range(n, n + 1))
        now = tasks.clock_ms.now  # type: ignore[attr-defined]
        tasks.apply([batch], {"impressions:0": now, "interactions:0": now})
        tasks.clock_ms.now += 100  # type: ignore[attr-defined]
    assert 5 <= len(written) <= 6  # the first poll's, then one a second
    assert [w["impressions"] for w in written] == [1 + 10 * k for k in range(len(written))]


def test_once_every_partition_is_idle_a_poll_waits_until_the_next_checkpoint(
    make_store,
) -> None:
    """While an input may still deliver, the loop polls with the configured wait; once
    every owned partition's inputs are idle (at their end for ``idle_timeout``), it
    waits until the first checkpoint is due, at most ``IDLE_WAIT_MS``: an idle process
    wakes about once a checkpoint, not every ``kafka.poll_timeout``."""
    from evaluator.engine.loop import IDLE_WAIT_MS, idle_wait_ms

    settings = load_settings(
        environ={},
        overrides={"kafka": {"partitioner": "trust"}, "event_time": {"idle_timeout": "10s"}},
    )
    store = make_store(settings.layout(2))
    clock = FakeClock(1_000_000)
    tasks = Tasks(store, tasks_config(settings, 2), clock_ms=clock)
    assert idle_wait_ms(tasks) is None  # owns nothing yet
    tasks.assign([0, 1])
    inputs = [f"{kind}:{p}" for kind in ("impressions", "interactions") for p in (0, 1)]
    waits = []
    for _ in range(200):  # 20 s of empty polls 100 ms apart, every input confirmed at its end
        at_end = dict.fromkeys(inputs, clock.now)
        if clock.now >= 1_005_000:  # partition 1's interactions only confirmed after 5 s
            tasks.apply([], at_end)
        else:
            tasks.apply([], {k: v for k, v in at_end.items() if k != "interactions:1"})
        waits.append((clock.now - 1_000_000, idle_wait_ms(tasks)))
        clock.now += 100
    busy = [at for at, wait in waits if wait is None]
    idle = [(at, wait) for at, wait in waits if wait is not None]
    # partition 0 is idle after 10 s, partition 1 only 10 s after its first confirmation
    assert busy and max(busy) < 15_000 and min(at for at, _ in idle) >= 15_000
    assert all(0 <= wait <= IDLE_WAIT_MS for _, wait in idle)
    assert {wait for _, wait in idle} - {0, IDLE_WAIT_MS}  # less than the cap at times
    # the wait ends when the next checkpoint is due (the interval after the last one)
    at, wait = idle[-1]
    first_due = min(o.checkpointed_ms for o in tasks.owned.values()) + tasks.interval_ms
    assert wait == min(IDLE_WAIT_MS, max(0, first_due - (1_000_000 + at)))
