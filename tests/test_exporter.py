"""Prometheus export: names, labels and values against replay; HTTP endpoints."""

from __future__ import annotations

import urllib.error
import urllib.request

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from evaluator.adapters.memory import MemoryStore
from evaluator.adapters.prometheus.collector import WindowCollector
from evaluator.adapters.prometheus.pipeline import PipelineCollector
from evaluator.adapters.web.http import serve
from evaluator.app.replay import evaluate_files
from evaluator.config import load_settings
from evaluator.config.plain import readout_config, tasks_config
from evaluator.core.ab.stats import SRM_CONCENTRATION
from evaluator.engine.tasks import Tasks
from evaluator.readout.live import LiveReader
from evaluator.readout.windows import OTHER, cap_variants, window_totals
from tests.eventgen import generate
from tests.livecheck import SENTINEL_VARIANT, FakeClock, feed, sentinel
from tests.reference import srm_sequential_p


def samples(registry: CollectorRegistry) -> dict[str, list]:
    text = generate_latest(registry).decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def live_run(events, settings=None, seed: int = 0):
    """Feed events (plus a sentinel an hour later) through the pipeline on the embedded
    store; returns the settings, the pipeline and the window collector."""
    settings = settings or load_settings(environ={})
    store = MemoryStore(settings.layout(2))
    tasks = Tasks(store, tasks_config(settings, 2), clock_ms=FakeClock())
    tasks.assign([0, 1])
    events.impressions.append(sentinel(events, after_ms=3_600_000))
    # the wall clock ends before the sentinel's deadline: only the sentinel stays open
    end = events.impressions[-1]["timestamp"] + 30 * 60_000
    feed(tasks, events, seed, end_ms=end)
    return (
        settings,
        tasks,
        WindowCollector(LiveReader(store, readout_config(settings), store.frontier)),
    )


AB_SETTINGS = {
    "ab": {
        "experiments": {"ranker": {"variants": ["A", "B", "C"], "control": "A"}},
        "min_users": 5,
        "min_effective_buckets": 2,
    }
}


def randomised_by_user(events):
    """Each user sees one variant (``u<n>`` -> A, B, C by n), as an A/B test assigns."""
    for imp in events.impressions:
        imp["variant"] = "ABC"[int(imp["user_id"][1:]) % 3]
    return events


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    events = randomised_by_user(generate(41, requests=400))
    settings = load_settings(environ={}, overrides=AB_SETTINGS)
    settings, pipeline, collector = live_run(events, settings, seed=41)
    registry = CollectorRegistry()
    registry.register(collector)
    registry.register(PipelineCollector(pipeline.stats, watermark=pipeline.watermark))
    imp, inter = events.write(tmp_path_factory.mktemp("replay"))
    report = evaluate_files(imp, inter, settings, progress=False)
    return samples(registry), report


def pick(found, name, **labels):
    matches = [s.value for s in found[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matches) == 1, (name, labels, len(matches))
    return matches[0]


def test_window_metrics_equal_replay(scraped) -> None:
    found, report = scraped
    for variant, block in report["variants"].items():
        if variant == SENTINEL_VARIANT:
            continue
        assert (
            pick(found, "recsys_eval_requests", variant=variant, window="24h", cohort="all")
            == block["requests"]
        )
        for k in ("10", "20"):
            got = pick(
                found,
                "recsys_eval_ndcg",
                variant=variant,
                k=k,
                window="24h",
                adjusted="false",
                cohort="all",
            )
            assert got == pytest.approx(block["ndcg"][k], abs=1e-9)
            got = pick(
                found, "recsys_eval_mrr", variant=variant, k=k, window="24h", cohort="cold_start"
            )
            assert got == pytest.approx(block["cohorts"]["cold_start"]["mrr"][k], abs=1e-9)


def test_ab_series_and_bounded_labels(scraped) -> None:
    found, _ = scraped
    diffs = found["recsys_eval_ab_ndcg_diff"]
    assert {s.labels["control"] for s in diffs} == {"A"}
    assert {s.labels["variant"] for s in diffs} == {"B", "C"}
    for s in diffs:
        lower = pick(found, "recsys_eval_ab_ndcg_diff_lower", **s.labels)
        upper = pick(found, "recsys_eval_ab_ndcg_diff_upper", **s.labels)
        assert lower <= s.value <= upper
    methods = {s.labels["method"] for s in found["recsys_eval_ab_p_value"]}
    assert methods == {"sequential", "holm", "fixed"}
    by_method: dict[str, dict[tuple, float]] = {}
    for s in found["recsys_eval_ab_p_value"]:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "method"))
        by_method.setdefault(s.labels["method"], {})[key] = s.value
    # two arms (B, C) against A: Holm's value is never below the arm's own
    assert by_method["holm"].keys() == by_method["sequential"].keys()
    assert all(by_method["holm"][k] >= p for k, p in by_method["sequential"].items())
    assert {s.labels["experiment"] for s in found["recsys_eval_srm_p_value"]} == {"ranker"}
    assert all(0 <= s.value <= 1 for s in found["recsys_eval_srm_p_value"])
    assert all(s.value == 1.0 for s in found["recsys_eval_ab_ready"])
    for samples_ in found.values():
        for s in samples_:
            assert not any(key in s.labels for key in ("user", "user_id", "item", "item_id"))
    assert pick(found, "recsys_eval_late_events_total") >= 0
    assert pick(found, "recsys_eval_events_consumed_total", topic="impressions") > 0
    batches = pick(found, "recsys_eval_batch_processing_seconds_count")
    assert batches > 0
    assert pick(found, "recsys_eval_batch_processing_seconds_bucket", le="+Inf") == batches


