"""``evaluator replay``: evaluate JSON Lines event files with the same core as the live pipeline."""

from __future__ import annotations

import contextlib
import gc
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from evaluator.config import Settings
from evaluator.events import (
    ImpressionBatch,
    InteractionBatch,
    InvalidEvent,
    decode_impressions,
    decode_interactions,
)
from evaluator.replay import attribute, dedupe_impressions, score
from evaluator.report import EventCounts, build_report, render_table
from evaluator.sources.files import file_size, read_jsonl

MAX_INVALID_SAMPLES = 1000
"""Invalid lines listed individually in the report; all are counted."""


def _note_invalid(
    counts: EventCounts, path: Path, invalid: list[InvalidEvent], numbers: list[int]
) -> None:
    for bad in invalid:
        counts.invalid_by_reason[bad.reason.value] += 1
        if len(counts.invalid_samples) < MAX_INVALID_SAMPLES:
            counts.invalid_samples.append(
                {
                    "file": str(path),
                    "line": numbers[bad.index],
                    "reason": bad.reason.value,
                    "detail": bad.detail,
                }
            )


def load_events(
    impressions: Path, interactions: Path, settings: Settings, progress: bool | None = None
) -> tuple[ImpressionBatch, InteractionBatch, EventCounts]:
    """Read, decode and validate both files; bad lines are counted, never raised."""
    counts = EventCounts()
    imps, ints = ImpressionBatch(), InteractionBatch()
    profile = settings.relevance.active()
    max_len = settings.events.max_list_length
    total = file_size(impressions) + file_size(interactions)
    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc="replay",
        disable=progress is False if progress is not None else None,
        file=sys.stderr,
        leave=False,
    ) as bar:
        update: Callable[[int], object] = bar.update
        for chunk in read_jsonl(impressions, on_bytes=update):
            batch, invalid = decode_impressions(chunk.payloads, max_len)
            counts.impressions += len(batch.events)
            _note_invalid(counts, impressions, invalid, chunk.line_numbers)
            imps.events += batch.events
            imps.timestamp_ms += batch.timestamp_ms
        for chunk in read_jsonl(interactions, on_bytes=update):
            ibatch, invalid = decode_interactions(chunk.payloads, profile)
            counts.interactions += len(ibatch.events)
            _note_invalid(counts, interactions, invalid, chunk.line_numbers)
            ints.events += ibatch.events
            ints.timestamp_ms += ibatch.timestamp_ms
            ints.grade += ibatch.grade
    return imps, ints, counts


def evaluate_files(
    impressions: Path, interactions: Path, settings: Settings, progress: bool | None = None
) -> dict[str, Any]:
    """The full replay report for two event files."""
    with _without_cyclic_gc():
        imps, ints, counts = load_events(impressions, interactions, settings, progress)
        requests = dedupe_impressions(imps)
        attribution = attribute(requests, ints, settings)
        scored = score(requests, attribution, settings)
        duplicates = requests.duplicates + attribution.duplicates
        return build_report(scored, attribution.outcomes, duplicates, counts, settings)


@contextlib.contextmanager
def _without_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic collector: replay builds millions of acyclic objects, and
    collections triggered by their allocation would cost about a quarter of the run."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def print_report(report: dict[str, Any], output: str) -> None:
    if output == "json":
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    print(render_table(report))
    samples = report["invalid_lines"]
    if samples:
        print(f"\ninvalid lines ({report['events']['invalid']}):")
        for s in samples[:20]:
            print(f"  {s['file']}:{s['line']}: {s['reason']}: {s['detail']}")
        if report["events"]["invalid"] > 20:
            print("  ... (all of them are in --output json)")
