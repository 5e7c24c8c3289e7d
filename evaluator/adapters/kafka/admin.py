"""Connection options shared by every kafka-python client, and the topic checks and
creations made at start-up (a missing or mis-sized internal topic stops start-up
with one line, instead of stalling a partition at its first use)."""

from __future__ import annotations

import logging
import socket
from typing import Any

from kafka import KafkaConsumer
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from evaluator.adapters.topics import security_options
from evaluator.config import ConfigError, KafkaSettings

log = logging.getLogger(__name__)


def security(settings: KafkaSettings) -> dict[str, Any]:
    """kafka-python's security options."""
    names = (
        "security_protocol",
        "sasl_mechanism",
        "sasl_plain_username",
        "sasl_plain_password",
        "ssl_cafile",
    )
    return security_options(settings, names)


def resolvable(bootstrap_servers: str) -> None:
    """A bootstrap host that does not exist is a configuration error (one line, exit 2),
    not an outage to wait for."""
    unknown = []
    servers = [s.strip() for s in bootstrap_servers.split(",") if s.strip()]
    for server in servers:
        host, _, port = server.rpartition(":")
        host = host.strip("[]") or server
        try:
            socket.getaddrinfo(host, int(port) if port.isdigit() else 9092)
        except socket.gaierror as exc:
            if exc.errno != socket.EAI_NONAME:
                return  # DNS trouble, not a wrong name: wait like for any outage
            unknown.append(host)
    if servers and len(unknown) == len(servers):  # one resolvable broker is enough
        raise ConfigError(
            f"kafka.bootstrap_servers: no host resolves ({', '.join(map(repr, unknown))})"
        )


def admin_client(settings: KafkaSettings) -> KafkaAdminClient:
    return KafkaAdminClient(
        bootstrap_servers=settings.bootstrap_servers.split(","),
        client_id=settings.client_id + "-admin",
        **security(settings),
    )


def create_topic(
    settings: KafkaSettings, topic: str, partitions: int, key: str, configs: dict[str, str]
) -> None:
    """Create ``topic`` with ``partitions``, the impressions topic's replication and
    ``configs``; a ConfigError naming ``key`` when the broker refuses (no permission,
    say). Already existing is fine."""
    admin = admin_client(settings)
    try:
        described = admin.describe_topics([settings.impressions_topic])
        first = described[0]["partitions"][0] if described else {}
        replicas = len(first.get("replica_nodes") or [1])
        admin.create_topics([NewTopic(topic, partitions, replicas, topic_configs=configs)])
        log.info("created topic %s (%d partitions)", topic, partitions)
    except TopicAlreadyExistsError:
        pass
    except KafkaError as exc:
        raise ConfigError(
            f"{key}: topic {topic!r} is missing and could not be created ({exc}); create it"
        ) from exc
    finally:
        admin.close()


def message_bytes(settings: KafkaSettings, topics: list[str]) -> dict[str, int]:
    """Each topic's ``max.message.bytes`` (its own or the broker's default), for the
    topics the broker describes: one it does not (no DescribeConfigs permission, which
    kafka-python reports as an empty answer) is left out with a warning, and the caller
    assumes the defaults for it."""
    wanted = {"max.message.bytes": None}
    found: dict[str, int] = {}
    try:
        admin = admin_client(settings)
        try:
            answer = admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, t, dict(wanted)) for t in topics],
                config_filter="all",
            )
        finally:
            admin.close()
        described = answer.get("topic", {})
        for t in topics:
            value = (described.get(t) or {}).get("max.message.bytes", {}).get("value")
            if value is not None:
                found[t] = int(value)
    except (KafkaError, AttributeError, TypeError, ValueError) as exc:
        log.warning("could not read the topics' max.message.bytes (%s)", exc)
    if len(found) < len(topics):
        missing = ", ".join(t for t in topics if t not in found)
        log.warning("no max.message.bytes for %s: assuming the broker's default", missing)
    return found


class KafkaPythonTopics:
    """:class:`evaluator.adapters.topics.TopicAdmin` through kafka-python (the source's
    consumer for metadata, an admin client for creations and configurations)."""

    def __init__(self, settings: KafkaSettings, consumer: KafkaConsumer) -> None:
        self.settings = settings
        self.consumer = consumer

    def partitions(self, topic: str) -> int:
        return len(self.consumer.partitions_for_topic(topic) or ())

    def create(self, topic: str, partitions: int, key: str, configs: dict[str, str]) -> None:
        create_topic(self.settings, topic, partitions, key, configs)

    def max_message_bytes(self, topics: list[str]) -> dict[str, int]:
        return message_bytes(self.settings, topics)
