"""Connecting to Redis (standalone or Cluster): bounded retries, and refused
credentials or unknown hosts as one-line configuration errors."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from evaluator.config import ConfigError

Client = redis.Redis | RedisCluster
"""A standalone Redis client, or a Redis Cluster client (same commands and key layout)."""


ACCESS_REFUSED = (
    "NOAUTH",
    "WRONGPASS",
    "NOPERM",
    "HELLO must be called",
    "invalid username",
    "uthentication",
)
"""Replies meaning the credentials or permissions are wrong (not an outage)."""


@contextlib.contextmanager
def access_errors() -> Iterator[None]:
    """Refused credentials or permissions are a configuration error (one line, exit 2),
    not an outage to wait for."""
    try:
        yield
    except (redis.AuthenticationError, redis.ResponseError, RedisClusterException) as exc:
        if isinstance(exc, redis.AuthenticationError) or any(
            code in str(exc) for code in ACCESS_REFUSED
        ):
            raise ConfigError(
                f"Redis refused access (redis.username, redis.password): {exc}"
            ) from None
        raise


def _resolvable(url: str) -> None:
    """A Redis host that does not exist is a configuration error (one line, exit 2)."""
    host = urlparse(url).hostname
    if not host:
        return
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        if exc.errno == socket.EAI_NONAME:
            raise ConfigError(f"redis.url: host {host!r} does not resolve") from None


def connect(
    url: str,
    *,
    username: str = "",
    password: str = "",
    tls: bool = False,
    ca_certs: str = "",
    retries: int = 5,
    cluster: bool = False,
) -> Client:
    """A client with bounded, exponentially backed-off retries on connection errors.

    ``cluster``: ``url`` names one node of a Redis Cluster; the client discovers the
    others and routes each command (and each script, by its hash-tagged key) to the
    node serving its slot."""
    _resolvable(url)
    retry = Retry(ExponentialBackoff(cap=2.0, base=0.05), retries)
    options: dict[str, Any] = {
        "health_check_interval": 30,
        "socket_timeout": 10,
        "socket_connect_timeout": 5,
    }
    if username:
        options["username"] = username
    if password:
        options["password"] = password
    if tls and url.startswith("redis://"):
        url = "rediss://" + url[len("redis://") :]
    if ca_certs:
        options["ssl_ca_certs"] = ca_certs
    if cluster:  # discovery runs here, and wraps refused credentials in its own error
        with access_errors():
            return RedisCluster.from_url(url, retry=retry, **options)
    retry_on = [redis.ConnectionError, redis.TimeoutError]
    return redis.Redis.from_url(url, retry=retry, retry_on_error=retry_on, **options)
