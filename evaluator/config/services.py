"""Configuration sections of the services: Kafka, Redis and the HTTP server.

Plain msgspec structs (see :mod:`evaluator.config.settings`); a ``ValueError`` raised here
becomes a one-line ``ConfigError`` naming the key.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from evaluator.core.timeutil import setting_ms

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "AWS_MSK_IAM")
"""The SASL mechanisms kafka-python offers that these settings can drive: the first
three with ``sasl_username`` and ``sasl_password``, GSSAPI with a Kerberos ticket cache
and AWS_MSK_IAM with the AWS credentials of the environment (OAUTHBEARER needs a token
provider object, which no setting gives)."""


class KafkaSettings(msgspec.Struct, forbid_unknown_fields=True):
    bootstrap_servers: str = "localhost:9092"
    client: Literal["kafka-python", "confluent"] = "kafka-python"
    """The consumer's client library: kafka-python (pure Python, the default) or
    confluent-kafka (librdkafka: ``pip install 'recsys-evaluator[confluent]'``)."""
    group_id: str = "recsys-evaluator"
    client_id: str = "recsys-evaluator"
    impressions_topic: str = "impressions"
    interactions_topic: str = "interactions"
    dlq_suffix: str = ".dlq"
    """Invalid events go to ``<topic><dlq_suffix>``; empty disables the dead-letter topic."""
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    max_poll_records: int = 5000
    poll_timeout: str | int = "100ms"
    fetch_min_bytes: int = 1_048_576
    """The broker answers a fetch once it holds this many bytes for the consumer, or
    after ``fetch_max_wait`` (Kafka's ``fetch.min.bytes``, whose default of 1 answers at
    once): a consumer that keeps up with live traffic then gets half a second of it a
    batch, not tens of events, and its cost per event falls 3.4 times with kafka-python
    (``bench/bench_steady.py``)."""
    fetch_max_wait: str | int = "500ms"
    """How long the broker may hold a fetch for ``fetch_min_bytes`` (``fetch.max.wait.ms``;
    librdkafka's ``fetch.wait.max.ms``): the delay it adds to live traffic at most."""
    session_timeout: str | int = "45s"
    """How long the group waits for a silent member (e.g. a killed process) before rebalancing."""
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: str = ""
    ssl_cafile: str = ""
    partitioner: Literal["murmur2", "crc32", "trust"] = "murmur2"
    """How producers choose a partition from the key (user id): events on another
    partition than their user's are forwarded through ``repartition_topic``.
    ``trust``: producers are known to co-partition; nothing is checked."""
    repartition_topic: str = ""
    """Internal topic for forwarded events (default ``<group_id>-repartition``); created
    with the input topics' partition count when missing."""

    def repartition(self) -> str:
        return self.repartition_topic or f"{self.group_id}-repartition"

    def __post_init__(self) -> None:
        if self.max_poll_records < 1:
            raise ValueError("max_poll_records must be >= 1")
        setting_ms("poll_timeout", self.poll_timeout)
        if self.fetch_min_bytes < 1:
            raise ValueError("fetch_min_bytes must be >= 1")
        if not 0 <= setting_ms("fetch_max_wait", self.fetch_max_wait) <= 30_000:
            raise ValueError("fetch_max_wait must be in 0..30s")
        if not 6_000 <= setting_ms("session_timeout", self.session_timeout) <= 1_800_000:
            raise ValueError(
                "session_timeout must be in 6s..30m (the broker's default "
                "group.min.session.timeout.ms and group.max.session.timeout.ms)"
            )
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and self.sasl_mechanism not in SASL_MECHANISMS:
            raise ValueError(
                f"sasl_mechanism must be one of {', '.join(SASL_MECHANISMS)} with "
                f"security_protocol {self.security_protocol}, got {self.sasl_mechanism!r}"
            )
        if not sasl and self.sasl_mechanism:
            raise ValueError(
                f"sasl_mechanism {self.sasl_mechanism!r} needs security_protocol "
                "SASL_PLAINTEXT or SASL_SSL"
            )


ENGINE_DEFAULTS: dict[str, str | int] = {"checkpoint_interval": "1s", "finalised_ttl": "6h"}


def check_engine_values(
    checkpoint_interval: str | int | None, finalised_ttl: str | int | None
) -> None:
    """The engine settings' ranges (under ``[engine]``, or their old names under ``[redis]``)."""
    if finalised_ttl is not None and setting_ms("finalised_ttl", finalised_ttl) < 60_000:
        raise ValueError("finalised_ttl must be at least 1m")
    interval = checkpoint_interval
    if interval is not None and not 0 <= setting_ms("checkpoint_interval", interval) <= 60_000:
        raise ValueError("checkpoint_interval must be in 0..1m")


class EngineSettings(msgspec.Struct, forbid_unknown_fields=True):
    """The partition engine's settings (before: under ``[redis]``, still read there)."""

    checkpoint_interval: str | int | None = None
    """How often an owned partition writes its checkpoint (state changes, offsets and
    aggregate increments, atomically), through a backlog and at the end of its inputs
    alike. Longer: less work per event, more to redo
    after a crash, a readout that lags more. 0: after every poll. Default 1s."""
    finalised_ttl: str | int | None = None
    """How long (of data time) a finalised request's marker lives: within it, a
    redelivered event is a duplicate and a late interaction is counted late. Markers
    are kept by the partition's owner and in Redis, so this sets much of the memory at
    high request rates (docs/operations.md); failover re-reads seconds of records, so
    only re-consuming older offsets needs more. Default 6h."""

    def ttl_s(self, name: str) -> int:
        return -(-self.ms(name) // 1000)

    def ms(self, name: str) -> int:
        value = getattr(self, name)
        return setting_ms(name, ENGINE_DEFAULTS[name] if value is None else value)

    def __post_init__(self) -> None:
        check_engine_values(self.checkpoint_interval, self.finalised_ttl)


class RedisSettings(msgspec.Struct, forbid_unknown_fields=True):
    url: str = "redis://localhost:6379/0"
    """``redis://`` or ``rediss://`` (TLS); credentials may also be in the URL."""
    username: str = ""
    password: str = ""
    tls: bool = False
    ssl_ca_certs: str = ""
    key_prefix: str = "recsys"
    shards: int = 16
    """Hash-tagged key groups (users are spread over them); must divide user_buckets."""
    retry_attempts: int = 5
    cluster: bool = False
    """``url`` names a node of a Redis Cluster (the key layout is the same)."""
    state_ttl: str | int = "48h"
    """Lifetime of open-request state (records, pending interactions, user indexes),
    refreshed by writes; must outlast the time to finalisation."""
    checkpoint_interval: str | int | None = None
    """The old name of ``engine.checkpoint_interval`` (still read; the two must agree)."""
    finalised_ttl: str | int | None = None
    """The old name of ``engine.finalised_ttl`` (still read; the two must agree)."""

    def ttl_s(self, name: str) -> int:
        return -(-self.ms(name) // 1000)

    def ms(self, name: str) -> int:
        value = getattr(self, name)
        if value is None:  # an old name of an engine setting, not given
            value = ENGINE_DEFAULTS[name]
        return setting_ms(name, value)

    def __post_init__(self) -> None:
        if setting_ms("state_ttl", self.state_ttl) < 60_000:
            raise ValueError("state_ttl must be at least 1m")
        check_engine_values(self.checkpoint_interval, self.finalised_ttl)
        if not self.url.startswith(("redis://", "rediss://", "unix://")):
            shown = "***@" + self.url.rsplit("@", 1)[1] if "@" in self.url else self.url
            raise ValueError(f"url must start with redis://, rediss:// or unix://, got {shown!r}")
        if not 1 <= self.shards <= 1024:
            raise ValueError("shards must be in 1..1024")
        if not 0 <= self.retry_attempts <= 100:
            raise ValueError("retry_attempts must be in 0..100 (redis-py retries forever below 0)")


class HttpSettings(msgspec.Struct, forbid_unknown_fields=True):
    host: str = "0.0.0.0"
    port: int = 9108
    """/metrics, /healthz and /readyz; 0 disables the server."""
    refresh_interval: str | int = "5s"
    """Window metrics are recomputed in the background this often; 0: at every scrape."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        setting_ms("refresh_interval", self.refresh_interval)
