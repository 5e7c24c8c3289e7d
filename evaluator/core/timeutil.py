"""Time values inside the core: integer epoch milliseconds and durations in milliseconds."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(value: str | int) -> int:
    """Parse ``"30m"``, ``"5s"``, ``"250ms"``, ``"1.5h"`` or an integer of milliseconds.

    Raises ``ValueError`` for anything else, including negative durations.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"negative duration: {value}")
        return value
    match = _DURATION.match(value)
    if match is None:
        raise ValueError(f"not a duration: {value!r} (use e.g. 250ms, 5s, 30m, 24h, 7d)")
    number, unit = match.groups()
    return round(float(number) * _UNIT_MS[unit or "ms"])


def format_duration_ms(ms: int) -> str:
    """Shortest exact spelling of a duration, e.g. 1800000 -> ``"30m"``."""
    for unit in ("d", "h", "m", "s"):
        size = _UNIT_MS[unit]
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def datetime_to_ms(value: datetime) -> int:
    """Epoch milliseconds of a timezone-aware datetime (sub-millisecond parts truncated)."""
    return (value - _EPOCH) // _ONE_MS


def format_instant_ms(ms: int) -> str:
    """RFC 3339 UTC spelling of epoch milliseconds, e.g. ``2026-12-01T00:00:00.250Z``."""
    text = (_EPOCH + ms * _ONE_MS).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def parse_instant_ms(value: str | int) -> int:
    """Epoch milliseconds of an ISO 8601 instant with a zone (``2026-12-01T00:00:00Z``)
    or an integer of epoch milliseconds. Raises ``ValueError`` for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"not an instant: {value!r}")
    if isinstance(value, int):
        return value
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not an instant: {value!r} (use e.g. 2026-12-01T00:00:00Z)") from None
    if parsed.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone (add Z or +00:00)")
    return datetime_to_ms(parsed)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)


def setting_ms(key: str, value: str | int) -> int:
    """A duration setting in ms; a ValueError naming ``key`` when it is not one."""
    try:
        return parse_duration_ms(value)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


def setting_instant_ms(key: str, value: str | int) -> int | None:
    """An instant setting in epoch ms (None when empty); a ValueError naming ``key``."""
    if value == "":
        return None
    try:
        return parse_instant_ms(value)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None
