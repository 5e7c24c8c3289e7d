"""Robustness costs: the rate at which bad payloads are rejected, and replay's peak memory
on hostile input, each beside its baseline in the same run.

    .venv/bin/python bench/bench_fuzz.py [--payloads 100000] [--repeats 3]

1. Fuzzed payloads (tests/fuzz.py: random bytes, truncated JSON, deep nesting, huge
   strings and lists ...) through the impression decoder, beside valid impressions
   of the same count: payloads/s of each, and their ratio.
2. Peak memory (max RSS) of ``evaluator replay`` on a file holding one 50 MB line
   among simulated events, beside the same file without it, and on 1,000,000
   simulated events (the README's figure per million events).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import machine  # noqa: E402

from evaluator.core.decode import decode_impressions  # noqa: E402
from tests.fuzz import GOOD_IMPRESSION, bad_payloads  # noqa: E402


def rate(payloads: list[bytes], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        decode_impressions(payloads, 1000)
        times.append(time.perf_counter() - start)
    return len(payloads) / statistics.median(times)


def peak_rss_mb(*args: str) -> float:
    """Max RSS of one ``evaluator`` child process (Linux reports KiB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run(
        [sys.executable, "-m", "evaluator", *args, "--no-progress", "--output", "json"],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=ROOT,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # RUSAGE_CHILDREN keeps the largest child so far: run the smaller inputs first
    return max(after, before) / 1024


def simulate(directory: Path, requests: int) -> tuple[Path, Path]:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "evaluator",
            "simulate",
            "--out-dir",
            str(directory),
            "--requests",
            str(requests),
            "--no-progress",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    return directory / "impressions.jsonl", directory / "interactions.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--payloads", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    bad = bad_payloads(args.payloads, seed=1)
    good = [
        json.dumps({**GOOD_IMPRESSION, "request_id": f"r{n}", "event_id": f"e{n}"}).encode()
        for n in range(args.payloads)
    ]
    bad_rate, good_rate = rate(bad, args.repeats), rate(good, args.repeats)
    print(f"machine: {machine()}")
    print(
        f"decoder: {bad_rate:,.0f} fuzzed payloads/s ({sum(map(len, bad)) / len(bad):,.0f} B "
        f"mean) vs {good_rate:,.0f} valid impressions/s: ratio {bad_rate / good_rate:.2f}"
    )
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        imp, inter = simulate(base / "small", 20_000)
        plain = peak_rss_mb("replay", str(imp), str(inter))
        hostile = base / "hostile.jsonl"
        with open(hostile, "wb") as out:
            out.write(imp.read_bytes())
            huge = {**GOOD_IMPRESSION, "variant": "x" * (50 << 20)}
            out.write(json.dumps(huge).encode() + b"\n")
        with_line = peak_rss_mb("replay", str(hostile), str(inter))
        print(
            f"replay peak memory, 20,000 requests (~80,000 events): {plain:,.0f} MB; with one "
            f"50 MB line added: {with_line:,.0f} MB (+{with_line - plain:,.0f} MB)"
        )
        imp, inter = simulate(base / "million", 250_000)
        events = sum(path.read_bytes().count(b"\n") for path in (imp, inter))
        big = peak_rss_mb("replay", str(imp), str(inter))
        print(
            f"replay peak memory, {events:,} events: {big:,.0f} MB "
            f"({big / events * 1e6:,.0f} MB per million events)"
        )


if __name__ == "__main__":
    main()
