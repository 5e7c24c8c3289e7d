#!/usr/bin/env python3
"""Start and stop a real single-node Kafka (KRaft) broker and real Redis servers on loopback.

    python3 scripts/services.py start   # idempotent; prints KAFKA_BOOTSTRAP_SERVERS,
                                        # REDIS_URL and REDIS_CLUSTER_URL
    python3 scripts/services.py stop
    python3 scripts/services.py env     # print the settings of running services

Kafka runs from the official Apache jars fetched through Maven (deploy/kafka/pom.xml)
into .cache/kafka-libs; Redis is Debian's redis-server, once standalone and once as
a one-node Redis Cluster serving every slot. Each start uses free ports
and a fresh data folder under .cache/services. Standard library only.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache"
LIBS = CACHE / "kafka-libs"
STATE = CACHE / "services"
ENV_FILE = STATE / "env"
POM = ROOT / "deploy" / "kafka" / "pom.xml"

LOG4J = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = info
logger.org.name = org.apache.kafka
logger.org.level = warn
"""


def fail(message: str) -> None:
    print(f"services: {message}", file=sys.stderr)
    sys.exit(1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def read_env() -> dict[str, str]:
    if not ENV_FILE.exists():
        return {}
    pairs = (line.split("=", 1) for line in ENV_FILE.read_text().splitlines() if "=" in line)
    return dict(pairs)


PID_KEYS = ("KAFKA_PID", "REDIS_PID", "REDIS_CLUSTER_PID")
URL_KEYS = ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL", "REDIS_CLUSTER_URL")


def running(env: dict[str, str]) -> bool:
    pids = [env.get(key) for key in PID_KEYS]
    return all(p and alive(int(p)) for p in pids)


def check_prerequisites() -> None:
    missing = [tool for tool in ("java", "redis-server", "redis-cli") if shutil.which(tool) is None]
    if not LIBS.exists() and shutil.which("mvn") is None:
        missing.append("mvn (Maven, to fetch the Kafka jars)")
    if missing:
        hints = {
            "redis-server": "apt-get install -y redis-server",
            "redis-cli": "apt-get install -y redis-tools",
            "java": "a Java 17 JDK",
        }
        details = "; ".join(f"{m} ({hints.get(m, 'install it')})" for m in missing)
        fail(f"missing prerequisite: {details}")


def fetch_kafka() -> None:
    if (LIBS / ".complete").exists():
        return
    print("services: fetching the Apache Kafka jars with Maven (once) ...", file=sys.stderr)
    LIBS.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "mvn",
            "-q",
            "-B",
            "-Dstyle.color=never",
            "-f",
            str(POM),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={LIBS}",
        ],
        check=True,
        stdout=sys.stderr,  # stdout carries only the settings, for `eval`
    )
    (LIBS / ".complete").touch()


class StartError(Exception):
    """A service did not start; the message names it and ends with its log."""


def log_tail(path: Path | None, lines: int = 5) -> str:
    """The last lines of a service's log, so a failed start says why in its one line."""
    if path is None or not path.exists():
        return ""
    tail = path.read_text(errors="replace").strip().splitlines()[-lines:]
    return " | ".join(line.strip() for line in tail)


def wait_for(
    predicate,
    what: str,
    timeout: float,
    proc: subprocess.Popen | None = None,
    log: Path | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise StartError(f"{what} exited with code {proc.returncode}: {log_tail(log)}")
        time.sleep(0.2)
    if proc is not None:
        proc.kill()
    raise StartError(f"{what} did not become ready within {timeout:.0f}s: {log_tail(log)}")


def start_redis(data: Path, cluster: bool = False, attempts: int = 3) -> tuple[int, int]:
    """`launch_redis`, again on fresh ports if another process took a port first."""
    for attempt in range(1, attempts + 1):
        try:
            return launch_redis(data / f"try-{attempt}", cluster)
        except StartError as error:
            if attempt == attempts:
                raise
            print(f"services: {error}; trying other ports", file=sys.stderr)
    raise AssertionError("unreachable")


def launch_redis(data: Path, cluster: bool) -> tuple[int, int]:
    """A redis-server on a free loopback port; ``cluster``: a one-node Redis Cluster
    that serves every slot (what the store's Cluster mode is tested against).

    The server runs in the foreground of its own session, so that a start that fails
    is seen at once with its log. A cluster node's bus gets its own free port: by
    default it is the client port + 10000, which does not exist for ports above
    55535, and ephemeral ports go up to 60999."""
    port = free_port()
    data.mkdir(parents=True)
    extra = []
    if cluster:
        extra = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        extra += ["--cluster-port", str(free_port())]
    log = data / "redis.log"
    args = [
        "redis-server",
        *extra,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(data),
        "--logfile",
        str(log),
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--save",
        "",
    ]
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )

    def ready() -> bool:
        out = subprocess.run(
            ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True, check=False
        )
        return out.stdout.strip() == "PONG"

    label = "redis-server (cluster)" if cluster else "redis-server"
    wait_for(ready, label, 60, proc, log)
    if cluster:
        cli = ["redis-cli", "-p", str(port)]
        subprocess.run(
            [*cli, "cluster", "addslotsrange", "0", "16383"], check=True, capture_output=True
        )

        def serving() -> bool:
            out = subprocess.run(
                [*cli, "cluster", "info"], capture_output=True, text=True, check=False
            )
            return "cluster_state:ok" in out.stdout

        wait_for(serving, label, 60, proc, log)
    return port, proc.pid


