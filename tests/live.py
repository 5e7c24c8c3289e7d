"""Helpers for end-to-end tests against the real Kafka broker and Redis server."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from evaluator.adapters.redis.store import RedisStore, connect
from evaluator.config import Settings, load_settings

ROOT = Path(__file__).resolve().parents[1]

INPUT_MESSAGE_BYTES = 2_000_000
"""The largest message the test input topics take (the broker's default is 1 MB)."""


@dataclass
class LiveEnv:
    """Unique topics, group and Redis prefix for one test."""

    bootstrap: str
    redis_url: str
    name: str
    partitions: int = 4
    cluster: bool = False
    """``redis_url`` names a Redis Cluster node."""
    overrides: dict[str, str | None] = field(default_factory=dict)
    """Environment settings replaced (None: removed, so the default applies)."""

    @property
    def environ(self) -> dict[str, str]:
        base = {
            "EVALUATOR_KAFKA__BOOTSTRAP_SERVERS": self.bootstrap,
            "EVALUATOR_KAFKA__IMPRESSIONS_TOPIC": f"{self.name}-impressions",
            "EVALUATOR_KAFKA__INTERACTIONS_TOPIC": f"{self.name}-interactions",
            "EVALUATOR_KAFKA__GROUP_ID": f"{self.name}-group",
            "EVALUATOR_KAFKA__MAX_POLL_RECORDS": "200",
            "EVALUATOR_KAFKA__POLL_TIMEOUT": "200ms",
            "EVALUATOR_REDIS__URL": self.redis_url,
            "EVALUATOR_REDIS__KEY_PREFIX": self.name,
            "EVALUATOR_EVENT_TIME__IDLE_TIMEOUT": "2s",
            "EVALUATOR_KAFKA__SESSION_TIMEOUT": "10s",
            "EVALUATOR_HTTP__REFRESH_INTERVAL": "1s",
            "EVALUATOR_PROPENSITY__ESTIMATOR": "em",
            "EVALUATOR_REDIS__CLUSTER": "true" if self.cluster else "false",
        }
        base.update({k: v for k, v in self.overrides.items() if v is not None})
        return {k: v for k, v in base.items() if self.overrides.get(k, "") is not None}

    def settings(self) -> Settings:
        return load_settings(environ=self.environ)

    def create_topics(self) -> None:
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        # the inputs take messages up to 2 MB (a dead letter must still fit the defaults)
        big = {"max.message.bytes": str(INPUT_MESSAGE_BYTES)}
        admin.create_topics(
            [
                NewTopic(f"{self.name}-{kind}", self.partitions, 1, topic_configs=config)
                for kind, config in (
                    ("impressions", big),
                    ("interactions", big),
                    ("impressions.dlq", {}),
                    ("interactions.dlq", {}),
                )
            ]
        )
        admin.close()

    def produce(self, kind: str, payloads: Iterable[tuple[str, bytes]]) -> None:
        producer = KafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            linger_ms=5,
            max_request_size=INPUT_MESSAGE_BYTES,
        )
        for key, value in payloads:
            producer.send(f"{self.name}-{kind}", key=key.encode(), value=value)
        producer.flush()
        producer.close()

    def start(
        self,
        log: Path,
        http_port: int | None = None,
        *,
        tree: Path | None = None,
        overrides: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """``evaluator run`` of this checkout, or of the package in ``tree`` (another
        release: it gets no ``kafka.client``, which releases before it lack)."""
        # port 0 unless one is asked for: the OS picks a free one as the server binds (a
        # port found free beforehand may be taken by then, e.g. by a client's socket)
        env = {**os.environ, **self.environ, "EVALUATOR_HTTP__PORT": str(http_port or 0)}
        env.update(overrides or {})
        if tree is not None:
            env["PYTHONPATH"] = str(tree)
            env.pop("EVALUATOR_KAFKA__CLIENT", None)
        handle = open(log, "ab")  # noqa: SIM115 - owned by the child process
        return subprocess.Popen(
            [sys.executable, "-m", "evaluator", "run"],
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=tree or ROOT,
        )

    def store(self) -> RedisStore:
        client = connect(self.redis_url, cluster=self.cluster)
        return RedisStore(client, self.settings().layout(self.partitions), prefix=self.name)


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port the evaluator can bind a moment later. Not one the kernel picks for port 0:
    those come from the ephemeral range, where every outbound connection (the Kafka and
    Redis clients) takes its local port, so one could take it before the evaluator
    binds. Below that range, and never the same twice in a session."""
    low, _ = _ephemeral_range()
    for _ in range(1000):
        port = random.randrange(max(1024, low - 12_000), low)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def new_env(
    bootstrap: str,
    redis_url: str,
    cluster: bool = False,
    partitions: int = 4,
    overrides: dict[str, str | None] | None = None,
) -> LiveEnv:
    env = LiveEnv(
        bootstrap,
        redis_url,
        f"e2e-{uuid.uuid4().hex[:8]}",
        partitions=partitions,
        cluster=cluster,
        overrides=overrides or {},
    )
    env.create_topics()
    CREATED.append(env)
    return env


CREATED: list[LiveEnv] = []
"""The environments of the running test: their Redis keys are deleted after it
(``tests/conftest.py``)."""


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    procs: Iterable[subprocess.Popen[bytes]] = (),
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"evaluator exited with {proc.returncode} while {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting until {what}")


def stream(events: list[tuple[str, dict[str, Any]]], seed: int) -> list[tuple[str, dict[str, Any]]]:
    """Event-time order with a little jitter (out of order within a few seconds)."""
    rng = random.Random(seed)
    return sorted(events, key=lambda ke: ke[1]["timestamp"] + rng.randrange(0, 3_000))


def to_payloads(items: list[tuple[str, dict[str, Any]]], kind: str) -> list[tuple[str, bytes]]:
    return [(e.get("user_id", "?"), json.dumps(e).encode()) for k, e in items if k == kind]


def produce_paced(
    env: LiveEnv, ordered: list[tuple[str, dict[str, Any]]], rate: float, keyed: bool = True
) -> threading.Thread:
    """Produce events in the given order at ``rate`` events/s (keyed by user, or
    without keys: the client spreads them over partitions), in a background thread;
    returns the started thread."""

    def send() -> None:
        producer = KafkaProducer(bootstrap_servers=env.bootstrap, acks="all", linger_ms=5)
        started = time.monotonic()
        for n, (kind, e) in enumerate(ordered):
            ahead = n / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)  # pacing the producer, not waiting for a condition
            key = e.get("user_id", "?").encode() if keyed else None
            producer.send(f"{env.name}-{kind}", key=key, value=json.dumps(e).encode())
        producer.flush()
        producer.close()

    thread = threading.Thread(target=send, name="producer", daemon=True)
    thread.start()
    return thread


def stop(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def running_demo(requests_per_s: float, interleave: bool = False) -> Iterator[str]:
    """`evaluator demo` (embedded store) on a free port in a thread; yields its base URL."""
    from evaluator.app.demo import demo_tree, run_demo

    port = free_port()
    settings = load_settings(environ={}, overrides=demo_tree({"http": {"port": port}}))
    stop_demo = threading.Event()
    worker = threading.Thread(
        target=run_demo,
        args=(settings,),
        kwargs={"stop": stop_demo, "requests_per_s": requests_per_s, "interleave": interleave},
    )
    worker.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_demo.set()
        worker.join(timeout=30)


class RedisServer:
    """A redis-server of a test's own (AOF, fsync every second, as in production), that
    the test may SIGKILL and start again on the same port and data."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        options = ["--dir", str(self.directory), "--appendonly", "yes", "--save", ""]
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", *options],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def answers() -> bool:
            ping = ["redis-cli", "-p", str(self.port), "ping"]
            out = subprocess.run(ping, capture_output=True, text=True, check=False)
            return out.stdout.strip() == "PONG"

        wait_until(answers, 30, "the test's redis-server answers")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def snapshot(self) -> Path:
        """A copy of the AOF as it is now (a file being appended may end mid-command:
        Redis loads such a tail truncated, as after a crash), once Redis has written
        what it already acknowledged to the file (with ``everysec`` it postpones that
        write, up to 2 s, while a slow background fsync runs)."""

        def written() -> bool:
            info = ["redis-cli", "-p", str(self.port), "info", "persistence"]
            out = subprocess.run(info, capture_output=True, text=True, check=False).stdout
            return "aof_buffer_length:0" in out.replace("\r", "")

        wait_until(written, 30, "redis-server wrote its AOF buffer")
        copy = self.directory.with_name(self.directory.name + "-snapshot")
        shutil.copytree(self.directory / "appendonlydir", copy / "appendonlydir")
        return copy

    def restore(self, snapshot: Path) -> None:
        """Replace the AOF with an earlier snapshot (the server must be down)."""
        shutil.rmtree(self.directory / "appendonlydir")
        shutil.copytree(snapshot / "appendonlydir", self.directory / "appendonlydir")


class KafkaBroker:
    """A single-node KRaft broker of a test's own, that the test may stop and start
    again on the same port and data (scripts/services.py builds it)."""

    def __init__(self, directory: Path) -> None:
        sys.path.insert(0, str(ROOT / "scripts"))
        import services  # type: ignore[import-not-found]

        self.services = services
        self.directory = directory
        self.port = services.format_kafka(directory)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = self.services.launch_kafka(self.directory)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def dead_letters(env: LiveEnv) -> list[tuple[str, dict[str, bytes], bytes]]:
    """Every record of the input topics' dead-letter topics: topic, headers, value."""
    consumer = KafkaConsumer(
        f"{env.name}-impressions.dlq",
        f"{env.name}-interactions.dlq",
        bootstrap_servers=env.bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5_000,
    )
    out = [(m.topic, dict(m.headers), m.value) for m in consumer]
    consumer.close()
    return out


def has_sample(text: str, name: str, **labels: str) -> bool:
    """Whether an exposition holds a sample of ``name`` with these labels (any order)."""
    from prometheus_client.parser import text_string_to_metric_families

    return any(
        sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    )
