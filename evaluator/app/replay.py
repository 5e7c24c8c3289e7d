"""``evaluator replay``: evaluate JSON Lines event files with the same core as the live pipeline."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from evaluator.adapters.files import file_size, read_jsonl
from evaluator.app.forked import Forked
from evaluator.config import Settings
from evaluator.config.plain import readout_config
from evaluator.core.batch import (
    Attribution,
    EstimationConfig,
    ScoredRequests,
    attribute,
    dedupe_impressions,
    estimate_propensities,
    score,
    variant_codes,
)
from evaluator.core.decode import decode_impressions, decode_interactions, latest_accepted_ms
from evaluator.core.events import ImpressionBatch, InteractionColumns, InvalidEvent
from evaluator.core.propensity.estimation import Estimate
from evaluator.core.regression import WEEK_MS, FloatArray, HistoryKey
from evaluator.core.timeutil import format_instant_ms
from evaluator.engine.batches import wall_clock_ms
from evaluator.readout.ab_report import experiment_readouts
from evaluator.readout.regression import (
    Early,
    curves_json,
    file_detections,
    file_history,
    regression_json,
)
from evaluator.readout.report import EventCounts, build_report, read_file, render_table, set_level

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


PARALLEL_MIN_BYTES = 4 << 20
"""Interaction files at least this big are decoded in a second process."""
PARALLEL_MIN_REQUESTS = 50_000
"""With at least this many requests, coverage and diversity run in a second process."""


def _load_interactions(
    path: Path,
    settings: Settings,
    update: Callable[[int], object] | None,
    latest_ms: int | None,
) -> tuple[InteractionColumns, EventCounts]:
    counts = EventCounts()
    columns = InteractionColumns()
    profile = settings.relevance.active()
    for chunk in read_jsonl(path, on_bytes=update, damaged=counts.damaged):
        batch, invalid = decode_interactions(chunk.payloads, profile, latest_ms=latest_ms)
        counts.interactions += len(batch.events)
        _note_invalid(counts, path, invalid, chunk.line_numbers)
        columns.extend(batch)
    return columns, counts


def load_events(
    impressions: Path,
    interactions: Path,
    settings: Settings,
    progress: bool | None = None,
    now_ms: int | None = None,
) -> tuple[ImpressionBatch, InteractionColumns, EventCounts]:
    """Read, decode and validate both files; bad lines are counted, never raised.
    ``now_ms``: the clock events are checked against, as the live pipeline checks them
    against its wall clock when it consumes them (``future_timestamp``; None: no check).

    A large interactions file is decoded by a forked process while this one decodes
    the impressions (replay is otherwise single-threaded)."""
    counts = EventCounts()
    imps = ImpressionBatch()
    max_len = settings.events.max_list_length
    latest = latest_accepted_ms(now_ms, settings.event_time.ms("max_future"))
    parallel = file_size(interactions) >= PARALLEL_MIN_BYTES
    total = file_size(impressions) + file_size(interactions)
    pending = (
        Forked(lambda: _load_interactions(interactions, settings, None, latest))
        if parallel
        else None
    )
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
        for chunk in read_jsonl(impressions, on_bytes=update, damaged=counts.damaged):
            batch, invalid = decode_impressions(chunk.payloads, max_len, latest_ms=latest)
            counts.impressions += len(batch.events)
            _note_invalid(counts, impressions, invalid, chunk.line_numbers)
            imps.events += batch.events
            imps.timestamp_ms += batch.timestamp_ms
        if pending is not None:
            ints, theirs = pending.result()
            bar.update(file_size(interactions))
        else:
            ints, theirs = _load_interactions(interactions, settings, update, latest)
    counts.interactions = theirs.interactions
    counts.damaged += theirs.damaged
    counts.invalid_by_reason.update(theirs.invalid_by_reason)
    counts.invalid_samples = (counts.invalid_samples + theirs.invalid_samples)[:MAX_INVALID_SAMPLES]
    return imps, ints, counts


def evaluate_files(
    impressions: Path,
    interactions: Path,
    settings: Settings,
    progress: bool | None = None,
    estimate: bool = False,
    *,
    now_ms: int | None = None,
) -> dict[str, Any]:
    """The full replay report for two event files; ``estimate`` adds propensity curves.
    ``now_ms``: the clock of the future-timestamp check (None: the time of the call)."""
    if now_ms is None:
        now_ms = wall_clock_ms()
    with _without_cyclic_gc():
        imps, ints, counts = load_events(impressions, interactions, settings, progress, now_ms)
        requests = dedupe_impressions(imps)
        variants = variant_codes(requests)
        # coverage and diversity need no join: a forked child computes them while
        # this process joins and scores
        readout = readout_config(settings)
        side = Forked(
            lambda: set_level(requests.events, variants, readout),
            parallel=len(requests.events) >= PARALLEL_MIN_REQUESTS,
        )
        attribution = attribute(requests, ints, settings.join.rules())
        p = settings.propensity
        estimates = (
            estimate_propensities(requests, attribution, estimation_config(settings))
            if p.collect or estimate
            else {}
        )
        curve = estimates[p.estimator_name].curve() if p.estimated else None
        if p.estimated and curve is None:  # the report says so too (settings.propensity)
            print(
                f"evaluator replay: the {p.estimator_name} estimator found no complete "
                "propensity curve: adjusted nDCG equals raw",
                file=sys.stderr,
            )
        scored = score(
            requests,
            attribution,
            settings.scoring(curve),
            settings.cold_start.min_relevant_history,
            variants=variants,
        )
        setlevel = side.result()
        duplicates = requests.duplicates + attribution.duplicates
        relevant = (attribution.relevant_user, attribution.relevant_ms)
        ab = experiment_readouts(scored, readout, relevant)
        model = read_file(scored, readout, setlevel, ab)
        report = build_report(model, attribution.outcomes, duplicates, counts, readout)
        regression = regression_report(settings, scored, attribution, curve)
        if regression is not None:
            report["regression"] = regression
        report["settings"]["now"] = format_instant_ms(now_ms)
        report["settings"]["max_future"] = settings.event_time.max_future
        if p.estimated and curve is None:
            report["settings"]["propensity"] += " (no curve: not applied)"
        if estimates:
            report["propensity"] = propensity_report(estimates, curve)
        return report


def regression_report(
    settings: Settings,
    scored: ScoredRequests,
    attribution: Attribution,
    curve: tuple[float, ...] | None,
) -> dict[str, Any] | None:
    """The regression detector at the file's end, final and provisional data computed as
    the engine stores them (None: the detector is off). Files spanning less than a week
    cannot arm it (its baseline is the same time a week before): it says so, unread."""
    readout = readout_config(settings)
    if readout.regression is None:
        return None
    times = scored.requests.timestamp_ms
    if not times or max(times) - min(times) < WEEK_MS:
        return {"at": None, "variants": {}, "reason": SHORT}
    early = _early(settings, attribution, curve)
    rules = readout.regression
    found, curves, end = file_detections(scored, early, rules, readout.zero_relevance)
    return regression_json(found, end) | {"maturity": curves_json(curves, rules.maturity_ages_ms)}


SHORT = "the files span less than a week: the detector's baseline is a week back"


def _early(settings: Settings, attribution: Attribution, curve: tuple[float, ...] | None) -> Early:
    delay = settings.finalise_config().deadline(0)
    return Early(
        attribution.attributed, settings.scoring(curve), delay, settings.provisional().key_ms
    )


def replay_history(
    impressions: Path, interactions: Path, settings: Settings
) -> dict[HistoryKey, FloatArray]:
    """The regression history (final and provisional arrays) that the engine stores
    for two event files, computed as replay computes (to compare the two exactly)."""
    imps, ints, _ = load_events(impressions, interactions, settings, False, wall_clock_ms())
    requests = dedupe_impressions(imps)
    attribution = attribute(requests, ints, settings.join.rules())
    scored = score(
        requests, attribution, settings.scoring(), settings.cold_start.min_relevant_history
    )
    rules = readout_config(settings).regression
    assert rules is not None
    return file_history(scored, _early(settings, attribution, None), rules)


def estimation_config(settings: Settings) -> EstimationConfig:
    """The propensity estimators' settings, as the core takes them."""
    p = settings.propensity
    return EstimationConfig(
        settings.finalise_config().deadline, p.history_ms(), p.positions, p.min_clicks
    )


