"""Daily and weekly cycles and an injected regression for the traffic simulator (pure).

Live traffic is not steady: requests swing with the hour and drop at weekends, and
users click more at some hours than at others. A detector or a sliding-window metric
has to tell that seasonality from a real regression, so the simulator can reproduce
both, with a known ground truth:

* rate multiplier ``m(t) = (1 + a * cos(2π (t - peak) / 1 day)) * w(t)`` with
  ``w(t) = 1 - dip`` on Saturdays and Sundays (UTC) and 1 otherwise; requests arrive
  at ``requests_per_second * m(t)``;
* relevance multiplier ``r(t) = 1 + b * cos(2π (t - peak) / 1 day)``: every shown
  item's click probability ``gamma`` becomes ``min(gamma * r(t), 1)``;
* a regression: from its start on, one variant's ``gamma`` is multiplied by
  ``1 - drop`` as well, so a detector's delay is measured from a known instant.

Times are integer epoch milliseconds; ``t`` is UTC, so ``peak`` is a time of day.
Every setting is off by default (a steady rate and relevance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
EPOCH_WEEKDAY = 3
"""1970-01-01 was a Thursday (Monday is 0, as in ``datetime.weekday``)."""

_LIMITS: dict[str, tuple[float, float, bool]] = {
    "daily_amplitude": (0.0, 1.0, False),
    "weekly_dip": (0.0, 1.0, False),
    "relevance_amplitude": (0.0, 1.0, True),
    "peak_ms": (0.0, float(DAY_MS), False),
    "drop": (0.0, 1.0, True),
}
"""Season and regression settings: (lowest, highest, whether the highest is allowed).
A rate multiplier must stay positive, hence amplitude and dip below 1."""


def out_of_range(name: str, value: float) -> str | None:
    """Why ``value`` cannot be the setting ``name`` (None: it can), e.g. for a flag's error."""
    low, high, closed = _LIMITS[name]
    if low <= value < high or (closed and value == high):
        return None
    return f"must be in [{low:g}, {high:g}{']' if closed else ')'}, got {value!r}"


def _check(item: Seasons | Regression) -> None:
    for spec in fields(item):
        reason = out_of_range(spec.name, getattr(item, spec.name)) if spec.name in _LIMITS else None
        if reason is not None:
            raise ValueError(f"{spec.name} {reason}")


def daily_wave(times_ms: IntArray, amplitude: float, peak_ms: int) -> FloatArray:
    """``1 + amplitude * cos(2π (t - peak_ms) / 1 day)`` per time: 1 + amplitude at the
    peak, 1 - amplitude twelve hours later, a mean of 1 over any whole day."""
    phase = np.mod(times_ms - peak_ms, DAY_MS) / DAY_MS
    wave: FloatArray = 1.0 + amplitude * np.cos(2.0 * np.pi * phase)
    return wave


def is_weekend(t_ms: float) -> bool:
    """Whether ``t_ms`` falls on a Saturday or a Sunday (UTC)."""
    return (math.floor(t_ms / DAY_MS) + EPOCH_WEEKDAY) % 7 >= 5


@dataclass(frozen=True, slots=True)
class Seasons:
    """The daily and weekly cycles of traffic and relevance (off by default)."""

    daily_amplitude: float = 0.0
    """The request rate's daily wave: x ``1 + daily_amplitude * cos(...)``, in [0, 1)."""
    weekly_dip: float = 0.0
    """Share by which the request rate is lower on Saturdays and Sundays, in [0, 1)."""
    relevance_amplitude: float = 0.0
    """The click probability's daily wave: x ``1 + relevance_amplitude * cos(...)``,
    clipped to 1, in [0, 1]."""
    peak_ms: int = 20 * HOUR_MS
    """Time of day (ms after midnight UTC) at which both daily waves peak (the evening)."""

    def __post_init__(self) -> None:
        _check(self)

    @property
    def steady(self) -> bool:
        """No cycle at all: a steady rate and relevance."""
        return self.steady_rate and self.steady_relevance

    @property
    def steady_rate(self) -> bool:
        return self.daily_amplitude == 0 and self.weekly_dip == 0

    @property
    def steady_relevance(self) -> bool:
        return self.relevance_amplitude == 0

    def rate_factor(self, t_ms: float) -> float:
        """The request rate's multiplier ``m(t)`` at ``t_ms``: daily wave x weekend dip."""
        phase = ((t_ms - self.peak_ms) % DAY_MS) / DAY_MS
        daily = 1.0 + self.daily_amplitude * math.cos(2.0 * math.pi * phase)
        return daily * (1.0 - self.weekly_dip if is_weekend(t_ms) else 1.0)

    def next_ms(self, t_ms: float, gap_ms: float) -> float:
        """The next arrival after ``t_ms`` for an inter-arrival ``gap_ms`` drawn at the
        base rate: the time change ``dt = d(gap) / m(t)``, midpoint rule (exact for a
        steady rate; the error is negligible while gaps are short against an hour)."""
        if self.steady_rate:
            return t_ms + gap_ms
        half = t_ms + gap_ms / (2.0 * self.rate_factor(t_ms))
        return t_ms + gap_ms / self.rate_factor(half)

    def arrivals(self, clock_ms: float, gaps_ms: FloatArray) -> tuple[IntArray, float]:
        """Event times (integer ms) of requests after ``clock_ms`` whose inter-arrival
        gaps at the base rate are ``gaps_ms`` (:meth:`next_ms` in turn), and the clock
        after the last."""
        stamps = np.empty(gaps_ms.size, dtype=np.int64)
        for j, gap in enumerate(gaps_ms.tolist()):
            clock_ms = self.next_ms(clock_ms, gap)
            stamps[j] = int(clock_ms)
        return stamps, clock_ms

    def relevance_factor(self, times_ms: IntArray) -> FloatArray:
        """The click probability's multiplier ``r(t)`` per request time."""
        return daily_wave(times_ms, self.relevance_amplitude, self.peak_ms)


@dataclass(frozen=True, slots=True)
class Regression:
    """An injected regression: from ``after_ms`` of event time after the simulation's
    start, every item one variant shows is clicked with ``1 - drop`` times its
    probability (interleaving: the items its team placed). ``drop`` 0 is a placebo,
    for a detector's false alarms."""

    variant: str
    drop: float
    after_ms: int = 0

    def __post_init__(self) -> None:
        _check(self)
        if self.after_ms < 0:
            raise ValueError(f"after_ms must be >= 0, got {self.after_ms}")
        if not self.variant:
            raise ValueError("a regression needs a variant")

    def start_ms(self, simulation_start_ms: int) -> int:
        """Epoch ms from which the regression applies."""
        return simulation_start_ms + self.after_ms

    def factor(self, times_ms: IntArray, simulation_start_ms: int) -> FloatArray:
        """The affected variant's relevance multiplier per request time: ``1 - drop``
        from the start on, 1 before."""
        after = times_ms >= self.start_ms(simulation_start_ms)
        factor: FloatArray = np.where(after, 1.0 - self.drop, 1.0)
        return factor
