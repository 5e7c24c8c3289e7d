"""The regression detector through the live engine and the registered collector.

Nine days of two variants' traffic with a daily cycle in clicks, fed hour by hour
through the partition engine on the embedded store and on Redis (a new owner taking
the partition over half-way); from a known time, variant B's users click half as
often. Read at every hour, as Prometheus would: the detector is not armed in the
first week, then flags nothing for A at any look, and flags B only after the drop,
within hours of final data, with a change point near it. Replay of the same events
reports what the live detector reads from the store at the same time.
"""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from evaluator.app.replay import evaluate_files, replay_history
from evaluator.config import load_settings
from evaluator.config.plain import tasks_config
from evaluator.core.maturity import curve
from evaluator.core.provisional import PROVISIONAL
from evaluator.core.regression import DAY_MS, HOUR_MS, SCALE, detect
from evaluator.core.timeutil import format_duration_ms, format_instant_ms, setting_instant_ms
from evaluator.engine.batches import PartitionBatch
from evaluator.engine.tasks import Tasks
from evaluator.readout.report import render_table
from tests import reference
from tests.test_ab_exported import T0, deliver, live, pick, scrape

SETTINGS = {
    "join": {"attribution_window": "5m"},
    "kafka": {"partitioner": "trust"},
    # hour-long polls would touch 144 buckets of the 5m window each: one window keeps
    # the test's checkpoints small (the detector reads its own history)
    "windows": {"sizes": ["24h"], "buckets_per_window": 4, "user_buckets": 16},
}
DAYS = 9
DROP_AT = T0 + 8 * DAY_MS + 7 * HOUR_MS + 1_234_567


def traffic(seed: int, per_hour: int = 960) -> list[list[bytes]]:
    """Per hour, impressions (10 items) and clicks of variants A and B (a user's coin):
    a position-biased click model whose attractiveness follows the hour of day, and
    B's halved from :data:`DROP_AT`."""
    rng = random.Random(seed)
    hours: list[list[bytes]] = []
    n = 0
    for h in range(DAYS * 24):
        start = T0 + h * HOUR_MS
        cycle = 1 + 0.3 * math.cos(2 * math.pi * ((h % 24) - 20) / 24)
        hour: list[bytes] = []
        for _ in range(per_hour):
            n += 1
            ts = start + rng.randrange(HOUR_MS - 60_000)
            user = rng.randrange(5_000)
            variant = "AB"[user % 2]
            rid = f"r{n}"
            items = [f"i{rng.randrange(300)}" for _ in range(10)]
            event = {"event_id": f"e{n}", "request_id": rid, "user_id": f"u{user}"}
            event |= {"variant": variant, "timestamp": ts, "items": items}
            hour.append(json.dumps(event).encode())
            attract = 0.35 * cycle * (0.5 if variant == "B" and ts >= DROP_AT else 1.0)
            for pos, item in enumerate(items):
                if rng.random() < attract / (pos + 1):
                    click = {"event_id": f"c{n}-{pos}", "request_id": rid, "user_id": f"u{user}"}
                    click |= {"item_id": item, "type": "click", "timestamp": ts + 30_000}
                    hour.append(json.dumps(click).encode())
        hours.append(hour)
    return hours


@pytest.mark.parametrize("make_store", ["memory", "redis"], indirect=True)
def test_a_drop_is_flagged_after_it_starts_and_never_before(tmp_path, make_store) -> None:
    settings = load_settings(environ={}, overrides=SETTINGS)
    store = make_store(settings.layout(1))
    tasks, clock, registry = live(settings, store)
    offsets = {"impressions": 0, "interactions": 0}
    hours = traffic(seed=5)
    flags: dict[str, list[tuple[int, float]]] = {"A": [], "B": []}
    since: list[float] = []
    for h, hour in enumerate(hours):
        if h == len(hours) // 2:  # a new owner: the history continues, counted once
            tasks.settle()
            tasks = Tasks(store, tasks_config(settings, 1), clock_ms=clock)
            tasks.assign([0])
        deliver(tasks, clock, hour, offsets)
        found = scrape(registry)
        for variant, seen in flags.items():
            armed = pick(found, "recsys_eval_regression_armed", variant=variant, k="10")
            value = pick(found, "recsys_eval_regression", variant=variant, k="10")
            if h < 7 * 24 - 1:  # less than a week of history: not armed, not flagged
                assert not armed and not value, (h, variant)
            elif value is not None:
                seen.append((h, value))
        point = pick(found, "recsys_eval_regression_since_timestamp_seconds", variant="B", k="10")
        if point is not None and pick(found, "recsys_eval_regression", variant="B", k="10"):
            since.append(point * 1000)
    run_on(tasks, clock)
    assert len(flags["A"]) >= 24 and not any(v for _, v in flags["A"]), flags["A"]
    drop_hour = (DROP_AT - T0) // HOUR_MS
    raised = [h for h, v in flags["B"] if v]
    assert raised, flags["B"]
    assert min(raised) >= drop_hour  # never before the drop
    assert min(raised) <= drop_hour + 4  # within hours of final data
    # the change point, in finalisation time: the drop's requests are due 6 minutes on
    assert since and all(DROP_AT - 3 * HOUR_MS <= s <= DROP_AT + HOUR_MS for s in since)

    replay_agrees(tmp_path, settings, store, hours, clock.now)