def propensity_report(
    estimates: dict[str, Estimate], curve: tuple[float, ...] | None
) -> dict[str, Any]:
    """Each estimator's curve with intervals, sample sizes and fitted eta."""

    def clean(values: Any) -> list[float | None]:
        return [None if math.isnan(v) else round(float(v), 6) for v in values]

    out: dict[str, Any] = {
        name: {
            "theta": clean(e.theta),
            "lower": clean(e.lower),
            "upper": clean(e.upper),
            "clicks": [int(v) for v in e.samples],
            "eta": None if math.isnan(e.eta) else round(e.eta, 6),
            "fallback": [bool(v) for v in e.fallback],
        }
        for name, e in estimates.items()
    }
    if curve is not None:
        out["applied"] = list(curve)
    return out


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
    if "propensity" in report:
        print()
        print(render_propensity(report["propensity"]))
    samples = report["invalid_lines"]
    if samples:
        print(f"\ninvalid lines ({report['events']['invalid']}):")
        for s in samples[:20]:
            print(f"  {s['file']}:{s['line']}: {s['reason']}: {s['detail']}")
        if report["events"]["invalid"] > 20:
            print("  ... (all of them are in --output json)")


def render_propensity(block: dict[str, Any]) -> str:
    """Estimated theta_k / theta_1 per estimator, one row per position."""
    names = [n for n in block if n != "applied"]
    width = len(block[names[0]]["theta"])
    lines = ["propensity  " + "  ".join(f"{n:>20}" for n in names)]
    for k in range(width):
        cells = []
        for n in names:
            e = block[n]
            theta, lo, hi = e["theta"][k], e["lower"][k], e["upper"][k]
            text = "n/a" if theta is None else f"{theta:.3f}"
            if lo is not None and hi is not None and k > 0:
                text += f" [{lo:.2f},{hi:.2f}]"
            elif e["fallback"][k]:
                text += " (fit)"
            cells.append(f"{text:>20}")
        lines.append(f"k={k + 1:<9} " + "  ".join(cells))
    lines.append("eta         " + "  ".join(f"{_eta(block[n]['eta']):>20}" for n in names))
    return "\n".join(lines)


def _eta(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
