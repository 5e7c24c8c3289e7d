"""The demo's dashboard page in headless Chromium (Debian's chromium + chromedriver):
it loads, receives live data, renders charts with values, and is saved as a screenshot."""

from __future__ import annotations

import os
import shutil

import pytest

from evaluator.core.metrics.registry import REGISTRY
from tests.live import running_demo

SCREENSHOT_ENV = "DASHBOARD_SCREENSHOT"
"""Set it to a path to keep the screenshot (docs/img/dashboard.png was made this way)."""


@pytest.fixture
def demo_server():
    with running_demo(requests_per_s=400.0) as base:
        yield base + "/"


def _driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail("chromium is missing: apt-get install -y chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1280,1100",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)


def _stale() -> tuple[type[Exception], ...]:
    """What a wait retries: an element a redraw replaced between finding and reading it."""
    from selenium.common.exceptions import StaleElementReferenceException

    return (StaleElementReferenceException,)


_READ = """
const page = {};
for (const [name, selector] of Object.entries(arguments[0])) {
  page[name] = Array.from(document.querySelectorAll(selector)).map((e) => {
    const found = {text: (e.innerText ?? e.textContent ?? "").trim()};
    for (const a of e.getAttributeNames()) found[a] = e.getAttribute(a);
    found.cells = Array.from(e.querySelectorAll("td")).map((c) => c.innerText.trim());
    return found;
  });
}
return page;
"""


def _read(browser, **selectors: str) -> dict[str, list[dict]]:
    """Every element each selector finds, with its text, attributes and cells, read in
    one script: the page redraws every 2 s, so elements found one call and read the next
    may be gone (a stale element); one script runs between two redraws."""
    return browser.execute_script(_READ, selectors)


def _text(page: dict[str, list[dict]], name: str) -> str:
    """The text of the one element `name` found."""
    found = page[name]
    assert len(found) == 1, (name, found)
    return found[0]["text"]


def test_dashboard_renders_live_values(demo_server, tmp_path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser = _driver()
    try:
        browser.get(demo_server)
        wait = WebDriverWait(browser, 60, poll_frequency=0.5, ignored_exceptions=_stale())
        wait.until(lambda b: b.execute_script("return document.body.dataset.ready") == "true")
        # ... and until the A/B band and both variants' lines are drawn
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#ab-chart path.band")) >= 1)
        # ... and until every nDCG line (raw and adjusted, both variants) has several points
        final = "#ndcg-chart path.series.raw, #ndcg-chart path.series.adjusted"
        wait.until(
            lambda b: all(
                "L" in (p.get_attribute("d") or "") for p in b.find_elements(By.CSS_SELECTOR, final)
            )
        )
        # the provisional line: the newest requests' estimated final nDCG, per variant
        early = "#ndcg-chart path.series.provisional"
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, early)) == 2)
        page = _read(
            browser,
            lines=final,
            legend="#ndcg-legend",
            young=early,
            heads="#metrics-table th",
            rows="#metrics-table tr[data-variant]",
            bars="#requests-chart rect.bar",
            arms="#users-chart path.users",
            users="#users-text",
            ab="#ab-text",
            note="#time-note",
            ticks="#ab-chart text.tick",
            health="#health",
            propensity="#propensity-chart path.series",
            status="#status",
        )
        lines = page["lines"]
        assert len(lines) == 4
        assert {line["data-variant"] for line in lines} == {"control", "treatment"}
        assert all(len(line["d"] or "") > 10 for line in lines)
        legend = _text(page, "legend")
        assert "control: raw 0." in legend and "treatment: raw 0." in legend
        assert {line["data-variant"] for line in page["young"]} == {"control", "treatment"}
        assert "provisional 0." in legend
        # the table has a column per exported metric of the registry, a row per variant
        heads = [h["text"] for h in page["heads"]]
        assert heads == ["variant", *(m.label for m in REGISTRY if m.family)]
        rows = page["rows"]
        assert {r["data-variant"] for r in rows} == {"control", "treatment"}
        for r in rows:
            cells = r["cells"][1:]
            assert cells and all(0.0 <= float(c) <= 1.0 for c in cells), cells
        bars = page["bars"]
        assert len(bars) == 2 and all(float(b["height"] or 0) > 0 for b in bars)
        # users per arm since the experiment's start, with the sample-ratio test
        assert {a["data-arm"] for a in page["arms"]} == {"default/control", "default/treatment"}
        assert "SRM p" in _text(page, "users")
        # the A/B text carries the sequential p-value once inference is available
        assert "sequential p" in _text(page, "ab")
        # the demo runs event time 20x faster than the wall clock, and says so
        assert "faster than the wall clock" in _text(page, "note")
        ticks = [t["text"] for t in page["ticks"]]
        assert ticks and all(len(t.split(".")[-1]) <= 4 for t in ticks if "." in t)  # rounded
        health = _text(page, "health")
        assert "consumed" in health and "finalised" in health
        assert page["propensity"]
        assert "live" in _text(page, "status")
        shot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        keep = os.environ.get(SCREENSHOT_ENV)
        if keep:
            shutil.copyfile(shot, keep)
    finally:
        browser.quit()