def replay_agrees(tmp_path, settings, store, hours: list[list[bytes]], now_ms: int) -> None:
    """Replay of the same events: the detector and the maturity curves over the file
    equal what the store's history gives."""
    imps, ints = tmp_path / "imps.jsonl", tmp_path / "ints.jsonl"
    events = [raw for hour in hours for raw in hour]
    imps.write_bytes(b"\n".join(e for e in events if b'"items"' in e) + b"\n")
    ints.write_bytes(b"\n".join(e for e in events if b'"items"' not in e) + b"\n")
    report = evaluate_files(imps, ints, settings, progress=False, now_ms=now_ms)
    block = report["regression"]
    rules = settings.regression.rules(tuple(settings.metrics.k))
    at = setting_instant_ms("at", block["at"])
    live_view = detect(rules, store.history(0), at, settings.metrics.zero_relevance)
    assert block["variants"]["B"]["10"]["regression"] is True
    assert block["variants"]["A"]["10"]["regression"] is False
    for (variant, k), d in live_view.items():
        mine = block["variants"][variant][str(k)]
        assert (mine["armed"], mine["regression"]) == (d.armed, d.regression)
        assert mine["score"] == round(d.score, 6)
        assert (mine["slot_ndcg"], mine["baseline_ndcg"]) == (d.current, d.baseline)
        assert mine["since"] == (format_instant_ms(d.since_ms) if d.since_ms else None)
    # and the maturity curve over the same days (clicks 30 s after: all there by 1 minute)
    ages = [format_duration_ms(a) for a in settings.maturity_ages_ms()]
    assert ages == ["1m", "2m"]  # the ages shorter than the 5-minute window
    curves = curve(store.history(0), at - rules.span_ms, rules.ks)
    assert {(v, int(k)) for v, by_k in block["maturity"].items() for k in by_k} == set(curves)
    for (variant, k), shares in curves.items():
        assert block["maturity"][variant][str(k)] == dict(
            zip(ages, shares.round(6).tolist(), strict=True)
        )
        assert shares.tolist() == [1.0, 1.0]
    table = render_table(report)
    assert "A nDCG@10 maturity (share of the final by age): 1m 1.00, 2m 1.00" in table


def delayed_traffic(
    seed: int, per_hour: int = 960, kept: float = 0.5, days: int = DAYS
) -> list[tuple[int, bytes]]:
    """(event time, payload) of :func:`traffic`'s kind, but clicks arrive an
    exponential delay (mean 2.5 minutes, at most 29) after the impression, so a
    request's relevance matures over its 30-minute attribution window; from
    :data:`DROP_AT` B's users click ``kept`` as often."""
    rng = random.Random(seed)
    out: list[tuple[int, bytes]] = []
    for n in range(days * 24 * per_hour):
        ts = T0 + int(rng.random() * days * DAY_MS)
        hour = (ts - T0) // HOUR_MS
        cycle = 1 + 0.3 * math.cos(2 * math.pi * ((hour % 24) - 20) / 24)
        user = rng.randrange(5_000)
        variant, rid = "AB"[user % 2], f"r{n}"
        items = [f"i{rng.randrange(300)}" for _ in range(10)]
        event = {"event_id": f"e{n}", "request_id": rid, "user_id": f"u{user}"}
        event |= {"variant": variant, "timestamp": ts, "items": items}
        out.append((ts, json.dumps(event).encode()))
        attract = 0.35 * cycle * (kept if variant == "B" and ts >= DROP_AT else 1.0)
        for pos, item in enumerate(items):
            if rng.random() < attract / (pos + 1):
                at = ts + min(int(rng.expovariate(1 / 150_000)), 29 * 60_000)
                click = {"event_id": f"c{n}-{pos}", "request_id": rid, "user_id": f"u{user}"}
                click |= {"item_id": item, "type": "click", "timestamp": at}
                out.append((at, json.dumps(click).encode()))
    return sorted(out)


