"""`evaluator replay` end to end, as a user runs it, checked against a naive oracle."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from evaluator.app.cli import main
from evaluator.app.replay import evaluate_files
from evaluator.config import load_settings
from evaluator.core.ab.stats import SRM_CONCENTRATION
from evaluator.core.propensity.models import PowerLaw, ips_weights
from evaluator.core.timeutil import format_instant_ms, parse_instant_ms
from evaluator.readout.report import render_table
from tests.eventgen import generate, naive_evaluate
from tests.reference import srm_sequential_p

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def replay_json(capsys, *args: str) -> dict:
    assert main(["replay", *args, "--output", "json", "--no-progress"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("seed", [11, 12])
def test_replay_matches_the_naive_oracle(tmp_path, capsys, seed: int) -> None:
    events = generate(seed)
    imp, inter = events.write(tmp_path)
    report = replay_json(capsys, str(imp), str(inter), "--k", "5", "--k", "10")
    want = naive_evaluate(events, k=10)
    assert set(report["variants"]) == set(want["ndcg"])
    users: dict[str, set[str]] = {}
    for e in events.impressions:
        users.setdefault(e["variant"], set()).add(e["user_id"])
    for variant, block in report["variants"].items():
        assert block["requests"] == want["requests"][variant]
        assert block["users"] == len(users[variant])
        assert block["ndcg"]["10"] == pytest.approx(want["ndcg"][variant], abs=1e-12)
        assert block["ndcg_adjusted"] == block["ndcg"]
        for cohort in ("cold_start", "established"):
            assert block["cohorts"][cohort]["requests"] == want["cohorts"][variant][cohort]
    ev = report["events"]
    assert ev["attributed"] == want["outcomes"]["attributed"]
    unmatched = {k: v for k, v in want["outcomes"].items() if k != "attributed"}
    assert ev["unmatched_by_reason"] == unmatched
    dupes = (len(events.impressions) - sum(want["requests"].values())) + (
        len(events.interactions) - sum(want["outcomes"].values())
    )
    assert ev["duplicates"] == dupes


def test_adjusted_ndcg_uses_the_propensity_model(tmp_path, capsys) -> None:
    events = generate(5)
    imp, inter = events.write(tmp_path)
    report = replay_json(capsys, str(imp), str(inter), "--k", "10", "--propensity", "power(1.0)")
    weights = list(ips_weights(PowerLaw(1.0), 30, 0.05))
    want = naive_evaluate(events, k=10, weights=weights)
    for variant, block in report["variants"].items():
        assert block["ndcg_adjusted"]["10"] == pytest.approx(want["ndcg"][variant], abs=1e-12)
        assert block["ndcg_adjusted"]["10"] != pytest.approx(block["ndcg"]["10"])


def test_skip_policy_changes_only_the_denominator(tmp_path, capsys) -> None:
    imp, inter = generate(3).write(tmp_path)
    counted = replay_json(capsys, str(imp), str(inter))
    skipped = replay_json(capsys, str(imp), str(inter), "--zero-relevance", "skip")
    for variant, block in counted["variants"].items():
        other = skipped["variants"][variant]
        assert other["engaged"] == block["engaged"] and other["unengaged"] == block["unengaged"]
        ratio = block["requests"] / block["engaged"]
        assert other["ndcg"]["10"] == pytest.approx(block["ndcg"]["10"] * ratio)


def test_every_kind_of_bad_line_is_counted_and_located(capsys) -> None:
    report = replay_json(
        capsys, str(EXAMPLES / "impressions.jsonl"), str(EXAMPLES / "interactions.jsonl")
    )
    ev = report["events"]
    assert ev["invalid_by_reason"] == {
        "duplicate_item": 1,
        "empty_list": 1,
        "invalid_field": 1,
        "list_too_long": 1,
        "missing_field": 2,
        "negative_watch_time": 1,
        "undecodable": 2,
        "unknown_interaction_type": 1,
    }
    assert ev["invalid"] == 10
    located = {(Path(s["file"]).name, s["line"], s["reason"]) for s in report["invalid_lines"]}
    assert ("impressions.jsonl", 7, "empty_list") in located
    assert ("interactions.jsonl", 12, "undecodable") in located
    assert ev["duplicates"] == 2
    assert set(report["variants"]) == {"A", "B"}


def test_gzip_input_and_table_output(tmp_path, capsys) -> None:
    imp_gz = tmp_path / "imp.jsonl.gz"
    imp_gz.write_bytes(gzip.compress((EXAMPLES / "impressions.jsonl").read_bytes()))
    assert main(["replay", str(imp_gz), str(EXAMPLES / "interactions.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "nDCG@10" in out and "invalid lines (10)" in out


@pytest.mark.parametrize(
    "args",
    [
        ["replay", "missing.jsonl", "also-missing.jsonl"],
        [
            "replay",
            str(EXAMPLES / "impressions.jsonl"),
            str(EXAMPLES / "interactions.jsonl"),
            "--propensity",
            "magic",
        ],
        [
            "replay",
            str(EXAMPLES / "impressions.jsonl"),
            str(EXAMPLES / "interactions.jsonl"),
            "--attribution-window",
            "soon",
        ],
        [
            "replay",
            str(EXAMPLES / "impressions.jsonl"),
            str(EXAMPLES / "interactions.jsonl"),
            "--relevance",
            "nope",
        ],
        [
            "replay",
            str(EXAMPLES / "impressions.jsonl"),
            str(EXAMPLES / "interactions.jsonl"),
            "--now",
            "yesterday",
        ],
        [
            "replay",
            str(EXAMPLES / "impressions.jsonl"),
            str(EXAMPLES / "interactions.jsonl"),
            "--now",
            "300000000000000",
        ],
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "evaluator", *args], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("evaluator: error:")
    assert proc.stdout == ""


def test_parallel_replay_gives_the_same_report(tmp_path, monkeypatch) -> None:
    """Large inputs are decoded and summarised in forked processes; the report must not
    change. Thresholds are lowered so the small example takes that path."""
    from evaluator.app import replay as command
    from evaluator.config import load_settings

    events = generate(21)
    events.interactions.append({"event_id": "bad", "type": "click"})  # an invalid line
    imp, inter = events.write(tmp_path)
    settings = load_settings(environ={})
    now = time.time_ns() // 1_000_000  # the report names its clock
    sequential = command.evaluate_files(imp, inter, settings, progress=False, now_ms=now)
    monkeypatch.setattr(command, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(command, "PARALLEL_MIN_REQUESTS", 0)
    forked = command.evaluate_files(imp, inter, settings, progress=False, now_ms=now)
    assert forked == sequential
    assert forked["events"]["invalid"] == 1


def test_forked_errors_reach_the_parent() -> None:
    from evaluator.app.forked import Forked

    def boom() -> int:
        raise ValueError("no such thing")

    with pytest.raises(RuntimeError, match="ValueError: no such thing"):
        Forked(boom).result()
    assert Forked(lambda: [1, 2]).result() == [1, 2]


def test_replay_reports_the_ab_readout(tmp_path) -> None:
    """``"ab"`` per experiment, from the exporter's readout: users counted once at their
    first impression in the file, the difference of the variants' means, and the
    sample-ratio test on those users."""
    events = generate(44, requests=600, users=40)
    for imp in events.impressions:
        imp["variant"] = "AB"[int(imp["user_id"][1:]) % 2]
    imp_path, int_path = events.write(tmp_path)
    settings = load_settings(
        environ={}, overrides={"ab": {"min_users": 5, "min_effective_buckets": 2}}
    )
    report = evaluate_files(imp_path, int_path, settings, progress=False)
    ab = report["ab"]["default"]
    users = {v: len({i["user_id"] for i in events.impressions if i["variant"] == v}) for v in "AB"}
    assert ab["users"] == users and ab["control"] == "A"
    assert ab["requests"] == {v: report["variants"][v]["requests"] for v in "AB"}
    counts = np.array([users["A"], users["B"]], dtype=float)
    chi2 = float(((counts - counts.mean()) ** 2 / counts.mean()).sum())
    # the file is read once: its chi-square is valid, and stays the report's srm_p_value
    assert ab["srm_p_value"] == pytest.approx(math.erfc(math.sqrt(chi2 / 2)), rel=1e-6)
    want = srm_sequential_p(counts, [1, 1], SRM_CONCENTRATION)
    assert ab["srm_p_sequential"] == pytest.approx(want, rel=1e-6)  # as exported
    for c in ab["comparisons"]:
        metric = "ndcg_adjusted" if c["adjusted"] else "ndcg"
        want = (
            report["variants"]["B"][metric][str(c["k"])]
            - report["variants"]["A"][metric][str(c["k"])]
        )
        assert c["diff"] == pytest.approx(want, abs=1e-12)
        assert c["ready"] and c["lower"] <= c["diff"] <= c["upper"]
    assert "A/B default (control A)" in render_table(report)
    for k in settings.metrics.k:
        tops = {
            v: {i for e in events.impressions if e["variant"] == v for i in e["items"][:k]}
            for v in "AB"
        }
        want = len(tops["A"] & tops["B"]) / len(tops["A"] | tops["B"])
        assert ab["overlap"]["B"][str(k)] == pytest.approx(want)


def test_replay_rejects_events_from_the_future_as_of_now(tmp_path, capsys) -> None:
    """A pair stamped two days after the run's clock is invalid, as live: the report
    equals the one without it. With ``--now`` past the stamp, the pair is evaluated."""
    events = generate(45)
    clean = replay_json(capsys, *map(str, events.write(tmp_path)))
    ahead = time.time_ns() // 1_000_000 + 2 * 86_400_000
    events.impressions.append(
        {
            "event_id": "fast-i",
            "request_id": "fast",
            "user_id": "u1",
            "variant": "A",
            "timestamp": ahead,
            "items": ["p1", "p2"],
        }
    )
    events.interactions.append(
        {
            "event_id": "fast-x",
            "request_id": "fast",
            "user_id": "u1",
            "item_id": "p2",
            "type": "purchase",
            "timestamp": ahead + 1_000,
        }
    )
    paths = list(map(str, events.write(tmp_path)))
    report = replay_json(capsys, *paths)
    assert report["events"]["invalid_by_reason"] == {"future_timestamp": 2}
    assert report["variants"] == clean["variants"]
    assert report["settings"]["max_future"] == "1m"
    now_ms = parse_instant_ms(report["settings"]["now"])
    assert abs(now_ms - time.time_ns() // 1_000_000) < 60_000
    later = format_instant_ms(ahead + 3_600_000)
    accepted = replay_json(capsys, *paths, "--now", later)
    assert accepted["settings"]["now"] == later
    assert accepted["events"]["invalid_by_reason"] == {}
    assert accepted["variants"]["A"]["requests"] == clean["variants"]["A"]["requests"] + 1
    # the same instant as epoch milliseconds; the check can be turned off
    as_ms = replay_json(capsys, *paths, "--now", str(ahead + 3_600_000))
    assert as_ms["variants"] == accepted["variants"]
    off = evaluate_files(
        *map(Path, paths),
        load_settings(environ={}, overrides={"event_time": {"max_future": 0}}),
        progress=False,
    )
    assert off["variants"] == accepted["variants"]
