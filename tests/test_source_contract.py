"""One contract for both Kafka sources (kafka-python and confluent-kafka), run against
the real broker: what ``evaluator run``'s loop relies on (engine/ports.Source)."""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from evaluator.app.run import make_source
from evaluator.config import ConfigError, load_settings
from evaluator.core.events import InvalidEvent, InvalidReason
from evaluator.engine.batches import PartitionBatch, Rejected
from evaluator.engine.routing import Forwarded
from tests.live import LiveEnv, new_env, produce_paced

pytestmark = pytest.mark.services


@pytest.fixture(params=["kafka-python", "confluent"])
def client(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def source_for(env: LiveEnv, client: str, claim=None, **kafka):
    overrides = {"kafka": {"client": client, **kafka}}
    settings = load_settings(environ=env.environ, overrides=overrides)
    return make_source(
        settings, lambda names: None, claim or (lambda numbers: {}), lambda numbers: None
    )


def unclaimed_source(env: LiveEnv, client: str, **kafka):
    """A source of trusted keys whose claims find nothing checkpointed."""
    return source_for(
        env, client, claim=lambda numbers: {n: {} for n in numbers}, partitioner="trust", **kafka
    )


def poll_until(source, done: Callable[[list[PartitionBatch]], bool], timeout: float = 30):
    """Poll, collecting batches, until ``done(collected)`` or the timeout."""
    got: list[PartitionBatch] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got += source.poll()
        if done(got):
            return got
    raise AssertionError(f"timed out; got {[(b.partition, b.offsets) for b in got]}")


def assigned(source, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not source.assigned_numbers() and time.monotonic() < deadline:
        source.poll()
    assert source.assigned_numbers()


def test_partition_count_creates_the_dead_letter_topics(kafka_bootstrap, redis_url, client):
    env = new_env(kafka_bootstrap, redis_url)
    source = source_for(env, client, dlq_suffix=".dead")
    try:
        assert source.partition_count() == env.partitions
    finally:
        source.close()
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    topics = [f"{env.name}-impressions.dead", f"{env.name}-interactions.dead"]
    described = {t["name"]: len(t["partitions"]) for t in admin.describe_topics(topics)}
    admin.close()
    assert described == dict.fromkeys(topics, env.partitions)


def test_a_too_small_repartition_topic_stops_start_up(kafka_bootstrap, redis_url, client):
    env = new_env(kafka_bootstrap, redis_url)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(env.settings().kafka.repartition(), env.partitions, 1)])
    admin.close()
    source = source_for(env, client)
    try:
        with pytest.raises(ConfigError, match=r"^kafka\.repartition_topic .* max\.message\.bytes"):
            source.partition_count()
    finally:
        source.close()


def test_caught_up_holds_while_idle_and_not_after_a_seek_back(kafka_bootstrap, redis_url, client):
    """An input consumed to its end stays confirmed over idle polls; a seek back to an
    earlier offset (a reload), with the same end, withdraws it until the messages are
    consumed again. kafka-python's source keeps the positions it has seen: this fails if
    it trusts them past a seek."""
    env = new_env(kafka_bootstrap, redis_url, partitions=1)
    env.produce("impressions", [("u", f"m{i}".encode()) for i in range(3)])
    source = unclaimed_source(env, client)

    def confirmed() -> bool:
        source.refresh_ends()
        return "impressions:0" in source.caught_up()

    try:
        source.subscribe()
        poll_until(source, lambda b: sum(len(x.payloads) for x in b) >= 3)
        quiet, deadline = 0, time.monotonic() + 30  # the group may rebalance once more
        while quiet < 4 and time.monotonic() < deadline:
            quiet = quiet + 1 if not source.poll() and confirmed() else 0
        assert quiet == 4  # idle polls in a row, each confirmed
        assert source.lag()["impressions:0"] == 0
        source.seek({0: {"impressions": 1}})
        assert not confirmed()
        assert source.lag()["impressions:0"] == 2
        again = poll_until(source, lambda b: sum(len(x.payloads) for x in b) >= 2)
        assert [p for b in again for p in b.payloads] == [b"m1", b"m2"]
        assert confirmed()
    finally:
        source.close()


