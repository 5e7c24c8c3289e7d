"""The simulator: deterministic, and its ground truth is what replay recovers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from evaluator.app.cli import main
from evaluator.app.simulate import FileSink, RateLimiter, simulate
from evaluator.core.simulator import SimulationConfig, Simulator

REQUESTS = 12_000
TOLERANCE = 0.02
"""|replay nDCG@10 - expected| after 12,000 requests (about 4 standard errors per variant)."""


def _payloads(config: SimulationConfig, requests: int) -> list[bytes]:
    return [e.payload for chunk in Simulator(config).chunks(requests) for e in chunk]


def test_same_seed_same_events_other_seed_other_events() -> None:
    a = _payloads(SimulationConfig(seed=7), 500)
    assert a == _payloads(SimulationConfig(seed=7), 500)
    assert a != _payloads(SimulationConfig(seed=8), 500)


def test_events_arrive_in_order_except_the_configured_disorder() -> None:
    config = SimulationConfig(
        seed=1, out_of_order_fraction=0, duplicate_fraction=0, malformed_fraction=0
    )
    times = [
        json.loads(e.payload)["timestamp"] for chunk in Simulator(config).chunks(300) for e in chunk
    ]
    assert times == sorted(times)


def test_rate_limiter_paces_in_wall_clock_time() -> None:
    now = [100.0]
    limiter = RateLimiter(1000.0, clock=lambda: now[0])
    assert limiter.delay(500) == pytest.approx(0.5)
    now[0] += 0.5
    assert limiter.delay(500) == pytest.approx(0.5)
    assert RateLimiter(0).delay(10**9) == 0


class StampedSink:
    """Records how far each event is stamped ahead of the wall clock when it is sent."""

    def __init__(self) -> None:
        self.ahead_ms: list[int] = []

    def send(self, kind: str, key: bytes, payload: bytes) -> None:
        try:  # the simulator injects malformed events too
            stamp = json.loads(payload).get("timestamp")
        except (ValueError, AttributeError):
            return
        if isinstance(stamp, int):
            self.ahead_ms.append(stamp - time.time_ns() // 1_000_000)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize("live", [True, False])
def test_live_traffic_is_never_stamped_ahead_of_the_clock(live: bool) -> None:
    """``simulate --kafka`` (live: event time from now): each event waits for its time,
    else an evaluator would refuse the traffic as from the future. Without ``live`` the
    same traffic (500 requests/s of event time, produced as fast as possible) runs ahead."""
    config = SimulationConfig(
        seed=3,
        requests_per_second=500.0,
        start_ms=time.time_ns() // 1_000_000,
        interaction_delay_ms=2_000,  # the last purchase within seconds, not minutes
    )
    sink = StampedSink()
    simulate(config, sink, 600, progress=False, live=live)
    assert len(sink.ahead_ms) > 1_000
    if live:
        assert max(sink.ahead_ms) <= 5  # a few ms for the clock read after the wait
    else:
        assert max(sink.ahead_ms) > 500


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("sim")
    sim = simulate(SimulationConfig(seed=11), FileSink(out), REQUESTS, progress=False)
    return out, sim.truth.as_dict()


def _replay(out: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    args = ["replay", str(out / "impressions.jsonl"), str(out / "interactions.jsonl")]
    assert main([*args, "--output", "json", "--no-progress", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_replay_recovers_the_ground_truth_ndcg(simulated, capsys) -> None:
    out, truth = simulated
    report = _replay(out, capsys)
    assert truth["ndcg"]["treatment"]["@10"]["raw"] > truth["ndcg"]["control"]["@10"]["raw"]
    for variant, block in report["variants"].items():
        expected = truth["ndcg"][variant]["@10"]["raw"]
        assert block["ndcg"]["10"] == pytest.approx(expected, abs=TOLERANCE)
        assert block["requests"] == truth["requests"][variant]


def test_replay_counts_the_injected_duplicates_and_malformed_events(simulated, capsys) -> None:
    out, truth = simulated
    events = _replay(out, capsys)["events"]
    injected = truth["events"]
    assert (
        events["invalid"] == injected["malformed_impressions"] + injected["malformed_interactions"]
    )
    assert (
        events["duplicates"]
        == injected["duplicate_impressions"] + injected["duplicate_interactions"]
    )
    assert events["attributed"] == injected["interactions"]


def test_simulate_cli_writes_files_and_truth(tmp_path, capsys) -> None:
    args = ["simulate", "--out-dir", str(tmp_path), "--requests", "200", "--no-progress"]
    assert main([*args, "--variant", "a:1.0", "--variant", "b:0.2", "--eta", "0.7"]) == 0
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert set(truth["ndcg"]) == {"a", "b"}
    assert truth["propensity"][1] == pytest.approx(2**-0.7, abs=1e-6)
    assert sum(truth["requests"].values()) == 200
    assert (tmp_path / "impressions.jsonl").stat().st_size > 0


@pytest.mark.parametrize("bad", [["--variant", "a:x"], ["--eta", "-1"], []])
def test_simulate_usage_errors_exit_2(tmp_path, capsys, bad) -> None:
    dest = [] if not bad else ["--out-dir", str(tmp_path)]
    assert main(["simulate", "--requests", "10", *dest, *bad]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_video_mode_watch_time_is_graded_and_recovered(tmp_path, capsys) -> None:
    config = SimulationConfig(seed=3, mode="video")
    sim = simulate(config, FileSink(tmp_path), 8_000, progress=False)
    first = json.loads((tmp_path / "interactions.jsonl").read_text().splitlines()[0])
    assert first["type"] == "watch" and 0 < first["watch_time"] <= first["duration"]
    report = _replay(tmp_path, capsys, "--relevance", "video")
    truth = sim.truth.as_dict()["ndcg"]
    for variant, block in report["variants"].items():
        assert block["ndcg"]["10"] == pytest.approx(truth[variant]["@10"]["raw"], abs=0.025)
