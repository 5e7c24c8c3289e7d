"""A real Prometheus scrapes a running `evaluator run` that is processing events; every
dashboard panel expression and every alert expression is checked through the HTTP API."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.eventgen import T0, EventSet, generate
from tests.live import free_port, new_env, stop, stream, to_payloads, wait_until
from tests.livecheck import compare_history, sentinel

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "recsys-evaluator.json"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
TEMPLATE = {"$k": "10", "$window": "24h", "$variant": ".*"}


def query(base: str, expr: str) -> dict:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url) as reply:
        return json.loads(reply.read())


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(recsys_eval_[a-z_]+)\b", expr))


def start_prometheus(
    binary: str, directory: Path, metrics_port: int, port: int
) -> subprocess.Popen[bytes]:
    """A Prometheus scraping the evaluator every second with the shipped alert rules."""
    config = directory / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {
                        "job_name": "recsys-evaluator",
                        "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}],
                    }
                ],
            }
        )
    )
    return subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={directory / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(directory / "prometheus.log", "wb"),
    )


@pytest.fixture
def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is missing: apt-get install -y prometheus")
    return binary


def test_dashboard_and_alert_expressions_against_a_real_scrape(
    kafka_bootstrap, redis_url, tmp_path, prometheus_binary
) -> None:
    # a small data set that must fill every panel: A/B inference from 2 users per arm
    small = {"EVALUATOR_AB__MIN_USERS": "2", "EVALUATOR_AB__MIN_EFFECTIVE_BUCKETS": "2"}
    # an experiment from the data's start, whose users clicked the day before: CUPED
    small["EVALUATOR_AB__EXPERIMENTS__exp__START"] = str(T0)
    env = new_env(kafka_bootstrap, redis_url, overrides=small)
    events = generate(51, requests=300)
    events.impressions.append(sentinel(events, after_ms=3_600_000))
    users = sorted({e["user_id"] for e in events.impressions})
    events.interactions += [
        {"event_id": f"pre-{n}", "user_id": user, "item_id": "p1", "type": "click"}
        | {"timestamp": T0 - 86_400_000 + n}
        for n, user in enumerate(users)
    ]
    ordered = stream(
        [("impressions", e) for e in events.impressions]
        + [("interactions", e) for e in events.interactions],
        51,
    )
    env.produce("impressions", [*to_payloads(ordered, "impressions"), ("bad", b"{oops")])
    env.produce("interactions", to_payloads(ordered, "interactions"))
    metrics_port, prom_port = free_port(), free_port()
    evaluator = env.start(tmp_path / "run.log", http_port=metrics_port)
    store = env.store()
    wait_until(
        lambda: store.counters().get("finalised", 0) > 100,
        120,
        "requests are finalised",
        [evaluator],
    )
    prom = start_prometheus(prometheus_binary, tmp_path, metrics_port, prom_port)
    base = f"http://127.0.0.1:{prom_port}"
    try:

        def scraped() -> bool:
            try:
                wanted = [
                    query(base, "count(recsys_eval_ab_ndcg_diff_upper)"),
                    query(base, "sum(rate(recsys_eval_events_consumed_total[1m]))"),
                    # estimates are asked for at every refresh until one has a curve
                    query(base, "count(recsys_eval_propensity_eta)"),
                ]
            except OSError:
                return False
            return all(found["data"]["result"] for found in wanted)

        wait_until(
            scraped,
            90,
            "Prometheus has scraped window, A/B and propensity metrics",
            [evaluator, prom],
        )
        dashboard = json.loads(DASHBOARD.read_text())
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                expr = target["expr"]
                for name, value in TEMPLATE.items():
                    expr = expr.replace(name, value)
                reply = query(base, expr)
                assert reply["status"] == "success", (panel["title"], expr)
                assert reply["data"]["result"], f"no series for panel {panel['title']!r}: {expr}"
        for group in yaml.safe_load(RULES.read_text())["groups"]:
            for rule in group["rules"]:
                assert query(base, rule["expr"])["status"] == "success", rule["alert"]
                for name in metric_names(rule["expr"]):
                    series = query(base, f'count({{__name__="{name}"}})')["data"]["result"]
                    assert series, f"{rule['alert']} uses {name}, which has no series"
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        stop([evaluator])
        store.close()


def test_the_regression_alert_fires_through_prometheus(
    kafka_bootstrap, redis_url, tmp_path, prometheus_binary
) -> None:
    """Eight and a half days of two variants' traffic through `evaluator run` on the real
    broker and Redis; variant B's users stop clicking for its last six hours. A real
    Prometheus, loaded with deploy/prometheus/rules.yml, fires RecsysNdcgRegression
    for B and for no other variant. The backlog's topics are consumed at their own
    rates (hours of event time apart); the stored history is still replay's."""
    rng = random.Random(3)
    ordered: list[tuple[str, dict]] = []
    drop = T0 + 8 * 86_400_000 + 6 * 3_600_000
    requests = int(8.5 * 288 * 20)  # 20 requests per 5-minute slot
    for n in range(requests):
        ts = T0 + n * 15_000 + rng.randrange(10_000)
        user = f"u{rng.randrange(3_000)}"
        variant = "AB"[int(user[1:]) % 2]
        items = [f"i{i}" for i in rng.sample(range(200), 10)]
        event = {"event_id": f"e{n}", "request_id": f"r{n}", "user_id": user}
        ordered.append(
            ("impressions", event | {"variant": variant, "timestamp": ts, "items": items})
        )
        if variant == "B" and ts >= drop:
            continue
        for pos, item in enumerate(items):
            if rng.random() < 0.4 / (pos + 1):
                click = {"event_id": f"c{n}-{pos}", "request_id": f"r{n}", "user_id": user}
                click |= {"item_id": item, "type": "click", "timestamp": ts + 20_000}
                ordered.append(("interactions", click))
    ordered.sort(key=lambda ke: ke[1]["timestamp"])
    env = new_env(kafka_bootstrap, redis_url, overrides={"EVALUATOR_REGRESSION__MIN_REQUESTS": "5"})
    env.produce("impressions", to_payloads(ordered, "impressions"))
    env.produce("interactions", to_payloads(ordered, "interactions"))
    metrics_port, prom_port = free_port(), free_port()
    evaluator = env.start(tmp_path / "run.log", http_port=metrics_port)
    prom = start_prometheus(prometheus_binary, tmp_path, metrics_port, prom_port)
    base = f"http://127.0.0.1:{prom_port}"
    store = env.store()
    try:

        def firing() -> list[dict]:
            try:
                found = query(base, 'ALERTS{alertname="RecsysNdcgRegression", alertstate="firing"}')
            except OSError:
                return []
            return found["data"]["result"]

        wait_until(lambda: bool(firing()), 240, "RecsysNdcgRegression fires", [evaluator, prom])
        assert {a["metric"]["variant"] for a in firing()} == {"B"}
        armed = query(base, 'max by (variant) (recsys_eval_regression_armed{k="10"})')
        assert {r["metric"]["variant"]: r["value"][1] for r in armed["data"]["result"]} == {
            "A": "1",
            "B": "1",
        }
        wait_until(
            lambda: store.counters().get("finalised", 0) >= requests,
            120,
            "every request is final",
            [evaluator],
        )
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        stop([evaluator])
    assert store.counters()["finalised"] == requests
    events = EventSet(
        [e for kind, e in ordered if kind == "impressions"],
        [e for kind, e in ordered if kind == "interactions"],
    )
    compare_history(store, *events.write(tmp_path), env.settings())
    store.close()
