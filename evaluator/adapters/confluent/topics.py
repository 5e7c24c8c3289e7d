"""librdkafka connection options, topic administration and producing helpers for the
confluent source."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.cimpl import NewTopic

from evaluator.adapters.topics import security_options
from evaluator.config import ConfigError, KafkaSettings

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 30.0
"""How long a flush waits for its delivery reports before the batch counts as failed."""


def options(settings: KafkaSettings) -> dict[str, Any]:
    """Bootstrap servers, client id and security, in librdkafka's names."""
    names = ("security.protocol", "sasl.mechanism", "sasl.username", "sasl.password")
    return {
        "bootstrap.servers": settings.bootstrap_servers,
        "client.id": settings.client_id,
        **security_options(settings, (*names, "ssl.ca.location")),
    }


class ConfluentTopics:
    """:class:`evaluator.adapters.topics.TopicAdmin` through librdkafka's admin client."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        try:
            self.admin = AdminClient(
                {
                    **options(settings),
                    "client.id": settings.client_id + "-admin",
                    # a metadata request must never create a topic with the broker's defaults
                    "allow.auto.create.topics": False,
                }
            )
        except KafkaException as exc:
            raise ConfigError(f"kafka: {exc}") from None

    def partitions(self, topic: str) -> int:
        found = self.admin.list_topics(topic, timeout=10.0).topics.get(topic)
        if found is None or found.error is not None:
            return 0
        return len(found.partitions)

    def create(self, topic: str, partitions: int, key: str, configs: dict[str, str]) -> None:
        inputs = self.admin.list_topics(self.settings.impressions_topic, timeout=10.0)
        described = inputs.topics.get(self.settings.impressions_topic)
        first = next(iter(described.partitions.values()), None) if described else None
        replicas = len(first.replicas) if first is not None and first.replicas else 1
        new = NewTopic(
            topic, num_partitions=partitions, replication_factor=replicas, config=configs
        )
        try:
            self.admin.create_topics([new])[topic].result(timeout=30.0)
            log.info("created topic %s (%d partitions)", topic, partitions)
        except KafkaException as exc:
            if exc.args[0].code() == exc.args[0].TOPIC_ALREADY_EXISTS:
                return
            raise ConfigError(
                f"{key}: topic {topic!r} is missing and could not be created ({exc}); create it"
            ) from exc

    def max_message_bytes(self, topics: list[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
        for resource, future in self.admin.describe_configs(resources).items():
            try:
                entry = future.result(timeout=10.0).get("max.message.bytes")
            except KafkaException as exc:
                log.warning("could not read %s's max.message.bytes (%s)", resource.name, exc)
                continue
            if entry is not None and entry.value is not None:
                found[resource.name] = int(entry.value)
        if len(found) < len(topics):
            missing = ", ".join(t for t in topics if t not in found)
            log.warning("no max.message.bytes for %s: assuming the broker's default", missing)
        return found


def produce(
    producer: Producer,
    topic: str,
    value: bytes,
    *,
    key: bytes | None,
    partition: int | None,
    on_delivery: Callable[[KafkaError | None, Message], None],
    headers: list[tuple[str, str | bytes | None]] | None = None,
) -> None:
    """Queue one message, serving delivery reports while the local queue is full."""
    extra: dict[str, Any] = {} if partition is None else {"partition": partition}
    while True:
        try:
            producer.produce(
                topic, value=value, key=key, headers=headers, on_delivery=on_delivery, **extra
            )
            return
        except BufferError:
            producer.poll(0.1)


def flush(producer: Producer) -> None:
    """Wait for every delivery report; one not in within the timeout is a failure."""
    left = producer.flush(SEND_TIMEOUT_S)
    if left:
        raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, f"{left} messages unsent"))


def log_error(error: KafkaError) -> None:
    """librdkafka's client-level errors (brokers down, ...): it retries by itself."""
    log.warning("kafka (librdkafka): %s", error)
