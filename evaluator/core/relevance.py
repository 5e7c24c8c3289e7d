"""Relevance grading: turn interactions into graded relevance through named profiles.

An item's grade within a request is the maximum grade over the interactions
attributed to it (see :func:`evaluator.core.join.attribute`).
"""

from __future__ import annotations

from typing import Literal

import msgspec

ProfileKind = Literal["table", "binary", "video"]


MAX_GRADE = 100
"""The largest grade: exponential gain ``2^grade − 1`` stays far from overflowing."""


class RelevanceProfile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How interactions map to grades.

    * ``table``: a fixed grade per interaction type; other types are invalid.
    * ``binary``: any interaction type gives grade 1.
    * ``video``: grade = min(1, watch_time / duration), where duration is the event's
      ``duration`` or else ``target_duration_ms``.
    """

    name: str
    kind: ProfileKind = "table"
    grades: dict[str, float] = {}
    target_duration_ms: int = 30_000

    def __post_init__(self) -> None:
        if self.kind == "table" and not self.grades:
            raise ValueError(f"profile {self.name!r}: a table profile needs grades")
        if not all(0 <= g <= MAX_GRADE for g in self.grades.values()):
            raise ValueError(f"profile {self.name!r}: grades must be in 0..{MAX_GRADE}")
        if self.target_duration_ms <= 0:
            raise ValueError(f"profile {self.name!r}: target_duration_ms must be > 0")

    @property
    def max_grade(self) -> float:
        return max(self.grades.values()) if self.kind == "table" else 1.0

    def accepts(self, interaction_type: str) -> bool:
        """Whether this profile grades interactions of this type."""
        return self.kind != "table" or interaction_type in self.grades

    def grade(
        self, interaction_type: str, watch_time: float | None = None, duration: float | None = None
    ) -> float:
        """Grade of one interaction; callers validate with :meth:`accepts` first."""
        if self.kind == "table":
            return self.grades[interaction_type]
        if self.kind == "binary":
            return 1.0
        target = duration if duration is not None else self.target_duration_ms
        return min(1.0, (watch_time or 0.0) / target)


BUILTIN_PROFILES: dict[str, RelevanceProfile] = {
    "ecommerce": RelevanceProfile(
        "ecommerce", grades={"click": 1.0, "add_to_cart": 2.0, "purchase": 3.0}
    ),
    "ecommerce_detailed": RelevanceProfile(
        "ecommerce_detailed", grades={"hover": 1.0, "detail_view": 3.0, "purchase": 5.0}
    ),
    "video": RelevanceProfile("video", kind="video"),
    "binary": RelevanceProfile("binary", kind="binary"),
}
"""Profiles available by name; configuration may define more."""
