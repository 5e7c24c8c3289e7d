"""The A/B series as exported, over a long run: user-randomised A/A traffic fed hour by
hour through the live partition engine and the embedded store, scraped from the
registered collector after every hour while the sliding windows roll over many
times (three days of event time against windows of 5 min to 24 h).

Checked on the exported series: they are cumulative since the experiment's start
(requests and users only grow, and at the end hold every request, although the
24 h window holds a third of them), the users per arm are the exact distinct users,
inference starts only with enough users, the bounds never cross, and this A/A
experiment is never flagged (nor its sample ratio, whose p-value at every look is the
always-valid one). The false-positive rates over 500 experiments are in
tests/test_ab_readout.py, through the same readout function.
"""

from __future__ import annotations

import json
import random

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from evaluator.adapters.memory import MemoryStore
from evaluator.adapters.prometheus.collector import WindowCollector
from evaluator.config import Settings, load_settings
from evaluator.config.plain import readout_config, tasks_config
from evaluator.core.ab.stats import SRM_CONCENTRATION
from evaluator.engine.batches import PartitionBatch
from evaluator.engine.ports import StateStore
from evaluator.engine.tasks import Tasks
from evaluator.readout.live import LiveReader
from tests.livecheck import FakeClock
from tests.reference import srm_sequential_p

HOUR = 3_600_000
T0 = 1_767_225_600_000


PREFIXES = (
    "recsys_eval_ab_",
    "recsys_eval_regression",
    "recsys_eval_provisional",
    "recsys_eval_srm",
    "recsys_eval_requests",
    "recsys_eval_interleaving",
    "recsys_eval_ndcg_maturity",
)


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith(PREFIXES)
    }


def pick(found: dict, name: str, **labels: str) -> float | None:
    hits = [v for (n, ls), v in found.items() if n == name and labels.items() <= dict(ls).items()]
    assert len(hits) <= 1, (name, labels)
    return hits[0] if hits else None


def hourly_traffic(
    rng: random.Random,
    hours: int,
    users: int,
    *,
    step_ms: int = HOUR,
    per_step: tuple[int, int] = (100, 160),
) -> list[list[bytes]]:
    """Per hour (or ``step_ms``), impressions and interactions (JSON) of user-randomised
    A/A traffic: the variant is the user's coin, every user has their own click
    propensity."""
    arm = {u: "AB"[rng.random() < 0.5] for u in range(users)}
    taste = {u: rng.betavariate(2, 3) for u in range(users)}
    activity = [rng.lognormvariate(0.0, 1.0) for _ in range(users)]  # overdispersed
    population = range(users)
    out: list[list[bytes]] = []
    n = 0
    for h in range(hours):
        hour: list[bytes] = []
        for _ in range(rng.randint(*per_step)):
            u = rng.choices(population, weights=activity)[0]
            ts = T0 + h * step_ms + rng.randrange(step_ms)
            items = [f"p{rng.randrange(500)}" for _ in range(10)]
            items = list(dict.fromkeys(items))
            rid = f"r{n}"
            n += 1
            hour.append(
                json.dumps(
                    {
                        "event_id": f"i{rid}",
                        "request_id": rid,
                        "user_id": f"u{u}",
                        "variant": arm[u],
                        "timestamp": ts,
                        "items": items,
                    }
                ).encode()
            )
            for k, item in enumerate(items):
                if rng.random() < taste[u] / (k + 1):
                    hour.append(
                        json.dumps(
                            {
                                "event_id": f"e{rid}-{k}",
                                "user_id": f"u{u}",
                                "item_id": item,
                                "request_id": rid,
                                "type": "click",
                                "timestamp": ts + 5_000,
                            }
                        ).encode()
                    )
        out.append(hour)
    return out


def deliver(
    tasks: Tasks,
    clock: FakeClock,
    hour: list[bytes],
    offsets: dict[str, int],
    kinds: tuple[str, ...] = ("impressions", "interactions"),
) -> None:
    """An hour of traffic in two polls (its impressions, then its interactions; or
    ``kinds`` only), the wall clock half an hour on each time and never behind the
    data."""
    for kind in kinds:
        payloads = [p for p in hour if (b'"items"' in p) == (kind == "impressions")]
        first = offsets[kind]
        offsets[kind] += len(payloads)
        batch = PartitionBatch(kind, f"{kind}:0", payloads, range(first, offsets[kind]))
        newest = max((json.loads(p)["timestamp"] for p in payloads), default=0)
        clock.now = max(clock.now + 1_800_000, newest)
        tasks.apply([batch], {})


def live(
    settings: Settings, store: StateStore | None = None
) -> tuple[Tasks, FakeClock, CollectorRegistry]:
    """One partition's engine on ``store`` (default: the embedded one), a wall clock
    that follows the data (live traffic), and a registry holding the exporter's
    collector."""
    store = store or MemoryStore(settings.layout(1))
    clock = FakeClock(T0)
    tasks = Tasks(store, tasks_config(settings, 1), clock_ms=clock)
    tasks.assign([0])
    registry = CollectorRegistry()
    registry.register(WindowCollector(LiveReader(store, readout_config(settings), store.frontier)))
    return tasks, clock, registry