def steps(events: list[tuple[int, bytes]], fine_from: int) -> list[tuple[int, list[bytes]]]:
    """The events by time: hour by hour, then in steps of 5 minutes from ``fine_from``
    (each step: its end, and its events)."""
    out: list[tuple[int, list[bytes]]] = []
    for ts, payload in events:
        width = HOUR_MS if ts < fine_from else 300_000
        end = ts - ts % width + width
        if not out or out[-1][0] != end:
            out.append((end, []))
        out[-1][1].append(payload)
    return out


def feed_step(tasks, clock, end: int, payloads: list[bytes], offsets: dict[str, int]) -> None:
    """One step's events in two polls (impressions, then interactions), the wall clock
    at the step's end."""
    for kind in ("impressions", "interactions"):
        mine = [p for p in payloads if (b'"items"' in p) == (kind == "impressions")]
        first = offsets[kind]
        offsets[kind] += len(mine)
        clock.now = max(clock.now, end)
        tasks.apply([PartitionBatch(kind, f"{kind}:0", mine, range(first, offsets[kind]))], {})


def run_on(tasks, clock) -> None:
    """The wall clock runs on for two days with the inputs idle: every request final."""
    for _ in range(2):
        clock.now += DAY_MS
        tasks.apply([], {"impressions:0": clock.now, "interactions:0": clock.now})
    tasks.settle()


@pytest.mark.parametrize("make_store", ["memory", "redis"], indirect=True)
def test_a_drop_shows_in_provisional_ndcg_before_the_window_closes(tmp_path, make_store) -> None:
    """The default 30-minute attribution window: requests are scored again 3 min 5 s
    after their impression with the clicks of their first 2 minutes. Polled every 5
    minutes of event time around the drop, from which B's users stop clicking: the
    provisional series are exported with a band and a maturity, and B is flagged before
    the first request after the drop is final (31 minutes); the stored history, final
    and provisional, equals replay's."""
    settings = load_settings(
        environ={}, overrides={k: v for k, v in SETTINGS.items() if k != "join"}
    )
    assert settings.provisional().lead == 6
    store = make_store(settings.layout(1))
    tasks, clock, registry = live(settings, store)
    offsets = {"impressions": 0, "interactions": 0}
    events = delayed_traffic(seed=8, kept=0.0)  # at 40 requests a slot: a drop to none
    flagged_at, provisional = None, []
    for end, payloads in steps(events, fine_from=DROP_AT - HOUR_MS):
        feed_step(tasks, clock, end, payloads, offsets)
        if end < DROP_AT - HOUR_MS:
            continue
        found = scrape(registry)
        value = pick(found, "recsys_eval_provisional_ndcg", variant="A", k="10")
        if value is not None:
            lower = pick(found, "recsys_eval_provisional_ndcg_lower", variant="A", k="10")
            upper = pick(found, "recsys_eval_provisional_ndcg_upper", variant="A", k="10")
            maturity = pick(
                found, "recsys_eval_provisional_maturity", variant="A", k="10", age="2m"
            )
            provisional.append((lower, value, upper, maturity))
        assert not pick(found, "recsys_eval_regression", variant="A", k="10")
        if pick(found, "recsys_eval_regression", variant="B", k="10"):
            flagged_at = flagged_at or end
        elif end < DROP_AT:
            assert flagged_at is None
    assert len(provisional) >= 12
    assert all(lo < v < up and 0.3 < m < 0.8 for lo, v, up, m in provisional), provisional
    # before any request after the drop is final: through the provisional estimate
    deadline = settings.finalise_config().deadline(DROP_AT)
    assert flagged_at is not None and DROP_AT < flagged_at < deadline, flagged_at - DROP_AT

    run_on(tasks, clock)
    imps, ints = tmp_path / "imps.jsonl", tmp_path / "ints.jsonl"
    imps.write_bytes(b"\n".join(p for _, p in events if b'"items"' in p) + b"\n")
    ints.write_bytes(b"\n".join(p for _, p in events if b'"items"' not in p) + b"\n")
    replayed = replay_history(imps, ints, settings)
    stored = store.history(0)
    assert any(name.startswith(PROVISIONAL) for _, name in stored)
    assert stored.keys() == replayed.keys()
    for key, array in replayed.items():
        assert np.array_equal(stored[key], array), key