def test_variants_beyond_the_cap_fold_into_other() -> None:
    totals = {v: np.full((2, 4, 3), float(n)) for n, v in enumerate(["a", "b", "c"], start=1)}
    capped = cap_variants(totals, [], 2)
    assert set(capped) == {"c", "b", OTHER}
    assert capped[OTHER][0, 0, 0] == 1.0
    assert set(cap_variants(totals, ["a"], 5)) == {"a", OTHER}
    # a variant really named "other" keeps its own counts, with the rest added
    totals[OTHER] = np.full((2, 4, 3), 10.0)
    assert cap_variants(totals, [], 2)[OTHER][0, 0, 0] == 10.0 + 1.0 + 2.0


def test_a_window_sums_the_buckets_that_overlap_it() -> None:
    """At least the window, at most one bucket more: the bucket holding the window's
    start counts whole, one ending at it does not, nor one after the frontier."""
    layout = load_settings(environ={}).layout(1)
    window = layout.windows_ms[0]
    width = layout.bucket_width(window)
    blocks = {(n * width, "a"): np.full(1, float(n)) for n in range(40)}
    aligned = 30 * width  # buckets 18..30 overlap (aligned - window, aligned]
    assert window == 12 * width
    assert window_totals(blocks, window, aligned, layout)["a"][0] == sum(range(18, 31))
    inside = aligned + width // 2  # buckets 18..30 again: 18 holds the window's start
    assert window_totals(blocks, window, inside, layout)["a"][0] == sum(range(18, 31))


def test_http_endpoints() -> None:
    from prometheus_client import Gauge

    registry = CollectorRegistry()
    Gauge("recsys_eval_test", "A test gauge.", ["variant"], registry=registry).labels("a").set(1)
    state = {"ready": (False, "no Kafka partitions assigned")}
    server = serve(
        registry,
        "127.0.0.1",
        0,
        alive=lambda: True,
        ready=lambda: state["ready"],
    )
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with urllib.request.urlopen(base + "/metrics") as reply:
            assert reply.status == 200
            assert reply.headers["Content-Type"].startswith("text/plain")
            assert b'recsys_eval_test{variant="a"} 1.0' in reply.read()
        with urllib.request.urlopen(base + "/healthz") as reply:
            assert reply.read() == b"ok\n"
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(base + "/readyz")
        assert info.value.code == 503
        state["ready"] = (True, "ready")
        with urllib.request.urlopen(base + "/readyz") as reply:
            assert reply.status == 200
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(base + "/nope")
        assert info.value.code == 404
    finally:
        server.shutdown()


def test_coverage_counts_distinct_top_k_items(scraped) -> None:
    found, report = scraped
    # every request lies in the 24h window; catalog = items shown in any finalised list
    for variant, block in report["variants"].items():
        if variant == SENTINEL_VARIANT:
            continue
        catalog = block["catalog_size"] - 1  # replay also saw the sentinel's single item
        for k in ("10", "20"):
            want = block["coverage"][k] * block["catalog_size"] / catalog
            got = pick(found, "recsys_eval_coverage", variant=variant, k=k, window="24h")
            assert got == pytest.approx(want, abs=1e-9)


