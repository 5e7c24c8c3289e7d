"""Events per second for ``evaluator replay`` end to end, beside its ceiling.

    .venv/bin/python bench/bench_replay.py [--requests 100000] [--repeats 3]

The ceiling is reading the same files and decoding every line with msgspec into
plain objects, without validation, joining or scoring.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

import msgspec
from _common import machine, median_rate

from evaluator.commands.replay import evaluate_files
from evaluator.config import load_settings

T0 = 1_700_000_000_000


def write_events(directory: Path, requests: int, seed: int = 0) -> tuple[Path, Path, int]:
    rng = random.Random(seed)
    imp_lines, int_lines = [], []
    for r in range(requests):
        ts = T0 + r * 50
        items = [f"p{rng.randrange(50_000)}" for _ in range(20)]
        items = list(dict.fromkeys(items))
        user = f"u{rng.randrange(requests // 4 + 1)}"
        imp_lines.append(
            json.dumps(
                {
                    "event_id": f"i{r}",
                    "request_id": f"r{r}",
                    "user_id": user,
                    "variant": "AB"[r % 2],
                    "timestamp": ts,
                    "items": items,
                }
            )
        )
        for n in range(rng.choice([0, 1, 1, 2, 3])):
            pos = min(int(rng.expovariate(0.3)), len(items) - 1)
            event = {
                "event_id": f"e{r}-{n}",
                "user_id": user,
                "item_id": items[pos],
                "type": rng.choice(["click", "click", "add_to_cart", "purchase"]),
                "timestamp": ts + rng.randrange(1_000, 600_000),
            }
            if rng.random() < 0.7:
                event["request_id"] = f"r{r}"
            int_lines.append(json.dumps(event))
    imp, inter = directory / "impressions.jsonl", directory / "interactions.jsonl"
    imp.write_text("\n".join(imp_lines) + "\n")
    inter.write_text("\n".join(int_lines) + "\n")
    return imp, inter, len(imp_lines) + len(int_lines)


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
