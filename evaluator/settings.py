"""Configuration models: every section and setting, with defaults and validation.

Plain msgspec structs; reading files and the environment is :mod:`evaluator.config`'s
job. A ``ValueError`` raised here becomes a one-line ``ConfigError`` naming the key.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from evaluator.experiments import Experiment, experiments_from
from evaluator.finalise import FinaliseConfig, deadline_ms
from evaluator.join import JoinRules
from evaluator.metrics.ndcg import GainKind
from evaluator.propensity import NoBias, PositionTable, PropensityModel, parse_propensity
from evaluator.propensity_estimation import Estimator
from evaluator.relevance import BUILTIN_PROFILES, ProfileKind, RelevanceProfile
from evaluator.scoring import METRICS, ScoringConfig
from evaluator.timeutil import format_duration_ms, parse_duration_ms, parse_instant_ms
from evaluator.windows import AggregateLayout


def _instant(key: str, value: str | int) -> int | None:
    if value == "":
        return None
    try:
        return parse_instant_ms(value)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


def _duration(key: str, value: str | int) -> int:
    try:
        return parse_duration_ms(value)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


MAX_K = 10_000
"""The largest cutoff (lists are at most ``events.max_list_length`` long, which defaults to
1,000). Memory and time are linear in min(K, the longest list), never in K alone."""
MAX_CUTOFFS = 16
"""Cutoffs in ``metrics.k``: each adds columns to every aggregate row and Prometheus series."""


class EventsSettings(msgspec.Struct, forbid_unknown_fields=True):
    max_list_length: int = 1000

    def __post_init__(self) -> None:
        if not 1 <= self.max_list_length <= MAX_K:
            raise ValueError(f"max_list_length must be in 1..{MAX_K}")


class JoinSettings(msgspec.Struct, forbid_unknown_fields=True):
    attribution_window: str | int = "30m"
    max_clock_skew: str | int = "5s"

    def __post_init__(self) -> None:
        self.rules()

    def rules(self) -> JoinRules:
        return JoinRules(
            _duration("attribution_window", self.attribution_window),
            _duration("max_clock_skew", self.max_clock_skew),
        )


class ProfileSettings(msgspec.Struct, forbid_unknown_fields=True):
    kind: ProfileKind = "table"
    grades: dict[str, float] = {}
    target_duration: str | int = "30s"


class RelevanceSettings(msgspec.Struct, forbid_unknown_fields=True):
    profile: str = "ecommerce"
    profiles: dict[str, ProfileSettings] = {}

    def __post_init__(self) -> None:
        self.active()

    def active(self) -> RelevanceProfile:
        """The chosen profile: one defined here, or a built-in one."""
        if self.profile in self.profiles:
            spec = self.profiles[self.profile]
            return RelevanceProfile(
                self.profile,
                spec.kind,
                spec.grades,
                _duration("target_duration", spec.target_duration),
            )
        if self.profile in BUILTIN_PROFILES:
            return BUILTIN_PROFILES[self.profile]
        known = sorted({*BUILTIN_PROFILES, *self.profiles})
        raise ValueError(f"profile {self.profile!r} is not one of {', '.join(known)}")


DEFAULT_COMPOSITE = {"ndcg@10": 0.7, "coverage@10": 0.2, "diversity@10": 0.1}


class MetricsSettings(msgspec.Struct, forbid_unknown_fields=True):
    k: list[int] = msgspec.field(default_factory=lambda: [10, 20])
    gain: GainKind = "exponential"
    zero_relevance: Literal["count", "skip"] = "count"
    diversity_attribute: str = "category"
    catalog_size: int = 0
    """Items in the catalog; 0 means the distinct items seen in impressions."""
    composite: dict[str, float] = msgspec.field(default_factory=lambda: dict(DEFAULT_COMPOSITE))

    def __post_init__(self) -> None:
        if not self.k or any(k < 1 for k in self.k):
            raise ValueError(f"k must be a non-empty list of positive integers, got {self.k}")
        if max(self.k) > MAX_K or len(set(self.k)) > MAX_CUTOFFS:
            raise ValueError(
                f"k allows at most {MAX_CUTOFFS} cutoffs of at most {MAX_K} "
                f"(the longest list events.max_list_length may allow), got {self.k}"
            )
        self.k = sorted(set(self.k))
        if self.catalog_size < 0:
            raise ValueError("catalog_size must be >= 0")
        if self.composite == DEFAULT_COMPOSITE and 10 not in self.k:  # the default follows k
            self.composite = {
                f"{name.split('@')[0]}@{self.k[0]}": w for name, w in self.composite.items()
            }
        known = (*METRICS, "coverage", "diversity")
        bad = [
            n
            for n in self.composite
            if not (m := re.fullmatch(r"([a-z_]+)@(\d+)", n))
            or m[1] not in known
            or int(m[2]) not in self.k
        ]
        if bad:
            raise ValueError(
                f"composite: unknown metric(s) {bad}: use metric@K with a metric among "
                f"{', '.join(known)} and K in k {self.k}"
            )


class PropensitySettings(msgspec.Struct, forbid_unknown_fields=True):
    model: str | list[float] = "none"
    """``none``, ``power(ETA)``, a list of per-position propensities, or ``estimated``
    (the curve of ``estimator``, fixed per window bucket)."""
    clip: float = 0.05
    estimator: Literal["none", "randomized", "harvesting", "em"] = "none"
    """Estimate propensities from the stream with this estimator (all three are
    computed and exported once it is not ``none``); ``estimated`` needs one."""
    positions: int = 10
    """Positions whose propensity is estimated."""
    min_clicks: int = 30
    """Below this many clicks a position falls back to the fitted power law."""
    history: str | int = "7d"
    """Estimate from the requests finalised in the newest days of this span (whole days):
    behaviour drifts, and the counters stay bounded."""

    def history_ms(self) -> int:
        return _duration("history", self.history)

    def __post_init__(self) -> None:
        if self.history_ms() < 86_400_000:
            raise ValueError("history must be at least 1d")
        if not 0 < self.clip <= 1:
            raise ValueError(f"clip must be in (0, 1], got {self.clip}")
        if not 2 <= self.positions <= 100:
            raise ValueError("positions must be in 2..100")
        if self.min_clicks < 1:
            raise ValueError("min_clicks must be >= 1")
        if self.estimated and self.estimator == "none":
            raise ValueError(
                "model = 'estimated' needs estimator = 'randomized', 'harvesting' or 'em'"
            )
        self.build()

    @property
    def estimated(self) -> bool:
        return isinstance(self.model, str) and self.model.strip().lower() == "estimated"

    @property
    def estimator_name(self) -> Estimator:
        """The estimator as a core type (``em`` when none is set)."""
        return "em" if self.estimator == "none" else self.estimator

    @property
    def collect(self) -> bool:
        """Whether finalised requests feed the estimators' counters."""
        return self.estimator != "none"

    def build(self, curve: tuple[float, ...] | None = None) -> PropensityModel:
        """The configured model; for ``estimated``, the given curve (none yet: no bias)."""
        if self.estimated:
            return PositionTable(curve) if curve else NoBias()
        return parse_propensity(self.model)


