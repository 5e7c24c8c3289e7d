"""What decoding alone costs beside raw kafka-python consumption: the floor of any
evaluator that reads JSON events, and so how much of the raw rate is left for the
join, finalisation and checkpoints.

    make services && eval "$(python3 scripts/services.py env)"
    .venv/bin/python bench/bench_floor.py [--requests 150000] [--repeats 3]

Each repeat produces ``bench_run.py``'s events to fresh topics (4 partitions each)
and reads them all, in one process and the same run, five ways: raw (records only,
as ``bench_run.py``'s ceiling), raw again, raw + ``msgspec`` decoding of every
value into plain objects, raw + the evaluator's own decoding and validation
(``decode_impressions``/``decode_interactions``), and raw + the live engine's
decoding (``decode_impression_spans``: items hashed as spans, no string per item).
Reported: events/s and CPU µs per event of each (CPU time is the noise-robust
figure on a shared machine).

Then, in process on the same events, the rest of what no engine in Python avoids,
each in the cheapest form this codebase has (:func:`rest_of_floor`): a set probe and
insert per event id, the items' codes in a codebook, nDCG@10 of every list in one
batch. The floor of the evaluator's own work is the live decoding's cost above raw
plus those; issue 33's 0.5 of raw's rate needs the whole of its own work to cost no
more than raw consumption does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable

import msgspec
import numpy as np
from _common import machine
from bench_run import events, plain_consumer, produce

from evaluator.config import load_settings
from evaluator.core.decode import decode_impressions, decode_interactions
from evaluator.core.decode_spans import decode_impression_spans
from evaluator.core.metrics.ndcg import ndcg
from evaluator.engine.codebook import ITEM_SEED, Codebook

MODES = (
    "raw",
    "raw again",
    "msgspec decode",
    "evaluator decode + validate",
    "live decode (spans)",
)
BATCH = 500
"""Events per batch of the in-process parts (a poll's batch of one partition)."""


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
            if mode in ("raw", "raw again"):
                continue
            if mode == "msgspec decode":
                for record in records:
                    decode(record.value)
            else:
                values = [record.value for record in records]
                if not tp.topic.endswith("-impressions"):
                    decode_interactions(values, profile)
                elif mode == "live decode (spans)":
                    decode_impression_spans(values, ITEM_SEED)
                else:
                    decode_impressions(values)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    consumer.close()
    return total / elapsed, cpu / total * 1e6


def cpu_per_event(work: Callable[[], object], events: int, repeats: int) -> float:
    """Median CPU µs per event of ``work`` over ``repeats`` calls."""
    spent = []
    for _ in range(repeats):
        started = time.process_time()
        work()
        spent.append(time.process_time() - started)
    return statistics.median(spent) / events * 1e6


def rest_of_floor(imps: list[bytes], events: int, repeats: int) -> dict[str, float]:
    """CPU µs per event (over all ``events``) of the work after decoding that every
    engine in Python does, each part over batches of :data:`BATCH`."""
    ids = [[f"e{n}" for n in range(s, min(s + BATCH, events))] for s in range(0, events, BATCH)]
    spans = [
        decode_impression_spans(imps[s : s + BATCH], ITEM_SEED)[0].items
        for s in range(0, len(imps), BATCH)
    ]

    def probe() -> None:
        seen: set[str] = set()
        for batch in ids:
            [i in seen for i in batch]
            seen.update(batch)

    def code() -> None:
        book = Codebook()
        for batch in spans:
            assert batch is not None
            book.encode_spans(batch)

    grades = np.zeros((len(imps), 20))
    grades[:, 0], grades[::3, 4] = 1.0, 2.0
    return {
        "a set probe and insert per event id": cpu_per_event(probe, events, repeats),
        "item codes (a codebook, numpy)": cpu_per_event(code, events, repeats),
        "nDCG@10 of every list (one batch)": cpu_per_event(
            lambda: ndcg(grades, (10,)), events, repeats
        ),
    }


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
    decoding = statistics.median(c for _, c in runs["live decode (spans)"]) - raw_cpu
    rest = rest_of_floor(imps, total, args.repeats)
    print(f"  the floor of the evaluator's own work, CPU µs per event (batches of {BATCH}):")
    print(f"    {'live decoding, above raw':<40} {decoding:5.2f}")
    for part, cost in rest.items():
        print(f"    {part:<40} {cost:5.2f}")
    floor = decoding + sum(rest.values())
    print(
        f"    {'in all':<40} {floor:5.2f}: {floor / raw_cpu:.2f} of raw consumption's "
        f"{raw_cpu:.2f} (0.5 of raw's rate allows 1.0)"
    )


if __name__ == "__main__":
    main()
