"""Kafka topic rules both sources share, whatever their client: the checks and
creations made at start-up (a missing or mis-sized internal topic stops start-up
with one line, instead of stalling a partition at its first use) and the dead-letter
record. Each client adapter supplies a :class:`TopicAdmin`; nothing here imports one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from evaluator.config import ConfigError, KafkaSettings
from evaluator.core.timeutil import parse_duration_ms
from evaluator.engine.batches import Kind, Rejected

log = logging.getLogger(__name__)

MESSAGE_BYTES = 1_048_576
"""A producer's default largest request, below the broker's default topic
``max.message.bytes`` (1,048,588)."""

FORWARD_HEADROOM = 65_536
"""Bytes a forwarded event may grow by (its user id as key, the tag, record overhead)."""

DEAD_LETTER_BYTES = 900_000
"""Payload bytes a dead letter keeps: with its headers it stays under the producer's
and the broker's default 1 MiB (an input topic may allow larger messages). A larger
one would fail to send on every retry and stall its partition."""


class TopicAdmin(Protocol):
    """What start-up needs to know and do about topics, through one client."""

    def partitions(self, topic: str) -> int:
        """The topic's partition count; 0 when the broker does not know it."""
        ...

    def create(self, topic: str, partitions: int, key: str, configs: dict[str, str]) -> None:
        """Create the topic (the impressions topic's replication); a ConfigError naming
        ``key`` when the broker refuses. Already existing is fine."""
        ...

    def max_message_bytes(self, topics: list[str]) -> dict[str, int]:
        """Each described topic's ``max.message.bytes``; topics not described are left out."""
        ...


def security_options(settings: KafkaSettings, names: tuple[str, ...]) -> dict[str, object]:
    """The security settings under a client's own option names: (protocol, SASL
    mechanism, username, password, CA file)."""
    protocol, mechanism, username, password, cafile = names
    out: dict[str, object] = {protocol: settings.security_protocol}
    if settings.sasl_mechanism:
        out[mechanism] = settings.sasl_mechanism
        out[username] = settings.sasl_username
        out[password] = settings.sasl_password
    if settings.ssl_cafile:
        out[cafile] = settings.ssl_cafile
    return out


def input_kinds(settings: KafkaSettings) -> dict[str, Kind]:
    """The topics a source consumes, and the kind of events each carries."""
    kinds: dict[str, Kind] = {
        settings.impressions_topic: "impressions",
        settings.interactions_topic: "interactions",
    }
    if settings.partitioner != "trust":
        kinds[settings.repartition()] = "repartition"
    return kinds


def await_metadata(admin: TopicAdmin, topics: list[str], timeout_s: float) -> None:
    """Wait until the broker knows the topics (or the timeout passes).

    Joining the group before that gives an empty first assignment, and the rejoin
    that follows has been seen to stall (kafka-python)."""
    deadline = time.monotonic() + timeout_s
    missing = list(topics)
    while missing and time.monotonic() < deadline:
        missing = [t for t in missing if not admin.partitions(t)]
        if missing:
            time.sleep(0.2)  # polling the broker's metadata, not waiting in place of it
    if missing:
        log.warning("no metadata yet for %s; subscribing anyway", ", ".join(missing))


def start_up_topics(
    settings: KafkaSettings, admin: TopicAdmin, repartition: bool
) -> tuple[int, int]:
    """The input topics' common partition count, and the largest forward the repartition
    topic takes. A ConfigError (one line at start-up) when the inputs differ, since a
    user's events would then live in two partition numbers; the internal topics that
    are missing (dead letters, repartition) are created."""
    inputs = (settings.impressions_topic, settings.interactions_topic)
    counts = {t: admin.partitions(t) for t in inputs}
    if len(set(counts.values())) != 1 or 0 in counts.values():
        listed = ", ".join(f"{t} has {n}" for t, n in counts.items())
        raise ConfigError(
            f"kafka.impressions_topic and kafka.interactions_topic must be co-partitioned "
            f"(the same number of partitions, keyed by user id): {listed}"
        )
    n = next(iter(counts.values()))
    forward_bytes = _check_repartition(settings, admin, n) if repartition else MESSAGE_BYTES
    if settings.dlq_suffix:  # else the first dead letter would wait, then fail
        for topic in inputs:
            _ensure(admin, topic + settings.dlq_suffix, n, 'kafka.dlq_suffix (or set it to "")')
    return n, forward_bytes