def note_exposures(payloads: list[bytes], exposed: dict[str, set[str]]) -> int:
    """Add the impressions' users to their variant's set; returns the impressions."""
    impressions = [json.loads(p) for p in payloads if b'"items"' in p]
    for event in impressions:
        exposed[event["variant"]].add(event["user_id"])
    return len(impressions)


def test_exported_ab_series_over_a_long_run() -> None:
    settings = load_settings(
        environ={},
        overrides={
            "ab": {"min_users": 300},
            "join": {"attribution_window": "5m"},
            "kafka": {"partitioner": "trust"},
        },
    )
    tasks, clock, registry = live(settings)
    rng = random.Random(3)
    traffic = hourly_traffic(rng, hours=72, users=2_500)
    offsets = {"impressions": 0, "interactions": 0}
    exposed: dict[str, set[str]] = {"A": set(), "B": set()}
    last_requests = last_users = 0.0
    ready_looks = lifted = 0
    for hour in traffic:
        deliver(tasks, clock, hour, offsets)
        note_exposures(hour, exposed)
        found = scrape(registry)
        users = sum(pick(found, "recsys_eval_ab_users", variant=v) or 0 for v in "AB")
        requests = sum(pick(found, "recsys_eval_ab_requests", variant=v) or 0 for v in "AB")
        assert users >= last_users and requests >= last_requests  # cumulative: never shrinks
        last_users, last_requests = users, requests
        for v in "AB":  # exact distinct users, each counted at their first exposure
            assert pick(found, "recsys_eval_ab_users", variant=v) == len(exposed[v])
        # the sample-ratio p-value, read at every look, is the always-valid one
        srm = pick(found, "recsys_eval_srm_p_value")
        want = srm_sequential_p([len(exposed["A"]), len(exposed["B"])], [1, 1], SRM_CONCENTRATION)
        assert srm == pytest.approx(want, rel=1e-9) and srm >= 0.001
        labels = {"variant": "B", "k": "10", "adjusted": "false"}
        lower = pick(found, "recsys_eval_ab_ndcg_diff_lower", **labels)
        upper = pick(found, "recsys_eval_ab_ndcg_diff_upper", **labels)
        ready = pick(found, "recsys_eval_ab_ready", variant="B")
        if min(len(exposed["A"]), len(exposed["B"])) < 300:
            assert lower is None and ready == 0.0  # no inference before min_users
        if lower is not None:
            ready_looks += 1
            assert lower <= upper  # never crossed
            assert lower <= 0.0 <= upper  # an A/A test: never flagged
            # the lift's bounds, as exported, agree with the difference's at every look
            lift_lower = pick(found, "recsys_eval_ab_ndcg_lift_lower", **labels)
            lift_upper = pick(found, "recsys_eval_ab_ndcg_lift_upper", **labels)
            assert lift_lower is not None and lift_upper is not None
            assert lift_lower <= 0.0 <= lift_upper
            lifted += 1
    print(
        {k: v for k, v in found.items() if "ready" in k[0] or "users" in k[0] or "diff" in k[0]},
        tasks.stats.finalised,
    )
    assert ready_looks >= 48 and lifted == ready_looks
    # the experiment holds every request finalised, the 24 h window only the last day
    day = sum(
        pick(found, "recsys_eval_requests", variant=v, window="24h", cohort="all") or 0
        for v in "AB"
    )
    assert last_requests == tasks.stats.finalised and day < last_requests / 2


def test_a_90_day_experiment_exports_its_exact_distinct_users() -> None:
    """With the defaults, users who come back weeks or months after their first exposure
    are not counted again: after every day of a 90-day experiment the exported users per
    arm are the exact distinct users (a version that forgot exposures after 30 days
    exported about a third more), and the sample-ratio test of this exact 50/50 split
    never alarms."""
    settings = load_settings(environ={}, overrides={"kafka": {"partitioner": "trust"}})
    tasks, clock, registry = live(settings)
    rng = random.Random(11)
    days = hourly_traffic(rng, hours=90, users=1_500, step_ms=24 * HOUR, per_step=(40, 70))
    offsets = {"impressions": 0, "interactions": 0}
    exposed: dict[str, set[str]] = {"A": set(), "B": set()}
    impressions = 0
    for day in days:
        deliver(tasks, clock, day, offsets)
        impressions += note_exposures(day, exposed)
        found = scrape(registry)
        for v in "AB":
            assert pick(found, "recsys_eval_ab_users", variant=v) == len(exposed[v])
        assert (pick(found, "recsys_eval_srm_p_value") or 0.0) >= 0.001
    users = len(exposed["A"]) + len(exposed["B"])
    assert impressions > 2 * users  # most users came back, many after 30 days