def test_dashboard_draws_the_interleaving_preference(tmp_path) -> None:
    """`evaluator demo --interleave`: the interleaving card draws the preference for the
    better ranker with its always-valid band, and says which ranker wins."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with running_demo(requests_per_s=400.0, interleave=True) as base:
        browser = _driver()
        try:
            browser.get(base + "/")
            wait = WebDriverWait(browser, 90, poll_frequency=0.5, ignored_exceptions=_stale())
            # the band, and a line of several snapshots
            wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#il-chart path.band")) >= 1)
            wait.until(
                lambda b: any(
                    "L" in (p.get_attribute("d") or "")
                    for p in b.find_elements(By.CSS_SELECTOR, "#il-chart path.series")
                )
            )
            page = _read(browser, il="#il-text", ab="#ab-text")
            text = _text(page, "il")
            assert "default: treatment over control" in text and "sequential p" in text
            assert "% of decided lists" in text
            assert _text(page, "ab") == "no comparison yet"
        finally:
            browser.quit()


def test_dashboard_marks_a_variant_in_regression() -> None:
    """The page served from read models whose detector flags one variant: the legend
    says which, since when (event time), and shows its provisional nDCG and band."""
    from prometheus_client import CollectorRegistry
    from selenium.webdriver.support.ui import WebDriverWait

    from evaluator.adapters.web.dashboard import DashboardHistory, routes
    from evaluator.adapters.web.http import serve
    from evaluator.core.regression import Detection
    from evaluator.readout.model import GroupView, ReadModel, VariantView, WindowView

    since_ms = 1_767_225_600_000 + 7 * 3_600_000  # 2026-01-01 07:00 UTC
    history = DashboardHistory("5m", 10)
    for n in range(3):
        views = []
        for variant in ("control", "treatment"):
            group = GroupView(100.0, 50.0, {("ndcg", 10): 0.5 + 0.01 * n}, {})
            views.append(VariantView(variant, {"all": group}, {10: 0.1}, {10: 0.2}, 0.4))
        model = ReadModel(1_767_250_000_000, windows=[WindowView("5m", views)])
        model.regression = {
            ("control", 10): Detection(0.1, False, None, 0.5, 0.5, True, 0.51, 0.02, 0.6, 0.3),
            ("treatment", 10): Detection(
                1.2, True, since_ms, 0.4, 0.5, True, 0.41, 0.03, 0.6, 0.25
            ),
        }
        history.record(model, now_s=1000.0 + n)
    server = serve(
        CollectorRegistry(),
        "127.0.0.1",
        0,
        alive=lambda: True,
        ready=lambda: (True, "ok"),
        routes=routes(history),
    )
    browser = _driver()
    try:
        browser.get(f"http://127.0.0.1:{server.server_address[1]}/")
        wait = WebDriverWait(browser, 30, poll_frequency=0.5, ignored_exceptions=_stale())
        wait.until(lambda b: b.execute_script("return document.body.dataset.ready") == "true")
        page = _read(
            browser,
            marks="#ndcg-legend .regression",
            legend="#ndcg-legend",
            early="#ndcg-chart path.series.provisional",
        )
        assert _text(page, "marks") == "⚠ in regression since 2026-01-01 07:00 (event time)"
        legend = _text(page, "legend")
        assert "treatment: raw 0.5200" in legend and "provisional 0.4100 ± 0.0300" in legend
        assert {p["data-variant"] for p in page["early"]} == {"control", "treatment"}
    finally:
        browser.quit()
        server.shutdown()
