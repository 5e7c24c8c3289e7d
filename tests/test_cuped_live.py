"""CUPED end to end: `evaluator run` as a process on the real broker (4 partitions) and
Redis, fed three weeks of user-randomised A/A traffic whose users are active before a
named experiment starts. Checked: the stored covariate of each arm is exactly the
reference's (clicks on the 14 whole days before each user's exposure day), the CUPED
series are exported, and replay of the same events agrees: the same unadjusted
difference, a CUPED difference within a small part of its band (replay hashes users
into buckets without partitions, and CUPED's θ is estimated over those buckets)."""

from __future__ import annotations

import json
import random
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from evaluator.app.replay import evaluate_files
from evaluator.core.rows import COVARIATE
from tests.eventgen import EventSet
from tests.live import free_port, new_env, stop, stream, to_payloads, wait_until
from tests.test_ab_exported import hourly_traffic
from tests.test_cuped_exported import START, STEP, reference

pytestmark = pytest.mark.services

LABELS = {"experiment": "exp", "variant": "B", "k": "10", "adjusted": "false"}


def scraped(port: int) -> dict[str, float]:
    """The B-against-A series of experiment ``exp`` at K 10, by name, and the
    experiment's finalised requests (``requests``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as reply:
        text = reply.read().decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    out = {
        s.name: s.value
        for s in samples
        if LABELS.items() <= s.labels.items()
        and s.labels.get("method", "sequential") == "sequential"
    }
    out["requests"] = sum(
        s.value
        for s in samples
        if s.name == "recsys_eval_ab_requests" and s.labels["experiment"] == "exp"
    )
    return out


def b_at_10(comparisons: list[dict]) -> dict:
    """Replay's comparison of B with the control at K 10, unadjusted for position."""
    return next(c for c in comparisons if (c["variant"], c["k"], c["adjusted"]) == ("B", 10, False))


def test_cuped_end_to_end_on_the_broker_and_redis(kafka_bootstrap, redis_url, tmp_path) -> None:
    env = new_env(
        kafka_bootstrap,
        redis_url,
        overrides={
            "EVALUATOR_AB__EXPERIMENTS__exp__START": str(START),
            "EVALUATOR_AB__MIN_USERS": "300",
            "EVALUATOR_JOIN__ATTRIBUTION_WINDOW": "5m",
        },
    )
    steps = hourly_traffic(
        random.Random(9), hours=21 * 6, users=1_500, step_ms=STEP, per_step=(70, 100)
    )
    events = EventSet(
        [json.loads(raw) for step in steps for raw in step if b'"items"' in raw],
        [json.loads(raw) for step in steps for raw in step if b'"items"' not in raw],
    )
    ordered = stream(
        [("impressions", e) for e in events.impressions]
        + [("interactions", e) for e in events.interactions],
        9,
    )
    for kind in ("impressions", "interactions"):
        env.produce(kind, to_payloads(ordered, kind))
    port = free_port()
    proc = env.start(tmp_path / "run.log", http_port=port)
    store = env.store()
    try:
        want = len(events.impressions)
        wait_until(
            lambda: store.counters().get("finalised", 0) >= want, 180, "all finalised", [proc]
        )
        in_exp = sum(e["timestamp"] >= START for e in events.impressions)
        wait_until(  # the readout is refreshed in the background: one after the last
            lambda: scraped(port)["requests"] == in_exp,
            30,
            "/metrics shows every request of the experiment",
            [proc],
        )
        found = scraped(port)
    finally:
        stop([proc])
    blocks = store.experiment_blocks("exp")
    x, users = (store.layout.schema.index(n) for n in COVARIATE)
    for variant, (total, covered) in reference(steps).items():
        assert covered > 300
        assert blocks[variant][..., x].sum() == total
        assert blocks[variant][..., users].sum() == covered
    assert found["recsys_eval_ab_cuped_variance_reduction"] > 0.0
    lower = found["recsys_eval_ab_cuped_ndcg_diff_lower"]
    upper = found["recsys_eval_ab_cuped_ndcg_diff_upper"]
    assert lower <= 0.0 <= upper  # A/A
    files = events.write(tmp_path)
    replayed = evaluate_files(*files, env.settings(), progress=False)["ab"]["exp"]
    raw, cuped = b_at_10(replayed["comparisons"]), b_at_10(replayed["cuped"])
    assert found["recsys_eval_ab_ndcg_diff"] == pytest.approx(raw["diff"], rel=1e-9)
    assert abs(found["recsys_eval_ab_cuped_ndcg_diff"] - cuped["diff"]) < 0.05 * (upper - lower)
    store.close()
