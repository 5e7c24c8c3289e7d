"""Configuration models: the whole configuration (:class:`Settings`) and the sections of
the evaluation itself, with defaults and validation (the services' sections are in
:mod:`evaluator.config.services`, the A/B readout's in :mod:`evaluator.config.ab`).

Plain msgspec structs; reading files and the environment is :mod:`evaluator.config`'s
job. A ``ValueError`` raised here becomes a one-line ``ConfigError`` naming the key.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from evaluator.config.ab import ABSettings
from evaluator.config.regression import Provisional, RegressionSettings
from evaluator.config.services import (
    ENGINE_DEFAULTS,
    EngineSettings,
    HttpSettings,
    KafkaSettings,
    RedisSettings,
)
from evaluator.core.finalise import FinaliseConfig, deadline_ms
from evaluator.core.join import JoinRules
from evaluator.core.metrics.spec import GainKind
from evaluator.core.propensity.estimation import Estimator
from evaluator.core.propensity.models import (
    EstimatedCurve,
    NoBias,
    PropensityModel,
    parse_propensity,
)
from evaluator.core.relevance import BUILTIN_PROFILES, ProfileKind, RelevanceProfile
from evaluator.core.scoring import METRICS, ScoringConfig
from evaluator.core.timeutil import format_duration_ms, setting_ms
from evaluator.core.windows import AggregateLayout

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
            setting_ms("attribution_window", self.attribution_window),
            setting_ms("max_clock_skew", self.max_clock_skew),
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
                setting_ms("target_duration", spec.target_duration),
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
        return setting_ms("history", self.history)

    def __post_init__(self) -> None:
        if self.history_ms() < 86_400_000 or self.history_ms() % 86_400_000:
            raise ValueError(f"history must be whole days, at least 1d, got {self.history!r}")
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
            return EstimatedCurve(curve) if curve else NoBias()
        return parse_propensity(self.model)


class ColdStartSettings(msgspec.Struct, forbid_unknown_fields=True):
    min_relevant_history: int = 3

    def __post_init__(self) -> None:
        if self.min_relevant_history < 0:
            raise ValueError("min_relevant_history must be >= 0")


class EventTimeSettings(msgspec.Struct, forbid_unknown_fields=True):
    max_out_of_orderness: str | int = "5s"
    idle_timeout: str | int = "30s"
    allowed_lateness: str | int = "1m"
    max_future: str | int = "1m"
    """An event stamped later than the consuming clock's now + this is invalid
    (``future_timestamp``); 0 turns the check off. NTP-synced clocks differ by
    seconds; an accepted event moves its partition's watermark at most this far
    ahead of the clock, which ``allowed_lateness`` absorbs while it is not shorter."""

    def __post_init__(self) -> None:
        for name in ("max_out_of_orderness", "idle_timeout", "allowed_lateness", "max_future"):
            setting_ms(name, getattr(self, name))

    def ms(self, name: str) -> int:
        return setting_ms(name, getattr(self, name))


class WindowSettings(msgspec.Struct, forbid_unknown_fields=True):
    sizes: list[str | int] = msgspec.field(default_factory=lambda: ["5m", "1h", "24h"])
    buckets_per_window: int = 12
    user_buckets: int = 128

    def __post_init__(self) -> None:
        if not self.sizes:
            raise ValueError("sizes must name at least one window")
        for size in self.sizes:
            if setting_ms("sizes", size) < 1000:
                raise ValueError(f"sizes: window {size!r} is shorter than 1s")
        if not 1 <= self.buckets_per_window <= 1000:
            raise ValueError("buckets_per_window must be in 1..1000")
        if not 2 <= self.user_buckets <= 4096:
            raise ValueError("user_buckets must be in 2..4096")

    def sizes_ms(self) -> list[int]:
        return sorted({setting_ms("sizes", s) for s in self.sizes})

    def sizes_label(self) -> str:
        """The label of the shortest window, as exported (e.g. ``5m``)."""
        shortest = min(self.sizes, key=lambda s: setting_ms("sizes", s))
        return shortest.strip() if isinstance(shortest, str) else format_duration_ms(shortest)


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
    engine: EngineSettings = msgspec.field(default_factory=EngineSettings)
    ab: ABSettings = msgspec.field(default_factory=ABSettings)
    regression: RegressionSettings = msgspec.field(default_factory=RegressionSettings)
    http: HttpSettings = msgspec.field(default_factory=HttpSettings)

    def __post_init__(self) -> None:
        self._engine_aliases()
        lateness = self.event_time.ms("allowed_lateness")
        out_of_order = self.event_time.ms("max_out_of_orderness")
        pending_ms = deadline_ms(0, self.join.rules(), lateness) + out_of_order
        if setting_ms("state_ttl", self.redis.state_ttl) <= pending_ms:
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

    def _engine_aliases(self) -> None:
        """``[redis]`` still takes the engine settings' old names: each value is read
        from either section (they must agree) and shown in both."""
        for name in ("checkpoint_interval", "finalised_ttl"):
            new, old = getattr(self.engine, name), getattr(self.redis, name)
            if (
                new is not None
                and old is not None
                and setting_ms(name, new) != setting_ms(name, old)
            ):
                raise ValueError(
                    f"engine.{name} ({new}) and its old name redis.{name} ({old}) disagree: "
                    f"keep engine.{name}"
                )
            value = new if new is not None else old
            if value is None:
                value = ENGINE_DEFAULTS[name]
            setattr(self.engine, name, value)
            setattr(self.redis, name, value)

    def layout(self, partitions: int | None = None) -> AggregateLayout:
        """The aggregate layout. ``partitions``: the partition-owned engine's, one shard
        per input partition (so a partition's owner writes only its own blocks), with
        ``windows.user_buckets`` rounded up to a multiple of the partition count."""
        shards, user_buckets = self.redis.shards, self.windows.user_buckets
        if partitions is not None:
            shards = partitions
            user_buckets = partitions * -(-user_buckets // partitions)
        ks = tuple(self.metrics.k)
        early = self.provisional()
        return AggregateLayout(
            ks=ks,
            windows_ms=tuple(self.windows.sizes_ms()),
            buckets_per_window=self.windows.buckets_per_window,
            user_buckets=user_buckets,
            shards=shards,
            history_slot_ms=setting_ms("slot", self.regression.slot),
            history_keep_ms=self.regression.keep_ms(ks),
            provisional_ms=early.at_ms,
            provisional_age_ms=early.age_ms,
            provisional_key_ms=early.key_ms,
            maturity_ages_ms=self.maturity_ages_ms(),
        )

    def maturity_ages_ms(self) -> tuple[int, ...]:
        """The maturity curve's ages (see ``[regression]``)."""
        return self.regression.maturity_ages_ms(self.join.rules().attribution_window_ms)

    def provisional(self) -> Provisional:
        """When requests are scored early for provisional nDCG (see ``[regression]``)."""
        rules = self.join.rules()
        lateness = self.event_time.ms("allowed_lateness")
        delay = deadline_ms(0, rules, lateness)
        fixed = rules.max_clock_skew_ms + lateness
        return self.regression.provisional(rules.attribution_window_ms, delay, fixed)

    def finalise_config(
        self,
        curve: tuple[float, ...] | None = None,
        partitions: int | None = None,
        layout: AggregateLayout | None = None,
    ) -> FinaliseConfig:
        """Finalisation's plain values; ``layout``: the store's (grown over stored
        state, :func:`evaluator.core.windows.resume`), default a fresh one."""
        return FinaliseConfig(
            rules=self.join.rules(),
            scoring=self.scoring(curve),
            propensity_positions=self.propensity.positions if self.propensity.collect else 0,
            layout=layout or self.layout(partitions),
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
