"""Producing: dead letters and forwarded events (for the source), and the simulator's
sink onto the input topics."""

from __future__ import annotations

from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaConfigurationError, KafkaError

from evaluator.adapters.kafka.admin import security
from evaluator.adapters.topics import MESSAGE_BYTES
from evaluator.config import ConfigError, KafkaSettings
from evaluator.engine.batches import Kind

SEND_TIMEOUT_S = 30.0


def acknowledged(producer: KafkaProducer, sent: list[Any]) -> None:
    """Flush, then make every send's failure an exception: ``flush`` alone only logs
    failed records, and a checkpoint must never move past an event that was lost."""
    producer.flush()
    for future in sent:
        future.get(timeout=SEND_TIMEOUT_S)


class KafkaSink:
    """Producer of simulated (or replayed) events onto the impressions/interactions topics
    (a ConnectionError when no broker answers)."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.topics: dict[Kind, str] = {
            "impressions": settings.impressions_topic,
            "interactions": settings.interactions_topic,
        }
        try:
            self._producer = KafkaProducer(
                bootstrap_servers=settings.bootstrap_servers.split(","),
                client_id=settings.client_id + "-simulator",
                acks="all",
                linger_ms=20,
                batch_size=256 * 1024,
                **security(settings),
            )
        except KafkaConfigurationError as exc:  # a retry cannot help
            raise ConfigError(f"kafka: {exc}") from None
        except KafkaError as exc:  # the environment, not a bug: one line, exit 2
            raise ConnectionError(
                f"kafka.bootstrap_servers {settings.bootstrap_servers}: cannot connect ({exc})"
            ) from None

    def send(self, kind: Kind, key: bytes, payload: bytes) -> None:
        """Queue one message, keyed by user so a user's events stay in one partition."""
        self._producer.send(self.topics[kind], key=key or None, value=payload)

    def flush(self) -> None:
        self._producer.flush()

    def close(self) -> None:
        self._producer.flush()
        self._producer.close()


def make_producer(settings: KafkaSettings, max_request_size: int = MESSAGE_BYTES) -> KafkaProducer:
    """The source's producer for dead letters and forwarded events: acknowledged by
    every in-sync replica, since a checkpoint moves past them."""
    return KafkaProducer(
        bootstrap_servers=settings.bootstrap_servers.split(","),
        client_id=settings.client_id + "-producer",
        acks="all",
        max_request_size=max_request_size,
        **security(settings),
    )