def test_diversity_equals_replay(scraped) -> None:
    found, report = scraped
    for variant, block in report["variants"].items():
        if variant == SENTINEL_VARIANT:
            continue
        for k in ("10", "20"):
            got = pick(found, "recsys_eval_diversity", variant=variant, k=k, window="24h")
            assert got == pytest.approx(block["diversity"][k], abs=1e-9)
        composite = pick(found, "recsys_eval_composite_score", variant=variant, window="24h")
        assert 0 < composite < 1


def test_overlap_is_the_jaccard_of_top_k_item_sets(tmp_path) -> None:
    events = generate(43, requests=200)
    _, _, collector = live_run(events, seed=43)
    registry = CollectorRegistry()
    registry.register(collector)
    found = samples(registry)
    shown: dict[str, list[list[str]]] = {}
    seen: set[str] = set()
    for e in events.impressions:
        if e["request_id"] not in seen and e["variant"] != SENTINEL_VARIANT:
            seen.add(e["request_id"])
            shown.setdefault(e["variant"], []).append(e["items"])
    for k in (10, 20):
        control = {i for items in shown["A"] for i in items[:k]}
        for variant in ("B", "C"):
            mine = {i for items in shown[variant] for i in items[:k]}
            want = len(mine & control) / len(mine | control)
            got = pick(
                found,
                "recsys_eval_ab_overlap",
                variant=variant,
                control="A",
                k=str(k),
                window="24h",
            )
            assert got == pytest.approx(want, abs=1e-12)


def test_label_values_are_escaped_in_the_exposition(tmp_path) -> None:
    """The registered collector goes through the client library's own exposition."""
    events = generate(44, requests=150)
    events.impressions[0]["variant"] = 'quo"te\\back'  # label values are escaped
    _, _, collector = live_run(events, seed=44)
    registry = CollectorRegistry()
    registry.register(collector)
    found = samples(registry)
    assert any(s.labels.get("variant") == 'quo"te\\back' for s in found["recsys_eval_requests"])


def test_rbo_with_shadow_rankings(tmp_path) -> None:
    from tests import reference

    settings = load_settings(environ={}, overrides={"ab": {"control": "A"}})
    events = generate(45, requests=150)
    want: dict[str, list[float]] = {}
    seen: set[str] = set()
    for e in events.impressions:  # duplicates (at-least-once copies) carry it too
        if e["variant"] != "A":
            shadow = list(reversed(e["items"]))[:15]
            # the control's shadow is the one compared, even when another sorts first
            e["shadow"] = {"A": shadow, "0-first-by-name": e["items"]}
            if e["request_id"] not in seen:
                seen.add(e["request_id"])
                rbo = reference.rbo_ext(e["items"], shadow, 0.9)
                want.setdefault(e["variant"], []).append(rbo)
    _, _, collector = live_run(events, settings, seed=45)
    registry = CollectorRegistry()
    registry.register(collector)
    found = samples(registry)
    for variant, values in want.items():
        got = pick(found, "recsys_eval_ab_overlap", variant=variant, measure="rbo", window="24h")
        assert got == pytest.approx(sum(values) / len(values), abs=1e-9)
    assert not [
        s
        for s in found["recsys_eval_ab_overlap"]
        if s.labels["variant"] == "A" and s.labels["measure"] == "rbo"
    ]


def test_readout_refreshes_in_the_background() -> None:
    import threading

    from evaluator.adapters.web.http import Refreshed

    calls: list[int] = []
    refreshed = threading.Event()

    def compute() -> bytes:
        calls.append(1)
        if len(calls) >= 2:
            refreshed.set()
        return f"recsys_eval_x {len(calls)}\n".encode()

    cached = Refreshed(compute, interval_s=0.05)
    try:
        assert cached.get() == b"recsys_eval_x 1\n"  # first read computes synchronously
        assert refreshed.wait(timeout=10)
        assert cached.get() != b"recsys_eval_x 1\n"
    finally:
        cached.close()


def test_experiments_have_their_own_control_and_srm() -> None:
    settings = load_settings(
        environ={},
        overrides={
            "ab": {
                "experiments": {
                    "e1": {"control": "B", "variants": ["A", "B"]},
                    "e2": {"control": "A", "variants": ["A", "C"], "split": {"A": 1, "C": 1}},
                }
            }
        },
    )
    events = generate(46, requests=200)
    _, _, collector = live_run(events, settings, seed=46)
    registry = CollectorRegistry()
    registry.register(collector)
    found = samples(registry)
    pairs = {
        (s.labels["experiment"], s.labels["variant"], s.labels["control"])
        for s in found["recsys_eval_ab_ndcg_diff"]
    }
    assert pairs == {("e1", "A", "B"), ("e2", "C", "A")}
    assert {s.labels["experiment"] for s in found["recsys_eval_srm_p_value"]} == {"e1", "e2"}


