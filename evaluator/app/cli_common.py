"""What every ``evaluator`` command shares: one-line usage errors, exit codes, the
service flags and the ``--config`` option."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NoReturn


class UsageError(Exception):
    """A usage problem reported in one line with exit code 2."""


EXIT_ERROR = 2
"""Usage, configuration or environment errors (one line on stderr)."""
EXIT_BUG = 1
"""An unexpected internal error (a bug: one line; EVALUATOR_TRACEBACK=1 shows it all)."""


class Parser(argparse.ArgumentParser):
    """Argument errors in one line (exit 2), pointing at ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive(**values: float | None) -> None:
    """Flags that must be positive when given (one line, exit 2)."""
    for name, value in values.items():
        if value is not None and not value > 0:
            raise UsageError(f"--{name} must be positive, got {value}")


def port_free(host: str, port: int) -> int:
    """Refuse a taken or forbidden HTTP port before anything claims to be serving; the
    port to serve on (port 0: one the system picks now, so it can be printed)."""
    import socket

    # the server binds IPv4 (http.server's default family): probe the same
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host or "0.0.0.0", port))
            probe.listen()
        except socket.gaierror as exc:
            raise UsageError(f"http.host {host!r} does not resolve: {exc.strerror}") from None
        except OSError as exc:
            raise UsageError(
                f"cannot serve on {host}:{port} (http.port, --port): {exc.strerror}"
            ) from None
        return int(probe.getsockname()[1])


def service_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """CLI flags for the common service settings (they win over file and environment)."""
    tree: dict[str, Any] = {}
    for flag, section, key in (
        ("bootstrap_servers", "kafka", "bootstrap_servers"),
        ("group_id", "kafka", "group_id"),
        ("redis_url", "redis", "url"),
        ("redis_cluster", "redis", "cluster"),
        ("port", "http", "port"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            tree.setdefault(section, {})[key] = value
    return tree


def add_service_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap-servers", help="Kafka bootstrap servers (kafka.bootstrap_servers)")
    p.add_argument("--group-id", help="Kafka consumer group (kafka.group_id)")
    p.add_argument("--redis-url", help="redis://host:port/db (redis.url)")
    p.add_argument(
        "--redis-cluster",
        action="store_true",
        default=None,
        help="--redis-url names a Redis Cluster node (redis.cluster)",
    )
    p.add_argument("--port", type=int, help="/metrics and dashboard port (http.port)")


def config_option() -> Parser:
    """``--config`` accepted after the subcommand too (it must not reset the top-level one)."""
    parent = Parser(add_help=False)
    parent.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="evaluator.toml")
    return parent
