"""Events per second for ``evaluator replay`` end to end, beside its ceiling.

    .venv/bin/python bench/bench_replay.py [--requests 100000] [--repeats 3]

The ceiling is reading the same files and decoding every line with msgspec into
plain objects, without validation, joining or scoring.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import msgspec
from _common import machine, median_rate, synthetic_events

from evaluator.app.replay import evaluate_files
from evaluator.config import load_settings

T0 = 1_700_000_000_000


def write_events(directory: Path, requests: int, seed: int = 0) -> tuple[Path, Path, int]:
    imps, ints = synthetic_events(requests, seed=seed)
    imp, inter = directory / "impressions.jsonl", directory / "interactions.jsonl"
    imp.write_bytes(b"\n".join(imps) + b"\n")
    inter.write_bytes(b"\n".join(ints) + b"\n")
    return imp, inter, len(imps) + len(ints)


def decode_only(paths: tuple[Path, Path]) -> int:
    decoder = msgspec.json.Decoder()
    count = 0
    for path in paths:
        with open(path, "rb") as handle:
            for line in handle:
                decoder.decode(line)
                count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    settings = load_settings(environ={})
    with tempfile.TemporaryDirectory() as tmp:
        imp, inter, events = write_events(Path(tmp), args.requests)
        ours, spread = median_rate(
            lambda: evaluate_files(imp, inter, settings, progress=False), events, args.repeats
        )
        ceiling, _ = median_rate(lambda: decode_only((imp, inter)), events, args.repeats)
    print(f"machine: {machine()}")
    print(f"{events:,} events ({args.requests:,} impressions of 20 items)", end="")
    print(f", median of {args.repeats} runs")
    print(f"  evaluator replay    : {ours:10,.0f} events/s  (max/min spread {spread:.2f})")
    print(f"  msgspec decode only : {ceiling:10,.0f} events/s  -> replay is {ours / ceiling:.2f}x")


if __name__ == "__main__":
    main()