def test_an_arm_without_traffic_shows_in_the_exported_srm() -> None:
    """An experiment whose configured arm D gets no traffic at all: as scraped, D is
    an arm with 0 users and the sample-ratio p-value flags the experiment."""
    settings = load_settings(
        environ={},
        overrides={"ab": {"experiments": {"starved": {"control": "A", "variants": ["A", "D"]}}}},
    )
    events = generate(47, requests=600, users=240)
    assert "D" not in {e["variant"] for e in events.impressions}
    _, _, collector = live_run(events, settings, seed=47)
    registry = CollectorRegistry()
    registry.register(collector)
    found = samples(registry)
    assert pick(found, "recsys_eval_ab_users", experiment="starved", variant="D") == 0
    assert pick(found, "recsys_eval_ab_users", experiment="starved", variant="A") > 60
    # the always-valid p-value needs ~45 users to cross the alert's 0.001 here
    assert pick(found, "recsys_eval_srm_p_value", experiment="starved") < 0.001


def test_open_and_due_request_gauges(scraped) -> None:
    """Everything the watermark passed is finalised; only the sentinel, an hour after
    the rest, is still open and not yet due."""
    found, _ = scraped
    assert pick(found, "recsys_eval_open_requests") == 1
    assert pick(found, "recsys_eval_due_requests") == 0


def test_ab_readout_is_cumulative_and_counts_users(scraped, tmp_path) -> None:
    """The experiment's difference is that of the means over every finalised request
    (replay's 24h report holds them all), and users are counted exactly, once each."""
    found, report = scraped
    events = randomised_by_user(generate(41, requests=400))
    exposed: dict[str, set[str]] = {}
    for imp in events.impressions:
        exposed.setdefault(imp["variant"], set()).add(imp["user_id"])
    for variant, users in exposed.items():
        assert pick(found, "recsys_eval_ab_users", variant=variant) == len(users)
        requests = report["variants"][variant]["requests"]
        assert pick(found, "recsys_eval_ab_requests", variant=variant) == requests
    counts = [len(exposed[v]) for v in "ABC"]
    want = srm_sequential_p(counts, [1, 1, 1], SRM_CONCENTRATION)  # the always-valid one
    assert pick(found, "recsys_eval_srm_p_value") == pytest.approx(want, rel=1e-6)
    for variant in ("B", "C"):
        for k in ("10", "20"):
            want = report["variants"][variant]["ndcg"][k] - report["variants"]["A"]["ndcg"][k]
            got = pick(found, "recsys_eval_ab_ndcg_diff", variant=variant, k=k, adjusted="false")
            assert got == pytest.approx(want, abs=1e-9)


def test_no_inference_before_min_users() -> None:
    """With the default minimum of users per arm, a small experiment shows its
    difference but no interval or p-value, and says it is not ready."""
    events = randomised_by_user(generate(43, requests=300))
    _, _, collector = live_run(events)
    registry = CollectorRegistry()
    registry.register(collector)
    found = samples(registry)
    assert found["recsys_eval_ab_ndcg_diff"]
    assert "recsys_eval_ab_ndcg_diff_lower" not in found
    assert "recsys_eval_ab_p_value" not in found
    assert {s.value for s in found["recsys_eval_ab_ready"]} == {0.0}


@pytest.mark.parametrize("policy", ["count", "skip"])
def test_gauges_and_ab_difference_share_one_mean(policy) -> None:
    """Under both zero-relevance policies the A/B difference is the difference of the
    per-variant nDCG gauges (the data fits in the 24h window, so they hold the same
    requests as the experiment)."""
    events = randomised_by_user(generate(45, requests=400))
    overrides = {**AB_SETTINGS, "metrics": {"zero_relevance": policy}}
    _, _, collector = live_run(events, load_settings(environ={}, overrides=overrides))
    registry = CollectorRegistry()
    registry.register(collector)
    found = samples(registry)
    for variant in ("B", "C"):
        for adjusted in ("false", "true"):
            gauge = {
                v: pick(
                    found,
                    "recsys_eval_ndcg",
                    variant=v,
                    k="10",
                    window="24h",
                    adjusted=adjusted,
                    cohort="all",
                )
                for v in ("A", variant)
            }
            diff = pick(
                found, "recsys_eval_ab_ndcg_diff", variant=variant, k="10", adjusted=adjusted
            )
            assert diff == pytest.approx(gauge[variant] - gauge["A"], abs=1e-12)