def test_batches_resume_at_the_claimed_offsets_and_commit(kafka_bootstrap, redis_url, client):
    """Assignment resumes each input at the offsets the store's claim gives (here 2 on
    partition 0), batches keep offsets in order, the end offsets confirm caught-up
    inputs, and committed offsets reach the group."""
    env = new_env(kafka_bootstrap, redis_url, partitions=1)
    env.produce("impressions", [("u", f"m{i}".encode()) for i in range(5)])
    claims: list[list[int]] = []

    def claim(numbers):
        claims.append(numbers)
        return {n: {"impressions": 2} for n in numbers}

    source = source_for(env, client, claim=claim, partitioner="trust")
    try:
        source.subscribe()
        got = poll_until(source, lambda b: sum(len(x.payloads) for x in b) >= 3)
        assert claims == [[0]]
        assert [(b.kind, b.partition) for b in got] == [("impressions", "impressions:0")] * len(got)
        assert [p for b in got for p in b.payloads] == [b"m2", b"m3", b"m4"]
        assert [o for b in got for o in b.offsets] == [2, 3, 4]
        deadline = time.monotonic() + 30
        while "impressions:0" not in source.caught_up() and time.monotonic() < deadline:
            source.refresh_ends()
            source.poll()
        assert "impressions:0" in source.caught_up()
        assert source.lag().get("impressions:0") == 0
        source.commit_offsets({0: {"impressions": 5, "interactions": 0}})
        topic = TopicPartition(f"{env.name}-impressions", 0)
        reader = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=f"{env.name}-group")
        deadline = time.monotonic() + 30
        while reader.committed(topic) != 5 and time.monotonic() < deadline:
            source.poll()  # serves the asynchronous commit's answer
        assert reader.committed(topic) == 5
        reader.close()
        source.pause([0])
        env.produce("impressions", [("u", b"late")])
        assert sum(len(b.payloads) for b in source.poll() + source.poll()) == 0  # paused
        source.seek({0: {"impressions": 4}})  # a reload after a failed batch
    finally:
        source.close()


@pytest.mark.parametrize("min_bytes", [10_000_000, 1])
def test_the_broker_holds_a_fetch_until_fetch_min_bytes_or_fetch_max_wait(
    kafka_bootstrap, redis_url, client, min_bytes
) -> None:
    """Events trickling in come in a few large batches, not one poll each, when the
    broker holds fetches (``kafka.fetch_min_bytes``): a consumer keeping up with live
    traffic pays its per-batch costs over many events. 40 events over a second,
    fetches held up to 3 s: at most 2 batches (one hold may end mid-way); answered
    at once (``fetch_min_bytes = 1``), several."""
    env = new_env(kafka_bootstrap, redis_url, partitions=1)
    source = unclaimed_source(env, client, fetch_min_bytes=min_bytes, fetch_max_wait="3s")
    try:
        source.subscribe()
        assigned(source)
        env.produce("impressions", [("u", b"first")])  # fetching has begun once it is in
        poll_until(source, lambda b: sum(len(x.payloads) for x in b) >= 1)
        events = [("impressions", {"user_id": "u", "n": n}) for n in range(40)]
        producer = produce_paced(env, events, rate=40.0)

        def paced(batch: PartitionBatch) -> int:
            return sum(p != b"first" for p in batch.payloads)  # "first" may come again

        got = poll_until(source, lambda b: sum(map(paced, b)) >= 40)
        producer.join()
        batches = [n for n in map(paced, got) if n]
        assert sum(batches) == 40
        if min_bytes > 1:
            assert len(batches) <= 2, batches
        else:
            assert len(batches) > 2, batches
    finally:
        source.close()


def test_a_long_wait_ends_as_soon_as_a_record_arrives(kafka_bootstrap, redis_url, client) -> None:
    """An idle process's poll asks to wait up to a second or more; a record produced
    meanwhile still comes back as soon as the broker answers the fetch (within
    ``kafka.fetch_max_wait``), not at the end of the wait."""
    env = new_env(kafka_bootstrap, redis_url, partitions=1)
    source = unclaimed_source(env, client)
    try:
        source.subscribe()
        assigned(source)
        producer = produce_paced(env, [("impressions", {"user_id": "u", "n": 0})], rate=1.0)
        started = time.monotonic()
        got: list[PartitionBatch] = []
        while not any(b.payloads for b in got) and time.monotonic() - started < 120:
            got += source.poll(30_000)
        producer.join()
        assert any(b.payloads for b in got)
        assert time.monotonic() - started < 15  # not the 30 s each poll could wait
    finally:
        source.close()