class ColdStartSettings(msgspec.Struct, forbid_unknown_fields=True):
    min_relevant_history: int = 3

    def __post_init__(self) -> None:
        if self.min_relevant_history < 0:
            raise ValueError("min_relevant_history must be >= 0")


SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "AWS_MSK_IAM")
"""The SASL mechanisms kafka-python offers that these settings can drive: the first
three with ``sasl_username`` and ``sasl_password``, GSSAPI with a Kerberos ticket cache
and AWS_MSK_IAM with the AWS credentials of the environment (OAUTHBEARER needs a token
provider object, which no setting gives)."""


class KafkaSettings(msgspec.Struct, forbid_unknown_fields=True):
    bootstrap_servers: str = "localhost:9092"
    group_id: str = "recsys-evaluator"
    client_id: str = "recsys-evaluator"
    impressions_topic: str = "impressions"
    interactions_topic: str = "interactions"
    dlq_suffix: str = ".dlq"
    """Invalid events go to ``<topic><dlq_suffix>``; empty disables the dead-letter topic."""
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    max_poll_records: int = 5000
    poll_timeout: str | int = "100ms"
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
        _duration("poll_timeout", self.poll_timeout)
        if not 6_000 <= _duration("session_timeout", self.session_timeout) <= 1_800_000:
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
    checkpoint_interval: str | int = "1s"
    """How often an owned partition writes its checkpoint (state changes, offsets and
    aggregate increments, atomically) while it works through a backlog; at the end of
    its inputs it writes after every poll. Longer: less work per event, more to redo
    after a crash, a readout that lags more. 0: after every poll."""
    finalised_ttl: str | int = "6h"
    """How long (of data time) a finalised request's marker lives: within it, a
    redelivered event is a duplicate and a late interaction is counted late. Markers
    are kept by the partition's owner and in Redis, so this sets much of the memory at
    high request rates (docs/operations.md); failover re-reads seconds of records, so
    only re-consuming older offsets needs more."""

    def ttl_s(self, name: str) -> int:
        return -(-_duration(name, getattr(self, name)) // 1000)

    def ms(self, name: str) -> int:
        return _duration(name, getattr(self, name))

    def __post_init__(self) -> None:
        for name in ("state_ttl", "finalised_ttl"):
            if _duration(name, getattr(self, name)) < 60_000:
                raise ValueError(f"{name} must be at least 1m")
        if not 0 <= _duration("checkpoint_interval", self.checkpoint_interval) <= 60_000:
            raise ValueError("checkpoint_interval must be in 0..1m")
        if not self.url.startswith(("redis://", "rediss://", "unix://")):
            shown = "***@" + self.url.rsplit("@", 1)[1] if "@" in self.url else self.url
            raise ValueError(f"url must start with redis://, rediss:// or unix://, got {shown!r}")
        if not 1 <= self.shards <= 1024:
            raise ValueError("shards must be in 1..1024")
        if not 0 <= self.retry_attempts <= 100:
            raise ValueError("retry_attempts must be in 0..100 (redis-py retries forever below 0)")


class EventTimeSettings(msgspec.Struct, forbid_unknown_fields=True):
    max_out_of_orderness: str | int = "5s"
    idle_timeout: str | int = "30s"
    allowed_lateness: str | int = "1m"

    def __post_init__(self) -> None:
        for name in ("max_out_of_orderness", "idle_timeout", "allowed_lateness"):
            _duration(name, getattr(self, name))

    def ms(self, name: str) -> int:
        return _duration(name, getattr(self, name))


class WindowSettings(msgspec.Struct, forbid_unknown_fields=True):
    sizes: list[str | int] = msgspec.field(default_factory=lambda: ["5m", "1h", "24h"])
    buckets_per_window: int = 12
    user_buckets: int = 128

    def __post_init__(self) -> None:
        if not self.sizes:
            raise ValueError("sizes must name at least one window")
        for size in self.sizes:
            if _duration("sizes", size) < 1000:
                raise ValueError(f"sizes: window {size!r} is shorter than 1s")
        if not 1 <= self.buckets_per_window <= 1000:
            raise ValueError("buckets_per_window must be in 1..1000")
        if not 2 <= self.user_buckets <= 4096:
            raise ValueError("user_buckets must be in 2..4096")

    def sizes_ms(self) -> list[int]:
        return sorted({_duration("sizes", s) for s in self.sizes})

    def sizes_label(self) -> str:
        """The label of the shortest window, as exported (e.g. ``5m``)."""
        shortest = min(self.sizes, key=lambda s: _duration("sizes", s))
        return shortest.strip() if isinstance(shortest, str) else format_duration_ms(shortest)


def _check_split(split: dict[str, float]) -> None:
    """Shares are >= 0 and, when given, some is > 0 (an all-zero split expects no traffic
    anywhere: the SRM test would be NaN)."""
    if any(s < 0 for s in split.values()):
        raise ValueError("split shares must be >= 0")
    if split and not any(s > 0 for s in split.values()):
        raise ValueError("split: at least one share must be > 0")


class ExperimentSettings(msgspec.Struct, forbid_unknown_fields=True):
    control: str = ""
    """Control variant of this experiment; empty: its alphabetically first variant."""
    variants: list[str] = msgspec.field(default_factory=list)
    """The experiment's variants; empty: every variant."""
    split: dict[str, float] = msgspec.field(default_factory=dict)
    """Expected traffic share per variant for the SRM test; empty: equal split."""
    start: str | int = ""
    """Impressions from this instant on count (ISO 8601 with a zone, or epoch ms);
    empty: from the first exposure seen."""
    end: str | int = ""
    """Impressions from this instant on no longer count, and the experiment's
    per-user exposure records are dropped once the data passes it; empty: open."""

    def __post_init__(self) -> None:
        start, end = self.start_ms(), self.end_ms()
        if start is not None and end is not None and end <= start:
            raise ValueError("end must be after start")
        _check_split(self.split)

    def start_ms(self) -> int | None:
        return _instant("start", self.start)

    def end_ms(self) -> int | None:
        return _instant("end", self.end)


MAX_VARIANTS = 200
"""The most variants exported by name (each multiplies the A/B and window series)."""


class ABSettings(msgspec.Struct, forbid_unknown_fields=True):
    control: str = ""
    """The control variant; empty: the alphabetically first variant seen."""
    alpha: float = 0.05
    tuning: float = 5000.0
    """N* of the always-valid test: the sample size where its interval is tightest."""
    max_variants: int = 20
    variants: list[str] = msgspec.field(default_factory=list)
    """Allow-list of variants exported as labels; others are folded into ``other``."""
    split: dict[str, float] = msgspec.field(default_factory=dict)
    """Expected traffic share per variant for the SRM test; empty: equal split."""
    experiments: dict[str, ExperimentSettings] = msgspec.field(default_factory=dict)
    """Named experiments, each with its own control and split; empty: one experiment
    ``default`` over all variants with ``control`` and ``split`` above."""
    min_users: int = 1000
    """No interval or p-value for an arm until it and its control have this many
    exposed users (the variance estimate is unreliable below; see docs/statistics.md)."""
    exposure_ttl: str | int = "30d"
    """A user's exposure record is kept this long (data time) after their first
    exposure, then dropped: memory stays bounded by the users of the last 30 days, and a
    user still active later is counted again, once per period (0: for the experiment's
    whole life; experiments with an ``end`` drop theirs at the end anyway)."""
    min_effective_buckets: float = 16.0
    """... nor while the arm's requests sit in fewer effective user buckets than this
    ((Σ n_b)² / Σ n_b²: a few heavy users dominating makes the variance unreliable)."""

    def __post_init__(self) -> None:
        if self.min_users < 2:
            raise ValueError("min_users must be >= 2")
        if self.min_effective_buckets < 2:
            raise ValueError("min_effective_buckets must be >= 2")
        for name in self.experiments:
            if not name or any(c in name for c in "\x1e\x1f\n"):
                raise ValueError(f"experiments: bad experiment name {name!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.tuning <= 0:
            raise ValueError("tuning must be > 0")
        if not 1 <= self.max_variants <= MAX_VARIANTS:
            raise ValueError(f"max_variants must be in 1..{MAX_VARIANTS} (a label's values)")
        _check_split(self.split)
        _duration("exposure_ttl", self.exposure_ttl)

    def experiment_list(self) -> tuple[Experiment, ...]:
        """The configured experiments, or the one ``default`` experiment."""
        return experiments_from(
            {
                name: (e.control, e.variants, e.split, e.start_ms(), e.end_ms())
                for name, e in self.experiments.items()
            },
            self.control,
            self.split,
        )


class HttpSettings(msgspec.Struct, forbid_unknown_fields=True):
    host: str = "0.0.0.0"
    port: int = 9108
    """/metrics, /healthz and /readyz; 0 disables the server."""
    refresh_interval: str | int = "5s"
    """Window metrics are recomputed in the background this often; 0: at every scrape."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        _duration("refresh_interval", self.refresh_interval)


class Settings(msgspec.Struct, forbid_unknown_fields=True):
    """The whole configuration; see ``docs/configuration.md``."""

    events: EventsSettings = msgspec.field(default_factory=EventsSettings)
    join: JoinSettings = msgspec.field(default_factory=JoinSettings)
    relevance: RelevanceSettings = msgspec.field(default_factory=RelevanceSettings)
    metrics: MetricsSettings = msgspec.field(default_factory=MetricsSettings)
    propensity: PropensitySettings = msgspec.field(default_factory=PropensitySettings)
    cold_start: ColdStartSettings = msgspec.field(default_factory=ColdStartSettings)
    event_time: EventTimeSettings = msgspec.field(default_factory=EventTimeSettings)
    windows: WindowSettings = msgspec.field(default_factory=WindowSettings)
    kafka: KafkaSettings = msgspec.field(default_factory=KafkaSettings)
    redis: RedisSettings = msgspec.field(default_factory=RedisSettings)
    ab: ABSettings = msgspec.field(default_factory=ABSettings)
    http: HttpSettings = msgspec.field(default_factory=HttpSettings)

    def __post_init__(self) -> None:
        lateness = self.event_time.ms("allowed_lateness")
        out_of_order = self.event_time.ms("max_out_of_orderness")
        pending_ms = deadline_ms(0, self.join.rules(), lateness) + out_of_order
        if _duration("state_ttl", self.redis.state_ttl) <= pending_ms:
            raise ValueError(
                f"redis.state_ttl ({self.redis.state_ttl}) must be longer than a request "
                f"stays open ({pending_ms // 1000}s: join.attribution_window + "
                "join.max_clock_skew + event_time.allowed_lateness + "
                "event_time.max_out_of_orderness)"
            )
        if self.ab.min_effective_buckets > self.windows.user_buckets:
            raise ValueError(
                f"ab.min_effective_buckets ({self.ab.min_effective_buckets}) exceeds "
                f"windows.user_buckets ({self.windows.user_buckets}): inference would never start"
            )
        if self.windows.user_buckets % self.redis.shards:
            raise ValueError(
                f"windows.user_buckets ({self.windows.user_buckets}) must be a multiple of "
                f"redis.shards ({self.redis.shards})"
            )

    def layout(self, partitions: int | None = None) -> AggregateLayout:
        """The aggregate layout. ``partitions``: the partition-owned engine's, one shard
        per input partition (so a partition's owner writes only its own blocks), with
        ``windows.user_buckets`` rounded up to a multiple of the partition count."""
        shards, user_buckets = self.redis.shards, self.windows.user_buckets
        if partitions is not None:
            shards = partitions
            user_buckets = partitions * -(-user_buckets // partitions)
        return AggregateLayout(
            ks=tuple(self.metrics.k),
            windows_ms=tuple(self.windows.sizes_ms()),
            buckets_per_window=self.windows.buckets_per_window,
            user_buckets=user_buckets,
            shards=shards,
        )

    def finalise_config(
        self, curve: tuple[float, ...] | None = None, partitions: int | None = None
    ) -> FinaliseConfig:
        return FinaliseConfig(
            rules=self.join.rules(),
            scoring=self.scoring(curve),
            propensity_positions=self.propensity.positions if self.propensity.collect else 0,
            layout=self.layout(partitions),
            min_relevant_history=self.cold_start.min_relevant_history,
            allowed_lateness_ms=self.event_time.ms("allowed_lateness"),
        )

    def scoring(self, curve: tuple[float, ...] | None = None) -> ScoringConfig:
        return ScoringConfig(
            ks=tuple(self.metrics.k),
            gain=self.metrics.gain,
            propensity=self.propensity.build(curve),
            propensity_clip=self.propensity.clip,
        )