def start_kafka(data: Path) -> tuple[int, int]:
    """A single-node KRaft broker on free loopback ports, formatted in ``data``."""
    port = format_kafka(data)
    return port, launch_kafka(data).pid


def format_kafka(data: Path) -> int:
    """Write a broker's configuration and format its storage; returns its port."""
    port, controller = free_port(), free_port()
    data.mkdir(parents=True)
    props = data / "server.properties"
    props.write_text(f"""\
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={data / "logs"}
num.partitions=4
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
""")
    (data / "log4j2.properties").write_text(LOG4J.format(log=data / "server.log"))
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    subprocess.run(
        [
            *_java(data),
            "kafka.tools.StorageTool",
            "format",
            "--standalone",
            # one argument: a random id may start with "-", which argparse reads as an option
            f"--cluster-id={cluster_id}",
            "-c",
            str(props),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return port


def _java(data: Path) -> list[str]:
    return [
        "java",
        "-Xms256m",
        "-Xmx768m",
        f"-Dlog4j2.configurationFile={data / 'log4j2.properties'}",
        "-cp",
        f"{LIBS}/*",
    ]


def launch_kafka(data: Path) -> subprocess.Popen[bytes]:
    """Start (or start again) the broker formatted in ``data``; waits until it serves."""
    log = data / "server.log"
    started = log.stat().st_size if log.exists() else 0
    with open(data / "stdout.log", "ab") as out:
        proc = subprocess.Popen(
            [*_java(data), "kafka.Kafka", str(data / "server.properties")],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def ready() -> bool:
        if not log.exists():
            return False
        with open(log, "rb") as handle:
            handle.seek(started)
            return b"Kafka Server started" in handle.read()

    wait_for(ready, "kafka broker", 120, proc, log)
    return proc


def start() -> None:
    env = read_env()
    if env and running(env):
        print("services: already running", file=sys.stderr)
        print_env(env)
        return
    stop(quiet=True)
    check_prerequisites()
    fetch_kafka()
    run_dir = STATE / time.strftime("run-%Y%m%d-%H%M%S")
    started: list[int] = []
    try:
        redis_port, redis_pid = start_redis(run_dir / "redis")
        started.append(redis_pid)
        cluster_port, cluster_pid = start_redis(run_dir / "redis-cluster", cluster=True)
        started.append(cluster_pid)
        kafka_port, kafka_pid = start_kafka(run_dir / "kafka")
    except BaseException:  # a failed start leaves nothing running behind it
        for pid in started:
            if alive(pid):
                os.kill(pid, signal.SIGTERM)
        raise
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{kafka_port}",
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "REDIS_CLUSTER_URL": f"redis://127.0.0.1:{cluster_port}",
        "KAFKA_PID": str(kafka_pid),
        "REDIS_PID": str(redis_pid),
        "REDIS_CLUSTER_PID": str(cluster_pid),
        "SERVICES_DIR": str(run_dir),
    }
    ENV_FILE.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    print(f"services: started Kafka, Redis and a Redis Cluster in {run_dir}", file=sys.stderr)
    print_env(env)


def print_env(env: dict[str, str]) -> None:
    for key in URL_KEYS:
        print(f"export {key}={env[key]}")


def stop(quiet: bool = False) -> None:
    env = read_env()
    for key in PID_KEYS:
        pid = int(env[key]) if env.get(key) else 0
        if pid and alive(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    if env.get("SERVICES_DIR"):
        shutil.rmtree(env["SERVICES_DIR"], ignore_errors=True)
    ENV_FILE.unlink(missing_ok=True)
    if not quiet:
        print("services: stopped")


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else "start"
    STATE.mkdir(parents=True, exist_ok=True)
    if command == "start":
        try:
            start()
        except StartError as error:
            fail(f"{error} (see {STATE})")
    elif command == "stop":
        stop()
    elif command == "env":
        env = read_env()
        if not (env and running(env)):
            fail("not running; start them with `make services`")
        print_env(env)
    else:
        fail(f"unknown command {command!r}: use start, stop or env")


if __name__ == "__main__":
    main()