def test_with_latest_a_reload_reads_again_what_no_checkpoint_covers(
    kafka_bootstrap, redis_url, client
) -> None:
    env = new_env(kafka_bootstrap, redis_url, partitions=1)
    source = unclaimed_source(env, client, auto_offset_reset="latest")
    try:
        source.subscribe()
        assigned(source)
        env.produce("impressions", [("u", b"one"), ("u", b"two")])

        def take() -> list[bytes]:
            got = poll_until(source, lambda b: sum(len(x.payloads) for x in b) >= 2)
            return [p for b in got for p in b.payloads]

        assert take() == [b"one", b"two"]
        source.seek({0: {}})  # the batch failed: reload with nothing checkpointed
        assert take() == [b"one", b"two"]
    finally:
        source.close()


def test_forwards_and_dead_letters_are_durable(kafka_bootstrap, redis_url, client) -> None:
    """A forward lands on its partition of the repartition topic (and is consumed back
    as ``repartition``); a dead letter carries its reason and where it was read."""
    env = new_env(kafka_bootstrap, redis_url, partitions=2)
    source = source_for(env, client)
    try:
        source.partition_count()  # creates the repartition and dead-letter topics
        source.subscribe()
        assigned(source)
        refused = source.forward([Forwarded(1, b"u7", b"payload", "impressions:0", 3)])
        assert refused == []
        bad = InvalidEvent(0, InvalidReason.UNDECODABLE, "not json")
        source.dead_letter([Rejected("impressions", "impressions:1", 9, b"{oops", bad)])
        got = poll_until(source, lambda b: any(x.kind == "repartition" for x in b))
        forwarded = [b for b in got if b.kind == "repartition"]
        assert [(b.partition, b.payloads) for b in forwarded] == [("repartition:1", [b"payload"])]
    finally:
        source.close()
    consumer = KafkaConsumer(
        f"{env.name}-impressions.dlq",
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5_000,
    )
    letters = [(dict(m.headers), m.value) for m in consumer]
    consumer.close()
    assert letters == [
        (
            {
                "reason": b"undecodable",
                "detail": b"not json",
                "source": f"{env.name}-impressions/1@9".encode(),
            },
            b"{oops",
        )
    ]


def test_an_unknown_client_is_refused_at_start_up() -> None:
    with pytest.raises(msgspec.ValidationError, match="client"):
        msgspec.convert({"client": "java"}, type=type(load_settings(environ={}).kafka))


def test_end_offsets_come_back_after_a_broker_restart(redis_url, client, tmp_path) -> None:
    """The broker is killed and started again: consumption resumes and the end offsets
    (idleness, lag) are answered again. (librdkafka's admin client kept the old leader
    epochs, so every answer was FENCED_LEADER_EPOCH and no partition ever went idle.)"""
    from tests.live import KafkaBroker

    broker = KafkaBroker(tmp_path / "kafka")
    broker.start()
    source = None
    try:
        env = new_env(broker.bootstrap, redis_url, partitions=1)
        env.produce("impressions", [("u", b"a")])
        source = source_for(env, client, partitioner="trust")
        source.subscribe()
        poll_until(source, lambda b: b"a" in [p for x in b for p in x.payloads])
        source.refresh_ends()  # the clients that answer it know the broker before the kill
        broker.kill()
        broker.start()
        env.produce("impressions", [("u", b"b")])
        poll_until(source, lambda b: b"b" in [p for x in b for p in x.payloads], timeout=60)
        deadline = time.monotonic() + 15  # the broker answers fetches: it answers this too
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                source.refresh_ends()
            except Exception as exc:  # the broker may still be electing: ask again
                last_error = exc
                source.poll()
                continue
            if "impressions:0" in source.caught_up():
                break
        why = f"caught up {source.caught_up()}, lag {source.lag()}, last error {last_error!r}"
        assert "impressions:0" in source.caught_up(), why
        assert source.lag()["impressions:0"] == 0, why
    finally:
        if source is not None:
            source.close()
        broker.kill()
