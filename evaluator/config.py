"""Configuration: one TOML file, ``EVALUATOR_*`` environment overrides, then CLI flags.

Every setting has a default, so an empty file is a valid configuration. Any
error becomes a :class:`ConfigError` whose message names the offending key.
This module reads files and the environment only when asked to by the
composition root (the CLI); the core receives plain values.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from evaluator.join import JoinRules
from evaluator.metrics.ndcg import GainKind
from evaluator.propensity import PropensityModel, parse_propensity
from evaluator.relevance import BUILTIN_PROFILES, ProfileKind, RelevanceProfile
from evaluator.scoring import ScoringConfig
from evaluator.timeutil import parse_duration_ms

ENV_PREFIX = "EVALUATOR_"


class ConfigError(Exception):
    """Invalid configuration; the message is one line that names the key."""


def _duration(key: str, value: str | int) -> int:
    try:
        return parse_duration_ms(value)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


class EventsSettings(msgspec.Struct, forbid_unknown_fields=True):
    max_list_length: int = 1000

    def __post_init__(self) -> None:
        if self.max_list_length < 1:
            raise ValueError("max_list_length must be >= 1")


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
        self.k = sorted(set(self.k))
        if self.catalog_size < 0:
            raise ValueError("catalog_size must be >= 0")
        bad = [n for n in self.composite if not re.fullmatch(r"[a-z_]+(@\d+)?", n)]
        if bad:
            raise ValueError(f"composite: bad metric name(s) {bad}; use e.g. 'ndcg@10'")


class PropensitySettings(msgspec.Struct, forbid_unknown_fields=True):
    model: str | list[float] = "none"
    """``none``, ``power(ETA)`` or a list of per-position propensities."""
    clip: float = 0.05

    def __post_init__(self) -> None:
        self.build()
        if not 0 < self.clip <= 1:
            raise ValueError(f"clip must be in (0, 1], got {self.clip}")

    def build(self) -> PropensityModel:
        return parse_propensity(self.model)


class ColdStartSettings(msgspec.Struct, forbid_unknown_fields=True):
    min_relevant_history: int = 3

    def __post_init__(self) -> None:
        if self.min_relevant_history < 0:
            raise ValueError("min_relevant_history must be >= 0")


class Settings(msgspec.Struct, forbid_unknown_fields=True):
    """The whole configuration; see ``docs/configuration.md``."""

    events: EventsSettings = msgspec.field(default_factory=EventsSettings)
    join: JoinSettings = msgspec.field(default_factory=JoinSettings)
    relevance: RelevanceSettings = msgspec.field(default_factory=RelevanceSettings)
    metrics: MetricsSettings = msgspec.field(default_factory=MetricsSettings)
    propensity: PropensitySettings = msgspec.field(default_factory=PropensitySettings)
    cold_start: ColdStartSettings = msgspec.field(default_factory=ColdStartSettings)

    def scoring(self) -> ScoringConfig:
        return ScoringConfig(
            ks=tuple(self.metrics.k),
            gain=self.metrics.gain,
            propensity=self.propensity.build(),
            propensity_clip=self.propensity.clip,
        )


def _parse_env_value(text: str) -> Any:
    """Interpret an environment value as a TOML value when it is one, else as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(path)}: {part} is not a table")
        node = child
    node[path[-1]] = value


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """``EVALUATOR_JOIN__ATTRIBUTION_WINDOW=10m`` -> ``{"join": {"attribution_window": "10m"}}``."""
    tree: dict[str, Any] = {}
    for name, text in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        _set_path(tree, path, _parse_env_value(text))
    return tree


def merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` into a copy of ``base``."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$\.?(?P<path>[^`]*)`)?$", re.DOTALL)


def build_settings(tree: Mapping[str, Any]) -> Settings:
    """Validate a configuration tree; errors name the key."""
    try:
        return msgspec.convert(dict(tree), Settings, strict=False)
    except msgspec.ValidationError as exc:
        match = _AT.match(str(exc))
        assert match is not None
        path = match.group("path") or "(top level)"
        message = match.group("msg").replace("Object contains unknown field", "unknown key")
        raise ConfigError(f"invalid configuration at {path}: {message}") from None


def load_settings(
    path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """File, then environment, then explicit overrides (CLI flags)."""
    tree: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as handle:
                tree = tomllib.load(handle)
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    tree = merge(tree, env_overrides(os.environ if environ is None else environ))
    if overrides:
        tree = merge(tree, overrides)
    return build_settings(tree)
