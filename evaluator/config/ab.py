"""Configuration sections of the A/B readout: experiments, their control and split.

Plain msgspec structs (see :mod:`evaluator.config.settings`); a ``ValueError`` raised here
becomes a one-line ``ConfigError`` naming the key.
"""

from __future__ import annotations

import msgspec

from evaluator.core.ab.cuped import DAY_MS
from evaluator.core.experiments import Experiment, experiments_from
from evaluator.core.timeutil import setting_instant_ms, setting_ms


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
        return setting_instant_ms("start", self.start)

    def end_ms(self) -> int | None:
        return setting_instant_ms("end", self.end)


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
    exposure_ttl: str | int = 0
    """No longer used: exposed users are kept for the experiment's life, 8 bytes each
    (see docs/statistics.md). Accepted so that older configuration files still load; a
    value other than 0 is reported at start-up."""
    cuped_lookback: str | int = "14d"
    """CUPED's pre-exposure period: a user's covariate is their count of relevant
    interactions on the whole days of this span before the day of their exposure
    (rounded down to days; 0: no CUPED readout). See docs/statistics.md."""
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
        setting_ms("exposure_ttl", self.exposure_ttl)
        lookback = setting_ms("cuped_lookback", self.cuped_lookback)
        if lookback and lookback < DAY_MS:
            raise ValueError("cuped_lookback must be 0 or at least 1d (whole days)")

    def cuped_lookback_days(self) -> int:
        """Whole days of CUPED's pre-exposure period (0: none)."""
        return setting_ms("cuped_lookback", self.cuped_lookback) // DAY_MS

    def deprecated(self) -> list[str]:
        """What in these settings is accepted but no longer used, one line each."""
        if setting_ms("exposure_ttl", self.exposure_ttl):
            return [
                "ab.exposure_ttl is no longer used: each experiment keeps its exposed "
                "users for its whole life (8 bytes a user)"
            ]
        return []

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