def _check_repartition(settings: KafkaSettings, admin: TopicAdmin, partitions: int) -> int:
    """The repartition topic must have the inputs' partition count and take every
    message they take, with room for the key and tag a forward adds: created so when
    missing, else start-up stops naming it. (What it still refuses, e.g. a message
    compressed by its producer and too large uncompressed, is dead-lettered by the
    forward's caller: sent again it would fail forever.) Returns the largest forward."""
    inputs = [settings.impressions_topic, settings.interactions_topic]
    topic = settings.repartition()
    largest = max(admin.max_message_bytes(inputs).values(), default=MESSAGE_BYTES)
    needed = largest + FORWARD_HEADROOM
    found = _ensure(
        admin, topic, partitions, "kafka.repartition_topic", {"max.message.bytes": str(needed)}
    )
    if found != partitions:
        raise ConfigError(
            f"kafka.repartition_topic {topic!r} has {found} partitions; the input "
            f"topics have {partitions}: delete it or name another"
        )
    taken = admin.max_message_bytes([topic]).get(topic)
    if taken is not None and taken < largest:
        raise ConfigError(
            f"kafka.repartition_topic {topic!r} takes messages up to {taken} bytes, the "
            f"input topics up to {largest}: raise its max.message.bytes to {needed} "
            f"(kafka-configs --alter --entity-type topics --entity-name {topic} "
            f"--add-config max.message.bytes={needed})"
        )
    return max(MESSAGE_BYTES, needed)


def _ensure(
    admin: TopicAdmin, topic: str, partitions: int, key: str, configs: dict[str, str] | None = None
) -> int:
    """Create ``topic`` with ``partitions`` when missing; its partition count."""
    found = admin.partitions(topic)
    if found:
        return found
    admin.create(topic, partitions, key, configs or {})
    await_metadata(admin, [topic], 30.0)
    return admin.partitions(topic) or partitions


def dead_letter_record(bad: Rejected, topic: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The value and headers of ``bad``'s dead letter: the reason, the detail, where it
    was read (``topic``: an input or the repartition topic, with partition and offset),
    and (when its payload was cut to :data:`DEAD_LETTER_BYTES`) its size."""
    headers = [
        ("reason", bad.event.reason.value.encode()),
        ("detail", bad.event.detail.encode()[:1000]),
        ("source", f"{topic}/{bad.partition.split(':')[1]}@{bad.offset}".encode()),
    ]
    if len(bad.payload) > DEAD_LETTER_BYTES:
        headers.append(("truncated_from", str(len(bad.payload)).encode()))
    return bad.payload[:DEAD_LETTER_BYTES], headers


class KafkaSourceBase:
    """What both Kafka sources set up the same way: the settings, the group callbacks,
    the input kinds, the rebalancing clock and the start-up checks. A client's source
    opens its consumer and topic admin in :meth:`_open`."""

    topics: TopicAdmin

    def __init__(
        self,
        settings: KafkaSettings,
        poll_timeout_ms: int,
        on_assign: Callable[[list[str]], None] = lambda names: None,
        on_claim: Callable[[list[int]], dict[int, dict[str, int]]] = lambda numbers: {},
        on_revoke: Callable[[list[int]], None] = lambda numbers: None,
    ) -> None:
        """``on_claim``: partition numbers newly assigned -> the offsets (per kind) to
        resume each at; ``on_revoke``: partition numbers taken away."""
        self.settings = settings
        self.poll_timeout_ms = poll_timeout_ms
        self.session_timeout_s = parse_duration_ms(settings.session_timeout) / 1000.0
        self.dead_letters = bool(settings.dlq_suffix)
        self.on_assign, self.on_claim, self.on_revoke = on_assign, on_claim, on_revoke
        self.kinds: dict[str, Kind] = input_kinds(settings)
        self.awaiting_since: float | None = time.monotonic()
        """When the group started (re)balancing without an assignment yet; None when settled."""
        self._ends_at_ms = 0
        """When (wall clock ms) the last :meth:`refresh_ends` found the end offsets."""
        self._forward_bytes = MESSAGE_BYTES
        """The producer's largest request: what the repartition topic takes."""
        self._open()
        await_metadata(self.topics, [settings.impressions_topic, settings.interactions_topic], 30.0)

    def wait_ms(self, wait_ms: int | None) -> int:
        """How long a poll waits for records: ``wait_ms``, at least ``kafka.poll_timeout``."""
        return self.poll_timeout_ms if wait_ms is None else max(wait_ms, self.poll_timeout_ms)

    def _open(self) -> None:
        """Create the consumer and ``self.topics`` (a retry cannot help a refusal here:
        raise ConfigError)."""
        raise NotImplementedError

    def partition_count(self) -> int:
        """The topics' common partition count; a ConfigError (one line at start-up)
        when they differ. Creates the internal topics that are missing
        (:func:`start_up_topics`)."""
        n, self._forward_bytes = start_up_topics(
            self.settings, self.topics, "repartition" in self.kinds.values()
        )
        return n
