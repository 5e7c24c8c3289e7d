"""Every CLI mistake ends in one clear line and a documented exit code, never a traceback.

Exit codes (docs/operations.md): 0 done, 2 a usage, configuration or environment
error, 3 ``replay`` read a damaged compressed input (the report covers the lines
before the damage). Each case runs the real command in a subprocess.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.live import free_port, wait_until

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
IMPRESSIONS = str(EXAMPLES / "impressions.jsonl")
INTERACTIONS = str(EXAMPLES / "interactions.jsonl")


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "evaluator", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )
    return proc.returncode, proc.stdout, proc.stderr


def readiness(port: int) -> tuple[int, str]:
    """/readyz's status and text (0 and "" while nothing answers)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz") as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    (d / "garbage.jsonl").write_text("not json\n{}\n")
    (d / "empty.jsonl").write_text("")
    packed = gzip.compress(Path(IMPRESSIONS).read_bytes() * 40)
    (d / "full.gz").write_bytes(packed)
    (d / "truncated.gz").write_bytes(packed[: len(packed) * 2 // 3])
    corrupt = bytearray(packed)
    corrupt[-8:-4] = b"\0\0\0\0"  # the CRC of the trailer
    (d / "corrupt.gz").write_bytes(bytes(corrupt))
    (d / "padded.gz").write_bytes(packed + b"\0" * 1024)  # zero padding, as gzip allows
    (d / "folder").mkdir()
    (d / "latin1.toml").write_bytes(b"[metrics]\n# caf\xe9\n")
    (d / "broken.toml").write_text("[metrics\n")
    (d / "unknown.toml").write_text("[metrics]\nkk = [10]\n")
    (d / "a_file").write_text("x")
    return d


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["replay", "{d}/folder", INTERACTIONS], "is a directory"),
        (["replay", "{d}/missing.jsonl", INTERACTIONS], "no such file"),
        (["replay", INTERACTIONS, IMPRESSIONS], "swapped"),
        (["replay", IMPRESSIONS, INTERACTIONS, "--k", "100000"], "at most 10000"),
        (["replay", IMPRESSIONS, INTERACTIONS, "--k", "abc"], "invalid int value"),
        (["replay", IMPRESSIONS, INTERACTIONS, "--no-such-flag"], "unrecognized arguments"),
        (["replay", IMPRESSIONS, INTERACTIONS, "--attribution-window", "soon"], "not a duration"),
        (["replay", IMPRESSIONS, INTERACTIONS, "--propensity", "magic"], "propensity"),
        (["--config", "{d}/folder", "replay", IMPRESSIONS, INTERACTIONS], "is a directory"),
        (["--config", "{d}/latin1.toml", "config", "check"], "not UTF-8"),
        (["--config", "{d}/broken.toml", "config", "check"], "not valid TOML"),
        (["--config", "{d}/unknown.toml", "config", "check"], "kk"),
        (["--config", "{d}/missing.toml", "config", "check"], "not found"),
        (["schema", "--out-dir", "{d}/a_file/sub"], "a_file"),
        (["simulate", "--requests", "5"], "--out-dir"),
        (["simulate", "--out-dir", "{d}/sim", "--requests", "5", "--variant", "a:x"], "NAME:NOISE"),
        (["simulate", "--out-dir", "{d}/sim", "--requests", "5", "--variant", ":1"], "a name"),
        (
            [
                "simulate",
                "--out-dir",
                "{d}/sim",
                "--requests",
                "5",
                "--variant",
                "a",
                "--variant",
                "a:2",
            ],
            "a name of its own",
        ),
        (["simulate", "--out-dir", "{d}/sim", "--requests", "5", "--variant", "a:nan"], ">= 0"),
        (["simulate", "--out-dir", "{d}/sim", "--requests", "5", "--users", "0"], "users"),
        (["simulate", "--out-dir", "{d}/sim", "--requests", "-5"], "--requests must be"),
        (["demo", "--speed", "0", "--port", "0"], "--speed must be"),
        (["nonsense"], "invalid choice"),
    ],
)
def test_usage_and_configuration_errors(files: Path, args: list[str], needle: str) -> None:
    code, _, err = cli(*[a.format(d=files) for a in args])
    assert code == 2
    assert needle in one_line(err)


