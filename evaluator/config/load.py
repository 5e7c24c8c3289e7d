"""Configuration: one TOML file, ``EVALUATOR_*`` environment overrides, then CLI flags.

Every setting has a default, so an empty file is a valid configuration. Any
error becomes a :class:`ConfigError` whose message names the offending key.
This module reads files and the environment only when asked to by the
composition root (the CLI); the core receives plain values.
"""

from __future__ import annotations

import datetime
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from evaluator.config.ab import ABSettings, ExperimentSettings
from evaluator.config.services import EngineSettings, HttpSettings, KafkaSettings, RedisSettings
from evaluator.config.settings import (
    DEFAULT_COMPOSITE,
    ColdStartSettings,
    EventsSettings,
    EventTimeSettings,
    JoinSettings,
    MetricsSettings,
    ProfileSettings,
    PropensitySettings,
    RelevanceSettings,
    Settings,
    WindowSettings,
)

ENV_PREFIX = "EVALUATOR_"


class ConfigError(Exception):
    """Invalid configuration; the message is one line that names the key."""


SECRET_KEYS = ("password", "sasl_password")


def masked(settings: Settings) -> dict[str, Any]:
    """Settings as plain data with secrets (passwords, credentials in URLs) masked."""
    tree: dict[str, Any] = msgspec.to_builtins(settings)
    for section in tree.values():
        if not isinstance(section, dict):
            continue
        for key in SECRET_KEYS:
            if section.get(key):
                section[key] = "***"
        url = section.get("url")
        if isinstance(url, str):
            section["url"] = re.sub(r"//([^@/]*)@", "//***@", url)
    return tree


def _parse_env_value(text: str, hint: Any = None) -> Any:
    """An environment value for a setting of type ``hint``: read as a TOML value when it
    is one of a type the setting takes besides text (``[5, 10]``, ``0.1``, ``true``, a
    list of propensities), else kept as written (a password of digits, a group id, a
    duration, an instant)."""
    takes = _types(hint)
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    if str in takes and type(value) not in takes - {str}:
        return text
    return value


def _types(hint: Any) -> set[Any]:
    """The plain types a type hint accepts (``str`` for a Literal of strings)."""
    if hint is None:
        return set()
    origin = typing.get_origin(hint)
    if origin is Literal:
        return {type(v) for v in typing.get_args(hint)}
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_types(arg) for arg in typing.get_args(hint)))
    if origin is typing.Annotated:
        return _types(typing.get_args(hint)[0])
    return {origin or hint}


def _env_path(parts: list[str]) -> tuple[list[str], Any]:
    """The configuration path of an environment variable's parts, and the type of the
    setting it names (None when unknown). Settings' own keys are lower-cased. The keys
    of a table the user names (experiments, the variants of a split, profiles, grades)
    keep the case written unless written all in capitals, the usual style of
    environment names (``…__GRADES__CLICK`` is ``click``, ``…__SPLIT__Treatment`` is
    ``Treatment``); :func:`load_tree` also matches them to the file's keys regardless
    of case."""
    node: Any = Settings
    path = []
    for part in parts:
        if isinstance(node, type) and issubclass(node, msgspec.Struct):
            key = part.lower()
            node = typing.get_type_hints(node).get(key)
        elif typing.get_origin(node) is dict:
            key, node = (part.lower() if part.isupper() else part), typing.get_args(node)[1]
        else:
            key, node = part.lower(), None
        path.append(key)
    return path, node


def _match_keys(override: dict[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` with each key that differs from one of ``base`` only by case spelt
    as in ``base`` (so ``EVALUATOR_AB__EXPERIMENTS__HOMEPAGE__CONTROL`` sets the file's
    ``[ab.experiments.Homepage]``)."""
    spelt = {k.casefold(): k for k in base}
    out: dict[str, Any] = {}
    for key, value in override.items():
        name = key if key in base else spelt.get(key.casefold(), key)
        below = base.get(name)
        if isinstance(value, dict) and isinstance(below, Mapping):
            out[name] = _match_keys(value, below)
        else:
            out[name] = value
    return out


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
        path, hint = _env_path(name[len(ENV_PREFIX) :].split("__"))
        _set_path(tree, path, _parse_env_value(text, hint))
    return tree


def _plain(value: Any, path: str = "") -> Any:
    """The tree with TOML dates and times as ISO 8601 text (an instant setting such as
    ``start = 2026-12-01T00:00:00Z`` is read from that text); a number that is not
    finite (``nan``, ``inf``: TOML has both) is a ConfigError naming its key."""
    if isinstance(value, dict):
        return {k: _plain(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"invalid configuration at {path}: {value} is not a finite number")
    return value


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
        settings = msgspec.convert(_plain(dict(tree)), Settings, strict=False)
    except msgspec.ValidationError as exc:
        match = _AT.match(str(exc))
        assert match is not None
        path = match.group("path") or "(top level)"
        message = match.group("msg").replace("Object contains unknown field", "unknown key")
        allowed = _allowed_values(path)
        if allowed and "allowed" not in message:
            message += f" (allowed: {', '.join(allowed)})"
        raise ConfigError(f"invalid configuration at {path}: {message}") from None
    _plain(msgspec.to_builtins(settings))  # text read as a number ("NaN") is a number now
    return settings


def _allowed_values(path: str) -> list[str]:
    """The literal choices of the setting at ``path`` (e.g. ``metrics.gain``), if any."""
    node: Any = Settings
    for part in path.split("."):
        hints = typing.get_type_hints(node) if isinstance(node, type) else {}
        if part not in hints:
            return []
        node = hints[part]
    if typing.get_origin(node) is Literal:
        return [str(v) for v in typing.get_args(node)]
    return []


def load_tree(
    path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The merged configuration tree (file, environment, overrides), not yet validated."""
    tree: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as handle:
                tree = tomllib.load(handle)
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except IsADirectoryError:
            raise ConfigError(f"config file {path} is a directory, not a TOML file") from None
        except PermissionError:
            raise ConfigError(f"config file {path} is not readable (permission denied)") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"config file {path} is not UTF-8 text (byte {exc.start}): TOML must be UTF-8"
            ) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    env = env_overrides(os.environ if environ is None else environ)
    tree = merge(tree, _match_keys(env, tree))
    if overrides:
        tree = merge(tree, overrides)
    return tree


def load_settings(
    path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """File, then environment, then explicit overrides (CLI flags)."""
    return build_settings(load_tree(path, environ, overrides))


__all__ = [
    "DEFAULT_COMPOSITE",
    "ENV_PREFIX",
    "SECRET_KEYS",
    "ABSettings",
    "ColdStartSettings",
    "ConfigError",
    "EngineSettings",
    "EventTimeSettings",
    "EventsSettings",
    "ExperimentSettings",
    "HttpSettings",
    "JoinSettings",
    "KafkaSettings",
    "MetricsSettings",
    "ProfileSettings",
    "PropensitySettings",
    "RedisSettings",
    "RelevanceSettings",
    "Settings",
    "WindowSettings",
    "build_settings",
    "env_overrides",
    "load_settings",
    "load_tree",
    "masked",
    "merge",
]
