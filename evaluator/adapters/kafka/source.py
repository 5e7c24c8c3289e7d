"""The consumer-group member that feeds ``evaluator run``.

It consumes the impressions and interactions topics (and the repartition topic)
with manual offset commits: :meth:`KafkaSource.commit` is called only after the
pipeline has made a polled batch durable, so a crash re-delivers, never loses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.errors import (
    KafkaConfigurationError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
)
from kafka.structs import OffsetAndMetadata

from evaluator.adapters.kafka.admin import KafkaPythonTopics, resolvable, security
from evaluator.adapters.kafka.sink import SEND_TIMEOUT_S, acknowledged, make_producer
from evaluator.adapters.topics import KafkaSourceBase, dead_letter_record
from evaluator.config import ConfigError
from evaluator.core.timeutil import parse_duration_ms
from evaluator.engine.batches import Kind, PartitionBatch, Rejected
from evaluator.engine.routing import Forwarded

log = logging.getLogger(__name__)

TOO_LARGE = (MessageSizeTooLargeError, RecordListTooLargeError)
"""Refusals that no retry can overcome."""


def _refused(forwarded: Forwarded, exc: Exception, refused: list[Forwarded]) -> None:
    log.warning("a forwarded event of %d bytes was refused: %s", len(forwarded.payload), exc)
    refused.append(forwarded)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, source: KafkaSource) -> None:
        self.source = source

    def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        self.source.awaiting_since = time.monotonic()
        self.source.forget_positions()
        log.info("partitions revoked: %s", sorted(self.source.name(tp) for tp in revoked))
        self.source.on_revoke(sorted({tp.partition for tp in revoked}))

    def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        names = sorted(self.source.name(tp) for tp in assigned)
        self.source.awaiting_since = None
        log.info("partitions assigned: %s", names)
        consumer = self.source.consumer
        consumer.resume(*assigned)  # partitions paused after a fencing are ours again
        self.source.on_assign(names)
        resume = self.source.on_claim(sorted({tp.partition for tp in assigned}))
        self.source.seek(resume)


class KafkaSource(KafkaSourceBase):
    """Polls batches per partition, dead-letters invalid messages, commits on request."""

    def forget_positions(self) -> None:
        """Positions may move back (a rebalance): ask the consumer again."""
        self._reached.clear()

    def _open(self) -> None:
        settings = self.settings
        resolvable(settings.bootstrap_servers)
        try:
            self.consumer = KafkaConsumer(
                bootstrap_servers=settings.bootstrap_servers.split(","),
                group_id=settings.group_id,
                client_id=settings.client_id,
                enable_auto_commit=False,
                auto_offset_reset=settings.auto_offset_reset,
                max_poll_records=settings.max_poll_records,
                fetch_min_bytes=settings.fetch_min_bytes,
                fetch_max_wait_ms=parse_duration_ms(settings.fetch_max_wait),
                session_timeout_ms=parse_duration_ms(settings.session_timeout),
                heartbeat_interval_ms=max(1000, parse_duration_ms(settings.session_timeout) // 10),
                # per topic, the same partition numbers to the same member: co-partitioned
                # topics give each member whole partitions (a user's events of both kinds)
                partition_assignment_strategy=[RangePartitionAssignor],
                # a missing topic is an error (or, for the repartition topic, created with
                # the right partition count), never auto-created with the broker's default
                allow_auto_create_topics=False,
                **security(settings),
            )
        except KafkaConfigurationError as exc:  # a retry cannot help: one line, exit 2
            raise ConfigError(f"kafka: {exc}") from None
        self._ends: dict[TopicPartition, int] = {}
        """End offsets found by the last :meth:`refresh_ends`."""
        self.topics = KafkaPythonTopics(settings, self.consumer)
        self._producer: KafkaProducer | None = None
        self._offsets: KafkaConsumer | None = None
        self._origin: dict[TopicPartition, int] = {}
        """With ``latest``: where this member started an input never checkpointed."""
        self._unplaced: set[TopicPartition] = set()
        """Such inputs whose starting position is still to be found."""
        self._reached: dict[TopicPartition, tuple[int, int | None]] = {}
        """Per input, an offset its position has reached and the high watermark then:
        kafka-python's ``position()`` checks every assigned partition's leader each
        call (~0.15 ms), and the loop asks for each input after every poll."""

    def forward(self, forwarded: Sequence[Forwarded]) -> list[Forwarded]:
        """Send events to their user's partition of the repartition topic, durably
        (flushed) before the checkpoint that moves past them. Returns those refused as
        too large (by the producer or the broker: sent again they would fail forever),
        for the caller to dead-letter; any other failure raises."""
        producer = self._ensure_producer()
        topic = self.settings.repartition()
        refused: list[Forwarded] = []
        sent = []
        for f in forwarded:
            try:  # the producer's own size check raises here, the broker's at get()
                future = producer.send(topic, value=f.payload, key=f.key, partition=f.partition)
            except TOO_LARGE as exc:
                _refused(f, exc, refused)
            else:
                sent.append((f, future))
        producer.flush()
        for f, future in sent:
            try:
                future.get(timeout=SEND_TIMEOUT_S)
            except TOO_LARGE as exc:
                _refused(f, exc, refused)
        return refused

    def seek(self, resume: dict[int, dict[str, int]]) -> None:
        """Move each (partition number, kind) to its checkpointed offset. An input never
        checkpointed for that partition starts from its beginning with
        ``auto_offset_reset = "earliest"`` (nothing of it was applied: after a failed
        first batch too); with ``latest`` it starts where the group left it, and a
        reload goes back there (the position first taken here), not past a failed batch."""
        self._reached.clear()
        for number, offsets in resume.items():
            for topic, kind in self.kinds.items():
                tp = TopicPartition(topic, number)
                if tp not in self.consumer.assignment():
                    continue
                if kind in offsets:
                    self.consumer.seek(tp, offsets[kind])
                elif self.settings.auto_offset_reset == "earliest":
                    self.consumer.seek_to_beginning(tp)
                elif tp in self._origin:
                    self.consumer.seek(tp, self._origin[tp])
                else:  # found at the next poll (no blocking call in a rebalance callback)
                    self._unplaced.add(tp)

    def assigned_numbers(self) -> set[int]:
        """Partition numbers currently assigned to this member."""
        return {tp.partition for tp in self.consumer.assignment()}

    def pause(self, numbers: Sequence[int]) -> None:
        """Stop fetching partitions lost to a newer owner (until the next assignment)."""
        wanted = set(numbers)
        self.consumer.pause(*[tp for tp in self.consumer.assignment() if tp.partition in wanted])

    def caught_up(self) -> dict[str, int]:
        """Assigned inputs consumed to their end offset, with the wall clock (ms) of the
        broker's answer that confirmed it (see :meth:`refresh_ends`). While the broker
        does not answer, no new confirmation comes: an outage is not idleness."""
        names: dict[str, int] = {}
        for tp in self.consumer.assignment():
            end = self._ends.get(tp)
            if end is None:
                continue
            high = self.consumer.highwater(tp)
            if self._position(tp, max(end, high or 0)) >= max(end, high or 0):
                names[self.name(tp)] = self._ends_at_ms
        return names

    def _position(self, tp: TopicPartition, enough: int) -> int:
        """The input's position, or an offset it has reached when that is ``enough``.
        A position moves back only by this source's seeks and rebalances (which clear
        what was reached) or by a reset after the log was truncated, which a changed
        high watermark tells (or, at worst, the next poll's records)."""
        known = self._reached.get(tp)
        high = self.consumer.highwater(tp)
        if known is not None and known[0] >= enough and known[1] == high:
            return known[0]
        at = int(self.consumer.position(tp))
        self._reached[tp] = (at, high)
        return at

    def refresh_ends(self, timeout_ms: int = 2_000) -> None:
        """Ask the broker for the end offsets of the assigned partitions (raises when it
        does not answer in time)."""
        assigned = list(self.consumer.assignment())
        self._ends = dict(self._offset_client().end_offsets(assigned, timeout_ms=timeout_ms))
        self._ends_at_ms = time.time_ns() // 1_000_000

    def _offset_client(self) -> KafkaConsumer:
        """A client of its own (no group) for end offsets: on the consumer's connection a
        ListOffsets request waits behind the fetch the broker holds open while it waits
        for data (up to ``fetch.max.wait``), and the poll loop waits with it."""
        if self._offsets is None:
            self._offsets = KafkaConsumer(
                bootstrap_servers=self.settings.bootstrap_servers.split(","),
                client_id=self.settings.client_id + "-offsets",
                group_id=None,
                enable_auto_commit=False,
                **security(self.settings),
            )
        return self._offsets

    def commit_offsets(self, offsets: dict[int, dict[str, int]]) -> None:
        """Commit checkpointed offsets to Kafka too (for lag monitoring and tools; the
        checkpoint in the store is what a new owner resumes from)."""
        topics: dict[str, str] = {kind: topic for topic, kind in self.kinds.items()}
        out = {
            TopicPartition(topics[kind], number): OffsetAndMetadata(offset, "", -1)
            for number, mine in offsets.items()
            for kind, offset in mine.items()
            if kind in topics
        }
        if out:
            self.consumer.commit_async(offsets=out)

    def subscribe(self) -> None:
        """(Re)subscribe to both topics, e.g. when no partitions arrived in time."""
        self._reached.clear()
        self.consumer.unsubscribe()
        self.consumer.subscribe(list(self.kinds), listener=_Listener(self))

    def name(self, tp: TopicPartition) -> str:
        return f"{self.kinds.get(tp.topic, tp.topic)}:{tp.partition}"

    def poll(self, wait_ms: int | None = None) -> list[PartitionBatch]:
        """One poll: at most ``max_poll_records`` messages, grouped by partition."""
        if self._unplaced:
            for tp in self._unplaced & self.consumer.assignment():
                if (at := self.consumer.position(tp)) is not None:
                    self._origin[tp] = at
            self._unplaced.clear()
        records = self.consumer.poll(
            timeout_ms=self.wait_ms(wait_ms), max_records=self.settings.max_poll_records
        )
        batches = []
        for tp, messages in records.items():
            if messages:  # the position is past them now
                self._reached[tp] = (messages[-1].offset + 1, self.consumer.highwater(tp))
            batches.append(
                PartitionBatch(
                    self.kinds[tp.topic],
                    self.name(tp),
                    [m.value if m.value is not None else b"" for m in messages],
                    offsets=[m.offset for m in messages],
                )
            )
        return batches

    def _topic(self, kind: Kind) -> str:
        for topic, k in self.kinds.items():
            if k == kind:
                return topic
        raise KeyError(kind)

    def dead_letter(self, rejected: Sequence[Rejected]) -> None:
        """Copy invalid messages to ``<topic><dlq_suffix>`` with the reason in headers."""
        if not rejected or not self.settings.dlq_suffix:
            return
        producer = self._ensure_producer()
        sent = []
        for bad in rejected:
            topic = self._topic(bad.kind)
            read_from = self._topic(bad.partition.split(":")[0])  # type: ignore[arg-type]
            value, headers = dead_letter_record(bad, read_from)
            sent.append(producer.send(topic + self.settings.dlq_suffix, value, headers=headers))
        acknowledged(producer, sent)

    def _ensure_producer(self) -> KafkaProducer:
        """The producer for dead letters and forwarded events (created on first use)."""
        if self._producer is None:
            self._producer = make_producer(self.settings, self._forward_bytes)
        return self._producer

    def commit(self, batches: Sequence[PartitionBatch] | None = None) -> None:
        """Commit after a batch is durable: the positions reached by the last poll, or,
        given ``batches``, just past each of their last offsets (when later polls have
        already moved the positions on)."""
        if batches is None:
            self.consumer.commit()
            return
        topics = {kind: topic for topic, kind in self.kinds.items()}
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for batch in batches:
            if batch.offsets:
                tp = TopicPartition(topics[batch.kind], int(batch.partition.rsplit(":", 1)[1]))
                offsets[tp] = OffsetAndMetadata(batch.offsets[-1] + 1, "", -1)
        if offsets:
            self.consumer.commit(offsets=offsets)

    def backlogged(self) -> list[str]:
        """Assigned partitions known to hold unconsumed messages (from fetch metadata only)."""
        names = []
        for tp in self.consumer.assignment():
            high = self.consumer.highwater(tp)
            if high is not None and high > self.consumer.position(tp):
                names.append(self.name(tp))
        return names

    def lag(self) -> dict[str, int]:
        """Messages behind the end of each assigned partition (as of the last
        :meth:`refresh_ends`)."""
        return {
            self.name(tp): max(0, end - self._position(tp, end))
            for tp, end in self._ends.items()
            if tp in self.consumer.assignment()
        }

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
        if self._offsets is not None:
            self._offsets.close()
        self.consumer.close(autocommit=False)
