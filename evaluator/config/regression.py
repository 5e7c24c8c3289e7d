"""The ``[regression]`` section: the regression detector's slot, baseline and budget.

A plain msgspec struct (see :mod:`evaluator.config.settings`); a ``ValueError`` raised
here becomes a one-line ``ConfigError`` naming the key. The detector itself is
:mod:`evaluator.core.regression` (docs/statistics.md explains it).
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from evaluator.core.regression import HOUR_MS, WEEK_MS, RegressionRules
from evaluator.core.timeutil import setting_ms


class Provisional(NamedTuple):
    """Provisional scoring (lead 0: off): at ``at_ms`` after the impression, with the
    interactions of its first ``age_ms``; slotted at ``key_ms`` after the impression,
    ``lead`` whole slots before its deadline, so provisional slot ``s`` holds exactly
    the requests of final slot ``s + lead`` (and is complete ``at_ms - key_ms`` after
    its end)."""

    lead: int
    age_ms: int
    at_ms: int
    key_ms: int


class RegressionSettings(msgspec.Struct, forbid_unknown_fields=True):
    enabled: bool = True
    """Keep the per-slot history and export the detector's series."""
    slot: str | int = "5m"
    """The unit the detector compares: requests finalised in one slot (divides an hour)."""
    baseline_weeks: int = 3
    """Weeks of the same time of week the baseline averages (armed after one)."""
    neighbourhood: str | int = "30m"
    """Each baseline week contributes the slots this far either side of the same time."""
    false_alarms_per_30d: float = 0.25
    """The false-alarm budget per variant and 30 days (split over the cutoffs K)."""
    shift: float = 2.0
    """The drop, in standard deviations of one slot's residual, detected fastest."""
    min_requests: int = 20
    """Slots with fewer requests (or baselines with fewer) are skipped."""
    span: str | int = "24h"
    """The CUSUM is recomputed over this much of the latest slots at each readout."""
    provisional_age: str | int = "2m"
    """Requests are also scored with the interactions of their first this long, before
    they are final (provisional nDCG; once allowed lateness and clock skew have passed
    too); 0 turns it off."""
    maturity_ages: list[str | int] = msgspec.field(
        default_factory=lambda: ["1m", "2m", "5m", "10m", "20m"]
    )
    """Ages at which finalised requests are scored again for the maturity curve (those
    not shorter than the attribution window are left out); [] turns it off."""

    def __post_init__(self) -> None:
        slot = setting_ms("slot", self.slot)
        if slot < 60_000 or HOUR_MS % slot:
            raise ValueError("slot must be at least 1m and divide an hour (1m, 5m, 10m, ...)")
        if not 1 <= self.baseline_weeks <= 12:
            raise ValueError("baseline_weeks must be in 1..12")
        around = setting_ms("neighbourhood", self.neighbourhood)
        if around % slot or around > 12 * HOUR_MS:
            raise ValueError("neighbourhood must be a multiple of slot, at most 12h")
        if not 0 < self.false_alarms_per_30d <= 30:
            raise ValueError("false_alarms_per_30d must be in (0, 30]")
        if not 0 < self.shift <= 10:
            raise ValueError("shift must be in (0, 10]")
        if self.min_requests < 1:
            raise ValueError("min_requests must be >= 1")
        span = setting_ms("span", self.span)
        if not slot <= span <= WEEK_MS:
            raise ValueError("span must be between slot and 7d")
        if setting_ms("provisional_age", self.provisional_age) < 0:
            raise ValueError("provisional_age must be >= 0")
        ages = [setting_ms("maturity_ages", a) for a in self.maturity_ages]
        if len(ages) > 12 or any(a <= 0 for a in ages) or ages != sorted(set(ages)):
            raise ValueError("maturity_ages must be at most 12 increasing positive durations")

    def maturity_ages_ms(self, window_ms: int) -> tuple[int, ...]:
        """The maturity curve's ages shorter than the attribution window (none when the
        detector is disabled)."""
        ages = (setting_ms("maturity_ages", a) for a in self.maturity_ages)
        return tuple(a for a in ages if a < window_ms) if self.enabled else ()

    def provisional(self, window_ms: int, delay_ms: int, fixed_ms: int) -> Provisional:
        """When requests are scored early: ``provisional_age`` after the impression plus
        ``fixed_ms`` (clock skew and allowed lateness, as for a deadline, which is
        ``delay_ms`` after it; interactions count up to ``window_ms`` after it)."""
        slot = setting_ms("slot", self.slot)
        age = setting_ms("provisional_age", self.provisional_age)
        if not (self.enabled and 0 < age < window_ms):
            return Provisional(0, 0, 0, 0)
        at = age + fixed_ms
        lead = -(-(delay_ms - at) // slot)  # slots from the provisional key to the deadline
        return Provisional(lead, age, at, delay_ms - lead * slot)

    def rules(
        self,
        ks: tuple[int, ...],
        early: Provisional | None = None,
        maturity_ages_ms: tuple[int, ...] = (),
    ) -> RegressionRules:
        slot = setting_ms("slot", self.slot)
        early = early or Provisional(0, 0, 0, 0)
        return RegressionRules(
            ks=ks,
            slot_ms=slot,
            baseline_weeks=self.baseline_weeks,
            neighbourhood_slots=setting_ms("neighbourhood", self.neighbourhood) // slot,
            false_alarms_per_30d=self.false_alarms_per_30d,
            shift=self.shift,
            min_requests=self.min_requests,
            span_ms=setting_ms("span", self.span),
            lead_slots=early.lead,
            age_ms=early.age_ms,
            ready_ms=early.at_ms - early.key_ms,
            maturity_ages_ms=maturity_ages_ms,
        )

    def keep_ms(self, ks: tuple[int, ...]) -> int:
        """How long the stores keep the history (0: disabled, none kept)."""
        return self.rules(ks).history_ms if self.enabled else 0