def test_bad_environment_value_names_the_key() -> None:
    code, _, err = cli("config", "check", env={"EVALUATOR_METRICS__K": "[-1]"})
    assert code == 2 and "metrics" in one_line(err)


@pytest.mark.parametrize("name", ["garbage.jsonl", "empty.jsonl"])
def test_no_valid_impression_is_a_report_of_zero_requests(files: Path, name: str) -> None:
    code, out, err = cli("replay", str(files / name), INTERACTIONS, "--output", "json")
    assert code == 0 and "Traceback" not in err
    report = json.loads(out)
    assert report["variants"] == {}
    assert report["events"]["interactions"] > 0 and report["events"]["attributed"] == 0


@pytest.mark.parametrize("name", ["truncated.gz", "corrupt.gz"])
def test_damaged_compressed_input_reports_the_lines_before(files: Path, name: str) -> None:
    _, whole, _ = cli("replay", str(files / "full.gz"), INTERACTIONS, "--output", "json")
    code, out, err = cli("replay", str(files / name), INTERACTIONS, "--output", "json")
    assert code == 3
    line = one_line(err)
    assert name in line and "after line" in line and "compressed byte" in line
    read = json.loads(out)["events"]
    total = json.loads(whole)["events"]
    assert 0 < read["impressions"] + read["invalid"] <= total["impressions"] + total["invalid"]
    assert read["incomplete"] and name in read["incomplete"][0]


def test_demo_with_a_taken_port_says_so_before_serving() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = cli("demo", "--port", str(port), "--requests", "10", timeout=60)
    assert code == 2
    line = one_line(err)
    assert str(port) in line and "dashboard" not in err + out


def test_run_with_an_unknown_kafka_host_stops_at_once() -> None:
    code, _, err = cli(
        "run", "--bootstrap-servers", "no-such-host.invalid:9092", "--port", "0", timeout=60
    )
    assert code == 2
    assert "no-such-host.invalid" in one_line(err) and "resolve" in one_line(err)


@pytest.mark.services
def test_run_waits_for_redis_serving_health_meanwhile(kafka_bootstrap: str, tmp_path) -> None:
    """Redis down at start: one log line per attempt, /healthz alive, /readyz not ready
    with the reason; SIGTERM ends it cleanly."""
    from tests.live import new_env

    env = new_env(kafka_bootstrap, f"redis://127.0.0.1:{free_port()}/0", partitions=1)
    port = free_port()
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "evaluator", "run", "--port", str(port)],
            env={**os.environ, **env.environ},
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    try:
        wait_until(
            lambda: readiness(port)[1].startswith("waiting for Redis"),
            60,
            "/readyz reports the wait for Redis",
            [proc],
        )
        assert readiness(port)[0] == 503
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz") as reply:
            assert reply.status == 200
        wait_until(
            lambda: log.read_text().count("Redis unreachable") >= 2,
            60,
            "two attempts are logged",
            [proc],
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    text = log.read_text()
    assert code == 0 and "Traceback" not in text


def test_run_waits_for_kafka_serving_health_meanwhile(tmp_path) -> None:
    """No broker at start: alive, not ready (saying so), no traceback, and SIGTERM ends
    it once the current connection attempt gives up."""
    port = free_port()
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "evaluator",
                "run",
                "--port",
                str(port),
                "--bootstrap-servers",
                f"127.0.0.1:{free_port()}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    try:
        wait_until(lambda: "Kafka" in readiness(port)[1], 30, "/readyz reports the wait", [proc])
        assert readiness(port)[0] == 503
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz") as reply:
            assert reply.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=90)
    assert code == 0 and "Traceback" not in log.read_text()


def test_zero_padding_after_gzip_data_is_not_damage(files: Path) -> None:
    _, whole, _ = cli("replay", str(files / "full.gz"), INTERACTIONS, "--output", "json")
    code, out, err = cli("replay", str(files / "padded.gz"), INTERACTIONS, "--output", "json")
    assert code == 0 and err == ""
    assert json.loads(out)["events"] == json.loads(whole)["events"]
