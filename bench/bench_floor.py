"""What decoding alone costs beside raw kafka-python consumption: the floor of any
evaluator that reads JSON events, and so how much of the raw rate is left for the
join, finalisation and checkpoints.

    make services && eval "$(python3 scripts/services.py env)"
    .venv/bin/python bench/bench_floor.py [--requests 150000] [--repeats 3]

Each repeat produces ``bench_run.py``'s events to fresh topics (4 partitions each)
and reads them all, in one process and the same run, four ways: raw (records only,
as ``bench_run.py``'s ceiling), raw again, raw + ``msgspec`` decoding of every
value into plain objects, and raw + the evaluator's own decoding and validation
(``decode_impressions``/``decode_interactions``). Reported: events/s and CPU µs
per event of each (CPU time is the noise-robust figure on a shared machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid

import msgspec
from _common import machine
from bench_run import events, plain_consumer, produce

from evaluator.config import load_settings
from evaluator.core.decode import decode_impressions, decode_interactions

MODES = ("raw", "raw again", "msgspec decode", "evaluator decode + validate")


def consume(bootstrap: str, name: str, total: int, mode: str) -> tuple[float, float]:
    """Events/s and CPU µs per event of reading every record of both topics."""
    consumer = plain_consumer(bootstrap, name, f"{name}-{uuid.uuid4().hex[:6]}")
    profile = load_settings(environ={}).relevance.active()
    decode = msgspec.json.Decoder().decode
    seen, start, cpu = 0, 0.0, 0.0
    while seen < total:
        polled = consumer.poll(timeout_ms=500, max_records=5000)
        if polled and not start:
            start, cpu = time.perf_counter(), time.process_time()
        for tp, records in polled.items():
            seen += len(records)
            if mode == "msgspec decode":
                for record in records:
                    decode(record.value)
            elif mode == "evaluator decode + validate":
                values = [record.value for record in records]
                if tp.topic.endswith("-impressions"):
                    decode_impressions(values)
                else:
                    decode_interactions(values, profile)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    consumer.close()
    return total / elapsed, cpu / total * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=150_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    imps, ints = events(args.requests)
    total = len(imps) + len(ints)
    runs: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    for i in range(args.repeats):
        name = f"floor-{uuid.uuid4().hex[:6]}"
        produce(bootstrap, name, imps, ints)
        for mode in MODES:
            runs[mode].append(consume(bootstrap, name, total, mode))
        print(
            f"  run {i + 1}: "
            + ", ".join(
                f"{m} {r:,.0f} ev/s {c:.1f} µs"
                for m, (r, c) in zip(MODES, (runs[m][-1] for m in MODES), strict=True)
            )
        )
    print(f"machine: {machine()}")
    print(f"{total:,} events, medians of {args.repeats}")
    raw_cpu = statistics.median(c for m in MODES[:2] for _, c in runs[m])
    for mode in MODES:
        rate = statistics.median(r for r, _ in runs[mode])
        cpu = statistics.median(c for _, c in runs[mode])
        print(
            f"  {mode:28}: {rate:10,.0f} events/s, {cpu:4.1f} CPU µs/ev "
            f"({raw_cpu / cpu:.2f} of raw by CPU)"
        )


if __name__ == "__main__":
    main()
