"""The consumer-group member of ``evaluator run`` on confluent-kafka (librdkafka).

The same contract as the kafka-python source (:class:`evaluator.engine.ports.Source`),
chosen with ``kafka.client = "confluent"`` (``pip install
'recsys-evaluator[confluent]'``): manual commits after the state is durable,
checkpointed offsets applied at assignment, dead letters and forwards
acknowledged before the checkpoint that moves past them. Only this package
imports confluent_kafka.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from evaluator.adapters.confluent.topics import (
    SEND_TIMEOUT_S,
    ConfluentTopics,
    flush,
    log_error,
    options,
    produce,
)
from evaluator.adapters.topics import KafkaSourceBase, dead_letter_record
from evaluator.config import ConfigError
from evaluator.core.timeutil import parse_duration_ms
from evaluator.engine.batches import PartitionBatch, Rejected
from evaluator.engine.routing import Forwarded

log = logging.getLogger(__name__)

_TOO_LARGE = {KafkaError.MSG_SIZE_TOO_LARGE}
"""Refusals that no retry can overcome (the producer's own check, or the broker's)."""


class ConfluentSource(KafkaSourceBase):
    """Polls batches per partition, dead-letters invalid messages, commits on request."""

    def _open(self) -> None:
        settings = self.settings
        session_ms = parse_duration_ms(settings.session_timeout)
        try:
            self.consumer = Consumer(
                {
                    **options(settings),
                    "group.id": settings.group_id,
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "auto.offset.reset": settings.auto_offset_reset,
                    "session.timeout.ms": session_ms,
                    "fetch.min.bytes": settings.fetch_min_bytes,
                    "fetch.wait.max.ms": parse_duration_ms(settings.fetch_max_wait),
                    "heartbeat.interval.ms": max(1000, session_ms // 10),
                    # per topic, the same partition numbers to the same member: a member
                    # owns whole partitions (a user's events of both kinds)
                    "partition.assignment.strategy": "range",
                    "allow.auto.create.topics": False,
                    "error_cb": log_error,
                }
            )
        except KafkaException as exc:  # a retry cannot help: one line, exit 2
            raise ConfigError(f"kafka: {exc}") from None
        self.topics = ConfluentTopics(settings)
        self._position: dict[tuple[str, int], int] = {}
        """Next offset to read per assigned (topic, partition), as far as this member knows."""
        self._origin: dict[tuple[str, int], int] = {}
        """With ``latest``: where this member started an input never checkpointed."""
        self._ends: dict[tuple[str, int], int] = {}
        self._producer: Producer | None = None
        self._admin: AdminClient | None = None

    # -- the group -------------------------------------------------------------------

    def subscribe(self) -> None:
        """(Re)subscribe to the input topics, e.g. when no partitions arrived in time."""
        self.consumer.unsubscribe()
        self.consumer.subscribe(list(self.kinds), on_assign=self._assigned, on_revoke=self._revoked)

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.awaiting_since = None
        names = sorted(self._name(tp.topic, tp.partition) for tp in partitions)
        log.info("partitions assigned: %s", names)
        self.on_assign(names)
        resume = self.on_claim(sorted({tp.partition for tp in partitions}))
        for tp in partitions:
            tp.offset = self._start(tp.topic, tp.partition, resume.get(tp.partition, {}))
            self._position[(tp.topic, tp.partition)] = tp.offset
        consumer.assign(partitions)
        consumer.resume(partitions)  # paused after a fencing: ours again now

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.awaiting_since = time.monotonic()
        log.info(
            "partitions revoked: %s",
            sorted(self._name(tp.topic, tp.partition) for tp in partitions),
        )
        self.on_revoke(sorted({tp.partition for tp in partitions}))
        for tp in partitions:
            self._position.pop((tp.topic, tp.partition), None)
        consumer.unassign()

    def _start(self, topic: str, number: int, offsets: dict[str, int]) -> int:
        """Where an input resumes: its checkpointed offset; never checkpointed, its
        beginning (``earliest``) or where this member first found the group's position
        (``latest``: the committed offset, else the end), so a reload goes back there."""
        kind = self.kinds[topic]
        if kind in offsets:
            return offsets[kind]
        if self.settings.auto_offset_reset == "earliest":
            return OFFSET_BEGINNING
        key = (topic, number)
        if key not in self._origin:
            tp = TopicPartition(topic, number)
            (committed,) = self.consumer.committed([tp], timeout=10.0)
            if committed.offset >= 0:
                self._origin[key] = committed.offset
            else:
                self._origin[key] = self.consumer.get_watermark_offsets(tp, timeout=10.0)[1]
        return self._origin[key]

    def seek(self, resume: dict[int, dict[str, int]]) -> None:
        """Move each assigned (partition number, kind) back to its checkpointed offset
        (a reload after a failed batch)."""
        for tp in self.consumer.assignment():
            if tp.partition in resume:
                offset = self._start(tp.topic, tp.partition, resume[tp.partition])
                self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
                self._position[(tp.topic, tp.partition)] = offset

    def assigned_numbers(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    def pause(self, numbers: Sequence[int]) -> None:
        """Stop fetching partitions lost to a newer owner (until the next assignment)."""
        wanted = set(numbers)
        self.consumer.pause([tp for tp in self.consumer.assignment() if tp.partition in wanted])

    # -- consuming -------------------------------------------------------------------

    def poll(self, wait_ms: int | None = None) -> list[PartitionBatch]:
        """One poll: at most ``max_poll_records`` messages, grouped by partition."""
        grouped: dict[tuple[str, int], list[Message]] = {}
        for m in self._messages(self.wait_ms(wait_ms)):
            error = m.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(error)
            grouped.setdefault((str(m.topic()), int(m.partition() or 0)), []).append(m)
        return self._batches(grouped)

    def _messages(self, wait_ms: int) -> list[Message]:
        """Up to ``max_poll_records`` messages. librdkafka's ``consume`` waits its whole
        timeout unless it fills the batch: a longer wait than ``kafka.poll_timeout`` (an
        idle process's) waits for the first message alone, then takes what has come."""
        most = self.settings.max_poll_records
        if wait_ms <= self.poll_timeout_ms:
            return list(self.consumer.consume(num_messages=most, timeout=wait_ms / 1000.0))
        first = self.consumer.poll(wait_ms / 1000.0)
        if first is None:
            return []
        rest = self.consumer.consume(num_messages=most - 1, timeout=0) if most > 1 else []
        return [first, *rest]

    def _batches(self, grouped: dict[tuple[str, int], list[Message]]) -> list[PartitionBatch]:
        """A batch per partition, its position moved past them."""
        batches = []
        for (topic, number), mine in grouped.items():
            offsets = [int(m.offset() or 0) for m in mine]
            self._position[(topic, number)] = offsets[-1] + 1
            batches.append(
                PartitionBatch(
                    self.kinds[topic],
                    self._name(topic, number),
                    [m.value() or b"" for m in mine],
                    offsets=offsets,
                )
            )
        return batches

    def caught_up(self) -> dict[str, int]:
        """Assigned inputs consumed to the end offset the broker last reported, with the
        wall clock (ms) of that answer (see :meth:`refresh_ends`)."""
        names: dict[str, int] = {}
        for key, end in self._ends.items():
            at = self._position.get(key)
            if at is not None and at >= 0 and at >= end:
                names[self._name(*key)] = self._ends_at_ms
        return names

    def refresh_ends(self, timeout_ms: int = 2_000) -> None:
        """Ask the broker for the end offsets of the assigned partitions, in one request
        (raises when it does not answer in time). An input that starts at its beginning
        and has given nothing yet is placed at its first offset, so an empty one counts
        as consumed to its end."""
        assigned = [(tp.topic, tp.partition) for tp in self.consumer.assignment()]
        self._ends = self._offsets(assigned, OffsetSpec.latest(), timeout_ms)  # type: ignore[no-untyped-call]
        unplaced = [k for k in assigned if self._position.get(k) == OFFSET_BEGINNING]
        if unplaced:
            starts = self._offsets(unplaced, OffsetSpec.earliest(), timeout_ms)  # type: ignore[no-untyped-call]
            for key, start in starts.items():
                if self._position.get(key) == OFFSET_BEGINNING:  # still nothing consumed
                    self._position[key] = start
        self._ends_at_ms = time.time_ns() // 1_000_000

    def _offsets(
        self, keys: list[tuple[str, int]], spec: OffsetSpec, timeout_ms: int
    ) -> dict[tuple[str, int], int]:
        if not keys:
            return {}
        wanted = {TopicPartition(t, p): spec for t, p in keys}
        futures = self._admin_client().list_offsets(wanted, request_timeout=timeout_ms / 1000)
        try:
            return {
                (tp.topic, tp.partition): f.result(timeout=timeout_ms / 1000).offset
                for tp, f in futures.items()
            }
        except KafkaException:
            # after a broker restart the admin client keeps the old leader epochs and
            # every answer is FENCED_LEADER_EPOCH: the next call starts a fresh client
            self._admin = None
            raise

    def lag(self) -> dict[str, int]:
        """Messages behind the end of each assigned partition (as of :meth:`refresh_ends`)."""
        out = {}
        for key, end in self._ends.items():
            at = self._position.get(key)
            if at is not None:
                out[self._name(*key)] = max(0, end - max(at, 0))
        return out

    def commit_offsets(self, offsets: dict[int, dict[str, int]]) -> None:
        """Commit checkpointed offsets to Kafka too (lag monitoring and tools; the
        checkpoint in the store is what a new owner resumes from)."""
        topics = {kind: topic for topic, kind in self.kinds.items()}
        out = [
            TopicPartition(topics[kind], number, offset)
            for number, mine in offsets.items()
            for kind, offset in mine.items()
            if kind in topics
        ]
        if out:
            try:
                self.consumer.commit(offsets=out, asynchronous=True)
            except KafkaException as exc:  # e.g. no assignment during a rebalance
                log.debug("offset commit skipped: %s", exc)

    # -- producing -------------------------------------------------------------------

    def forward(self, forwarded: Sequence[Forwarded]) -> list[Forwarded]:
        """Send events to their user's partition of the repartition topic, durably, before
        the checkpoint that moves past them; returns those refused as too large (sent
        again they would fail forever) for the caller to dead-letter. Any other failure
        raises."""
        topic = self.settings.repartition()
        refused: list[Forwarded] = []
        failures: list[KafkaError] = []

        def report(f: Forwarded) -> Callable[[KafkaError | None, Message], None]:
            def done(error: KafkaError | None, _: Message) -> None:
                if error is not None:
                    (refused.append(f) if error.code() in _TOO_LARGE else failures.append(error))
                    if error.code() in _TOO_LARGE:
                        log.warning(
                            "a forwarded event of %d bytes was refused: %s", len(f.payload), error
                        )

            return done

        producer = self._ensure_producer()
        for f in forwarded:
            try:
                produce(
                    producer,
                    topic,
                    f.payload,
                    key=f.key,
                    partition=f.partition,
                    on_delivery=report(f),
                )
            except KafkaException as exc:
                if exc.args[0].code() not in _TOO_LARGE:
                    raise
                log.warning("a forwarded event of %d bytes was refused: %s", len(f.payload), exc)
                refused.append(f)
        flush(producer)
        if failures:
            raise KafkaException(failures[0])
        return refused

    def dead_letter(self, rejected: Sequence[Rejected]) -> None:
        """Copy invalid messages to ``<topic><dlq_suffix>`` with the reason in headers."""
        if not rejected or not self.settings.dlq_suffix:
            return
        topics = {kind: topic for topic, kind in self.kinds.items()}
        failures: list[KafkaError] = []

        def done(error: KafkaError | None, _: Message) -> None:
            if error is not None:
                failures.append(error)

        producer = self._ensure_producer()
        for bad in rejected:
            read_from = topics[bad.partition.split(":")[0]]  # type: ignore[index]
            value, headers = dead_letter_record(bad, read_from)
            target = topics[bad.kind] + self.settings.dlq_suffix
            produce(
                producer,
                target,
                value,
                key=None,
                partition=None,
                on_delivery=done,
                headers=list(headers),
            )
        flush(producer)
        if failures:
            raise KafkaException(failures[0])

    def _ensure_producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(
                {
                    **options(self.settings),
                    "client.id": self.settings.client_id + "-producer",
                    "acks": "all",
                    "enable.idempotence": True,
                    "message.max.bytes": self._forward_bytes,
                    "linger.ms": 5,
                    "error_cb": log_error,
                }
            )
        return self._producer

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(
                {**options(self.settings), "client.id": self.settings.client_id + "-offsets"}
            )
        return self._admin

    def _name(self, topic: str, number: int) -> str:
        return f"{self.kinds.get(topic, topic)}:{number}"

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(SEND_TIMEOUT_S)
        self.consumer.close()