def test_the_provisional_estimate_at_five_minutes_is_calibrated() -> None:
    """Stationary traffic (a daily cycle, clicks arriving over minutes) through the
    engine with ``regression.provisional_age = "5m"``, read every 5 minutes of event
    time for two days after a day's warm-up, as Prometheus would: the final nDCG@10 of
    the slot each exported estimate is for lies inside its exported 95% band in at
    least 90% of slots (and the band is not so wide as to say nothing)."""
    overrides = {k: v for k, v in SETTINGS.items() if k != "join"}
    settings = load_settings(
        environ={}, overrides=overrides | {"regression": {"provisional_age": "5m"}}
    )
    early = settings.provisional()
    slot = settings.regression.rules(tuple(settings.metrics.k), early).slot_ms
    tasks, clock, registry = live(settings)
    offsets = {"impressions": 0, "interactions": 0}
    events = delayed_traffic(seed=11, kept=1.0, days=3)
    read: list[tuple[str, int, float, float, float]] = []  # variant, slot, lower, value, upper
    for end, payloads in steps(events, fine_from=T0 + DAY_MS):
        feed_step(tasks, clock, end, payloads, offsets)
        if end <= T0 + DAY_MS:
            continue
        found = scrape(registry)
        frontier = tasks.store.frontier()
        assert frontier is not None
        # the estimate is for the slot ``lead`` slots after the latest final one (slots of
        # the final history are keyed by their requests' deadline)
        estimated = frontier - frontier % slot + (early.lead - 1) * slot
        for variant in "AB":
            value = pick(found, "recsys_eval_provisional_ndcg", variant=variant, k="10")
            if value is None:
                continue
            lower = pick(found, "recsys_eval_provisional_ndcg_lower", variant=variant, k="10")
            upper = pick(found, "recsys_eval_provisional_ndcg_upper", variant=variant, k="10")
            read.append((variant, estimated, lower, value, upper))
    run_on(tasks, clock)
    history = tasks.store.history(0)
    k10 = list(settings.metrics.k).index(10)
    inside, widths = [], []
    for variant, at, lower, value, upper in read:
        array = history[(at - at % HOUR_MS, variant)]
        row = array[(at % HOUR_MS) // slot]
        final = row[2 + 2 * k10] / SCALE / row[0]
        inside.append(lower <= final <= upper)
        widths.append((upper - lower) / 2 / value)
    assert len(read) >= 2 * 2 * (DAY_MS // slot) * 0.9, len(read)
    share = sum(inside) / len(inside)
    assert share >= 0.9, share
    assert float(np.median(widths)) < 0.25  # a band of at most ±25% of the value


def test_the_maturity_curve_is_exported_as_each_age_would_score_the_requests() -> None:
    """Two days of traffic whose clicks arrive over minutes, through the engine: the
    exported ``recsys_eval_ndcg_maturity`` is, per variant and age, the nDCG@10 of the
    requests finalised in the days the span overlaps, scored from scratch with the
    clicks of their first ``age`` (tests/reference.py), over their final nDCG@10."""
    settings = load_settings(
        environ={}, overrides={k: v for k, v in SETTINGS.items() if k != "join"}
    )
    ages = settings.maturity_ages_ms()
    assert ages == (60_000, 120_000, 300_000, 600_000, 1_200_000)  # the defaults
    tasks, clock, registry = live(settings)
    offsets = {"impressions": 0, "interactions": 0}
    events = delayed_traffic(seed=21, kept=1.0, days=2)
    for end, payloads in steps(events, fine_from=T0 + 2 * DAY_MS):
        feed_step(tasks, clock, end, payloads, offsets)
    run_on(tasks, clock)
    found = scrape(registry)
    frontier = tasks.store.frontier()
    assert frontier is not None
    first_day = (frontier - settings.regression.rules(()).span_ms) // DAY_MS * DAY_MS
    delay = settings.finalise_config().deadline(0)
    decoded = [json.loads(p) for _, p in events]
    clicks: dict[str, list[tuple[int, str]]] = {}
    for e in decoded:
        if "items" not in e:
            clicks.setdefault(e["request_id"], []).append((e["timestamp"], e["item_id"]))
    sums = {v: np.zeros(len(ages) + 1) for v in "AB"}
    for e in decoded:
        if "items" not in e or e["timestamp"] + delay < first_day:
            continue
        if len(set(e["items"])) < len(e["items"]):  # invalid: an item shown twice
            continue
        for a, age in enumerate((*ages, math.inf)):
            seen = {
                item for ts, item in clicks.get(e["request_id"], []) if ts - e["timestamp"] <= age
            }
            grades = [1.0 if item in seen else 0.0 for item in e["items"]]
            sums[e["variant"]][a] += reference.ndcg(grades, 10)
    for variant, total in sums.items():
        exported = [
            pick(found, "recsys_eval_ndcg_maturity", variant=variant, k="10", age=age)
            for age in ("1m", "2m", "5m", "10m", "20m")
        ]
        assert exported == pytest.approx((total[:-1] / total[-1]).tolist(), rel=1e-6), variant
        assert 0.2 < exported[0] < exported[2] < exported[4] < 1.0  # clicks over minutes
