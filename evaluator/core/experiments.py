"""Experiments: which variants are compared, from when, and which requests count.

The A/B statistics of an experiment are cumulative from its start, so the
sample only grows and an always-valid interval stays valid however often it is
read (the sliding windows keep serving the monitoring gauges). An impression
counts for an experiment when its variant is one of the experiment's and its
time is in ``[start, end)``; a user counts once, for the variant of their first
such impression (the exposure), which is what the sample-ratio test checks.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

SEP = "\x1f"
"""Between an experiment's name and a variant or user id in store keys and fields."""


@dataclass(frozen=True, slots=True)
class Experiment:
    """Variants compared with one control, their expected split, and the time span."""

    name: str
    variants: frozenset[str] = frozenset()
    """Empty: every variant."""
    control: str = ""
    """Empty: the alphabetically first variant seen."""
    split: Mapping[str, float] = field(default_factory=dict)
    """Expected traffic share per variant; empty: equal."""
    start_ms: int | None = None
    """None: from the first exposure seen."""
    end_ms: int | None = None

    def includes(self, variant: str, t_ms: int) -> bool:
        """Whether an impression of ``variant`` at ``t_ms`` counts for the experiment."""
        if self.variants and variant not in self.variants:
            return False
        if self.start_ms is not None and t_ms < self.start_ms:
            return False
        return self.end_ms is None or t_ms < self.end_ms

    def rows(
        self, variants: Sequence[str], times_ms: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.intp]:
        """Indices of the requests (variant and impression time each) that count."""
        keep = np.ones(len(variants), dtype=bool)
        if self.variants:
            keep &= np.fromiter((v in self.variants for v in variants), bool, len(variants))
        if self.start_ms is not None:
            keep &= times_ms >= self.start_ms
        if self.end_ms is not None:
            keep &= times_ms < self.end_ms
        return np.flatnonzero(keep)

    def expected(self) -> set[str]:
        """The variants the configuration says get traffic: the listed ones, those the
        split gives a share, and the control. An arm that gets none is still an arm
        (its count of 0 is what the sample-ratio test must see)."""
        named = set(self.variants) | {v for v, share in self.split.items() if share > 0}
        return named | {self.control} if self.control else named

    def arms(self, seen: Iterable[str]) -> tuple[str, list[str]]:
        """(control, the other variants) among the variants seen; the control is the
        configured one if seen, else the alphabetically first."""
        members = sorted(v for v in set(seen) if not self.variants or v in self.variants)
        if not members:
            return "", []
        control = self.control if self.control in members else members[0]
        return control, [v for v in members if v != control]


def experiments_from(
    specs: Mapping[str, tuple[str, Sequence[str], Mapping[str, float], int | None, int | None]],
    control: str = "",
    split: Mapping[str, float] | None = None,
) -> tuple[Experiment, ...]:
    """Experiments from ``name -> (control, variants, split, start ms, end ms)``; none
    configured: one ``default`` experiment over every variant from the first exposure."""
    if not specs:
        return (Experiment("default", control=control, split=dict(split or {})),)
    return tuple(
        Experiment(name, frozenset(variants), ctl, dict(sp), start, end)
        for name, (ctl, variants, sp, start, end) in specs.items()
    )


def experiment_rows(
    experiments: Sequence[Experiment], variants: Sequence[str], times: npt.NDArray[np.int64]
) -> dict[str, npt.NDArray[np.intp]]:
    """Per experiment, the indices of the finalised requests (their variants and
    impression times) that count for it."""
    if not experiments or not variants:
        return {}
    out = {e.name: e.rows(variants, times) for e in experiments}
    return {name: rows for name, rows in out.items() if rows.size}
