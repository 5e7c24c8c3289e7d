"""Shared fixtures: real services (Kafka broker, Redis server) and state stores."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _services_env() -> tuple[dict[str, str], bool]:
    """Settings of running services: from the environment, else `scripts/services.py
    start`; and whether this call started them (then the session stops them). Raises
    RuntimeError with the script's reason if they could not start."""
    given = ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL", "REDIS_CLUSTER_URL")
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS") and os.environ.get("REDIS_URL"):
        return {k: os.environ[k] for k in given if os.environ.get(k)}, False
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "services.py"), "start"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"could not start Kafka and Redis: {proc.stderr.strip()}")
    env = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value
    return env, "services: started" in proc.stderr


def _stop_services() -> None:
    if os.environ.get("KEEP_SERVICES"):
        return
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "services.py"), "stop"],
        capture_output=True,
        check=False,
    )
    _STOPPED.append(True)


_STARTED_FOR_WORKERS: list[bool] = []


def pytest_configure(config: pytest.Config) -> None:
    """With pytest-xdist's workers (``make test`` runs two), the controller starts the
    services once, before the workers, which inherit their settings: workers starting
    them on their own would race for the one state folder. A run without workers
    starts them when its first test needs them."""
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", default=None):
        return
    try:
        env, started = _services_env()
    except RuntimeError as error:
        pytest.exit(str(error), returncode=pytest.ExitCode.INTERNAL_ERROR)
    os.environ.update(env)
    if started:
        _STARTED_FOR_WORKERS.append(True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The controller stops the services it started for its workers."""
    if _STARTED_FOR_WORKERS and not hasattr(session.config, "workerinput"):
        _STARTED_FOR_WORKERS.clear()
        _stop_services()


@pytest.fixture(scope="session")
def services() -> Iterator[dict[str, str]]:
    """The services for the session. Those this session started are stopped at its end
    (ones already running, or given by the environment, are left alone)."""
    try:
        env, started = _services_env()
    except RuntimeError as error:
        pytest.fail(str(error))
    yield env
    if started:
        _stop_services()


_STOPPED: list[bool] = []
"""Set when the session stopped services it started (said in the terminal summary: a
session fixture's teardown runs under the last test's output capture)."""


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _STOPPED:
        terminalreporter.write_line(
            "services: stopped the Kafka broker and Redis servers this test run started "
            "(KEEP_SERVICES=1 keeps them; `make services` starts them for reuse)"
        )


@pytest.fixture(scope="session")
def redis_url(services: dict[str, str]) -> str:
    return services.get("REDIS_URL") or os.environ["REDIS_URL"]


@pytest.fixture(scope="session")
def redis_cluster_url(services: dict[str, str]) -> str:
    """A Redis Cluster node (`scripts/services.py` starts a one-node cluster)."""
    url = services.get("REDIS_CLUSTER_URL") or os.environ.get("REDIS_CLUSTER_URL")
    if not url:
        pytest.skip("REDIS_CLUSTER_URL is not set (given services without a Redis Cluster)")
    return url


@pytest.fixture(scope="session")
def kafka_bootstrap(services: dict[str, str]) -> str:
    return services.get("KAFKA_BOOTSTRAP_SERVERS") or os.environ["KAFKA_BOOTSTRAP_SERVERS"]


@pytest.fixture
def key_prefix() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=["memory", "redis", "redis-cluster"])
def make_store(request: pytest.FixtureRequest, key_prefix: str) -> Iterator:
    """A factory building a fresh state store of each kind for a layout."""
    from evaluator.adapters.memory import MemoryStore

    created = []

    def build(layout, **options):
        if request.param == "memory":
            store = MemoryStore(layout, **options)
        else:
            from evaluator.adapters.redis.store import RedisStore, connect

            cluster = request.param == "redis-cluster"
            url = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
            client = connect(url, cluster=cluster)
            store = RedisStore(client, layout, prefix=key_prefix, **options)
            store.check_layout()
        created.append(store)
        return store

    build.kind = request.param  # type: ignore[attr-defined]
    yield build
    for store in created:
        store.close()
    if created and request.param != "memory":
        cluster = request.param == "redis-cluster"
        url = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
        unlink_prefix(url, key_prefix, cluster=cluster)


@pytest.fixture(autouse=True)
def _delete_live_keys() -> Iterator[None]:
    """After each test, the Redis keys of the live environments it created."""
    from tests.live import CREATED

    yield
    from redis.exceptions import RedisError

    for env in CREATED:
        with contextlib.suppress(OSError, RedisError):  # a test's own server, stopped
            unlink_prefix(env.redis_url, env.name, cluster=env.cluster)
    CREATED.clear()


def unlink_prefix(url: str, prefix: str, *, cluster: bool = False) -> None:
    """Delete every key of a test's prefix: keys of many test runs would otherwise pile
    up in the shared servers until their TTLs (coverage sketches of 12 KB live up to
    49 h; one suite leaves gigabytes)."""
    from evaluator.adapters.redis.store import connect

    client = connect(url, cluster=cluster)
    try:
        pipe = client.pipeline(transaction=False)
        for queued, key in enumerate(client.scan_iter(match=f"{{{prefix}:*", count=1000), 1):
            pipe.unlink(key)
            if queued % 1000 == 0:
                pipe.execute()
        pipe.execute()
    finally:
        client.close()


@pytest.fixture(params=["kafka-python", "confluent"])
def kafka_client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a live test once per Kafka client (``kafka.client``): the evaluator processes
    it starts inherit the setting from the environment."""
    monkeypatch.setenv("EVALUATOR_KAFKA__CLIENT", request.param)
    return str(request.param)
