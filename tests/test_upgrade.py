"""An upgrade over the previous release's state, end to end.

The previous release (before named columns and MAP@K) runs as a process from
its own source tree (its package, archived from git in tests/fixtures), on the
real broker and Redis: it checkpoints window blocks, A/B statistics and open
requests. Then this version starts on the same prefix and topics and consumes
the rest. Every stored column must equal replay of all the events, and MAP@K,
which the previous release did not compute, the replay mean over exactly the
requests this version finalised (those open at the handover and those that
came after).
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

from evaluator.app.replay import load_events
from evaluator.config import ConfigError, load_settings
from evaluator.core.ab.interleaving import is_pair, pair_key
from evaluator.core.batch import attribute, dedupe_impressions, score, variant_codes
from evaluator.core.metrics.registry import METRICS
from evaluator.core.rows import fresh_columns
from evaluator.core.windows import contribution_rows
from evaluator.engine.restore import restore_state
from tests.eventgen import EventSet, generate
from tests.live import new_env, stop, stream, to_payloads, wait_until
from tests.test_clock_skew import forget

pytestmark = [pytest.mark.services, pytest.mark.usefixtures("kafka_client")]
"""This version runs once per Kafka client (the previous release: kafka-python)."""

PREVIOUS_RELEASE = "e20c67add48f3db75914c934b4abb3726f3169e7"
"""The last commit before named columns (2026-12-04): its layout had no MAP@K."""
ARCHIVE = Path(__file__).parent / "fixtures" / f"release-{PREVIOUS_RELEASE[:7]}.tar.gz"
PREVIOUS_METRICS = ("ndcg", "ndcg_adjusted", "mrr", "hit_rate", "precision", "recall")


def previous_release(directory: Path) -> Path:
    """The previous release's package, extracted into ``directory`` from its archive
    (made with ``git archive --format=tar.gz -9 -o tests/fixtures/release-e20c67a.tar.gz
    e20c67a evaluator``: a shallow clone has no such commit)."""
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(directory, filter="data")
    return directory


def consumed(env, store) -> dict[str, int]:
    """Offsets checkpointed per input, summed over partitions (read without claiming)."""
    totals: dict[str, int] = {}
    for p in range(env.partitions):
        for field, value in store.client.hgetall(store.tag(p) + "pm").items():
            name = field.decode()
            if name.startswith("o:"):
                totals[name[2:]] = totals.get(name[2:], 0) + int(value)
    return totals


def split(events: EventSet, at_ms: int) -> tuple[EventSet, EventSet]:
    before, after = EventSet(), EventSet()
    for kind in ("impressions", "interactions"):
        for e in getattr(events, kind):
            getattr(before if e["timestamp"] < at_ms else after, kind).append(e)
    return before, after


def produce(env, events: EventSet, seed: int) -> dict[str, int]:
    ordered = stream(
        [("impressions", e) for e in events.impressions]
        + [("interactions", e) for e in events.interactions],
        seed,
    )
    sent = {}
    for kind in ("impressions", "interactions"):
        payloads = to_payloads(ordered, kind)
        env.produce(kind, payloads)
        sent[kind] = len(payloads)
    return sent


def expected_rows(events: EventSet, settings, schema, newer: set[str], directory: Path):
    """Replay's statistics rows per request, in the grown layout: the columns this
    version added hold only the requests in ``newer``. Returns (variant names, variant
    code, cohort index, rows)."""
    imp, inter = events.write(directory)
    imps, ints, _ = load_events(imp, inter, settings, progress=False)
    requests = dedupe_impressions(imps)
    variants = variant_codes(requests)
    attribution = attribute(requests, ints, settings.join.rules())
    scored = score(
        requests,
        attribution,
        settings.scoring(None),
        settings.cold_start.min_relevant_history,
        variants=variants,
    )
    n, ks = len(requests.events), scored.scores.ks
    rows = contribution_rows(scored.scores, np.full((n, len(ks)), np.nan), np.full(n, np.nan))
    rows = schema.assemble(fresh_columns(ks, METRICS), rows)
    old = set(fresh_columns(ks, PREVIOUS_METRICS))
    added = [i for i, name in enumerate(schema.names) if name not in old]
    later = np.array([e.request_id in newer for e in requests.events])
    rows[np.ix_(~later, np.asarray(added))] = 0.0
    return scored.variant_names, scored.variant, scored.cohort - 1, rows


def previous_then_this(env, first: EventSet, second: EventSet, tmp_path: Path) -> set[str]:
    """Batch 1 through the previous release (no idle finalisation, so requests stay
    open), a clean stop, then this version on the same prefix with batch 2, until every
    request is finalised. Returns the requests open at the handover."""
    old_tree = previous_release(tmp_path / "previous")
    store = env.store()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        sent = produce(env, first, seed=31)
        idle = {"EVALUATOR_EVENT_TIME__IDLE_TIMEOUT": "1h"}
        procs.append(env.start(tmp_path / "old.log", tree=old_tree, overrides=idle))
        wait_until(  # the watermark passed some deadlines: blocks were written
            lambda: consumed(env, store) == sent and store.counters().get("finalised", 0) > 0,
            120,
            "the previous release consumed batch 1 and finalised requests",
            procs,
        )
        stop(procs)
        assert procs[0].returncode == 0, (tmp_path / "old.log").read_text()[-2000:]
        stored = json.loads(store.client.get(store._meta + "layout"))
        assert stored["metrics"] == list(PREVIOUS_METRICS)  # the earlier format, no MAP
        open_ids: set[str] = set()
        deadline = env.settings().finalise_config().deadline
        for p in range(env.partitions):  # a claim, as the next owner makes one
            state = restore_state(store.claim(p).fields, deadline, 10**6)
            open_ids |= set(state.requests)
        assert open_ids, "the handover must leave open requests"
        procs = [env.start(tmp_path / "new.log")]
        produce(env, second, seed=32)
        want = len({e["request_id"] for e in [*first.impressions, *second.impressions]})
        wait_until(
            lambda: store.counters().get("finalised", 0) >= want,
            180,
            "every request finalised",
            procs,
        )
    finally:
        stop(procs)
    assert store.counters()["finalised"] == want  # nothing lost, nothing twice
    store.close()
    return open_ids


def compare_grown(store, events: EventSet, newer: set[str], settings, tmp_path: Path) -> None:
    """The window's and the default experiment's sums equal replay's rows, per variant
    and cohort, in every count and metric column of the grown layout."""
    schema = store.layout.schema
    names, code, cohort, rows = expected_rows(events, settings, schema, newer, tmp_path)
    assert rows[:, schema.value("map", 10)].sum() > 0
    compared = [
        i
        for i, n in enumerate(schema.names)
        if n.split(":")[0] in {"count", "engaged", "sum", "sq"}
        or n.startswith(("count#", "engaged#"))
    ]
    window: dict[str, np.ndarray] = {}
    for (_, variant), block in store.blocks(max(settings.layout().windows_ms)).items():
        window[variant] = window.get(variant, 0) + block.sum(axis=1)
    blocks = store.experiment_blocks("default")
    # interleaved lists (which the previous release ignored) add a ranker pair's block
    assert [k for k in blocks if is_pair(k)] == [pair_key("ranker-x", "ranker-y")]
    cumulative = {v: b.sum(axis=1) for v, b in blocks.items() if not is_pair(v)}
    for what, totals in (("window", window), ("experiment", cumulative)):
        assert set(totals) == set(names), what
        for v, variant in enumerate(names):
            for c in (0, 1):
                mine = rows[(code == v) & (cohort == c)]
                np.testing.assert_allclose(
                    totals[variant][c, compared],
                    mine[:, compared].sum(axis=0),
                    rtol=1e-9,
                    atol=1e-9,
                    err_msg=f"{what} {variant} cohort {c}",
                )


def test_upgrade_from_the_previous_release_on_the_same_prefix(
    kafka_bootstrap, redis_url, tmp_path
) -> None:
    env = new_env(kafka_bootstrap, redis_url)
    settings = env.settings()
    events = generate(31, requests=400, users=25, catalog=3_000)
    t0 = min(e["timestamp"] for e in events.impressions)
    first, second = split(events, t0 + 2 * 3_600_000)
    open_ids = previous_then_this(env, first, second, tmp_path)
    store = env.store()
    store.check_layout()
    assert "count#1" in store.layout.column_names and store.layout.schema.has("map", 10)
    # MAP@K holds exactly the requests this version finalised: open at the handover or later
    newer = open_ids | {e["request_id"] for e in second.impressions}
    compare_grown(store, events, newer, settings, tmp_path)
    users = {e["user_id"] for e in events.impressions}
    assert sum(store.exposures("default").values()) == len(users)
    # what cannot be converted is refused in one line naming the setting and the choices
    other = load_settings(environ={**env.environ, "EVALUATOR_WINDOWS__USER_BUCKETS": "256"})
    refused = store.__class__(store.client, other.layout(env.partitions), prefix=env.name)
    with pytest.raises(ConfigError) as caught:
        refused.check_layout()
    message = str(caught.value)
    assert "\n" not in message and "windows.user_buckets was 128" in message
    assert "redis.key_prefix" in message
    forget(env)
    store.close()
