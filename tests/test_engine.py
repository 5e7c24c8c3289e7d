"""The partition engine against replay, and its changelog against its own state."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import pytest

from evaluator.app.replay import evaluate_files
from evaluator.config import load_settings
from evaluator.core.decode import decode_impressions, decode_interactions
from evaluator.core.due import PendingInteraction
from evaluator.core.finalise import Finalised
from evaluator.engine import columns
from evaluator.engine.markers import NONE_MS, Markers
from evaluator.engine.markers import decode_segment as decode_marker_segment
from evaluator.engine.partition import PartitionEngine
from evaluator.engine.plan import EngineConfig
from evaluator.engine.restore import restore_state
from evaluator.engine.segments import decode_segment
from evaluator.engine.state import PartitionState
from tests.eventgen import EventSet, generate
from tests.livecheck import compare_totals

NOW_MS = 1_800_000_000_000
"""A wall clock far past every generated event: an idle partition finalises all."""


def engine_config(settings: Any) -> EngineConfig:
    return EngineConfig(
        settings.finalise_config(),
        max_out_of_orderness_ms=settings.event_time.ms("max_out_of_orderness"),
        idle_timeout_ms=settings.event_time.ms("idle_timeout"),
        history_cap=settings.cold_start.min_relevant_history,
        attribute=settings.metrics.diversity_attribute,
    )


def ordered(
    events: EventSet, seed: int, ahead: tuple[str, int] = ("", 0)
) -> list[tuple[str, dict[str, Any]]]:
    """Event-time order with jitter; ``ahead``: one topic consumed that much event time
    ahead of the other (a backlog whose topics are fetched at different rates)."""
    rng = random.Random(seed)
    stream = [("impressions", e) for e in events.impressions] + [
        ("interactions", e) for e in events.interactions
    ]
    kind_ahead, lead_ms = ahead
    stream.sort(
        key=lambda ke: (
            ke[1]["timestamp"] + rng.randrange(0, 3_000) - (lead_ms if ke[0] == kind_ahead else 0)
        )
    )
    return stream


def step(engine: PartitionEngine, chunk: list[tuple[str, dict[str, Any]]], settings: Any) -> None:
    imps, _ = decode_impressions([json.dumps(e).encode() for k, e in chunk if k == "impressions"])
    ints, _ = decode_interactions(
        [json.dumps(e).encode() for k, e in chunk if k == "interactions"],
        settings.relevance.active(),
    )
    engine.ingest(imps, ints)
    for name, times in (("impressions", imps.timestamp_ms), ("interactions", ints.timestamp_ms)):
        engine.observe(name, max(times) if times else None, caught_up=False, now_ms=0)
    engine.advance(0)


def run_engine(
    events: EventSet,
    settings: Any,
    seed: int,
    *,
    batch: int = 50,
    restore_every: int = 0,
    take_every: int = 1,
    now_ms: int = NOW_MS,
    changelog: dict[str, bytes] | None = None,
    config: EngineConfig | None = None,
    owners: Sequence[EngineConfig] = (),
    ahead: tuple[str, int] = ("", 0),
) -> tuple[PartitionEngine, list[Finalised]]:
    """Feed a stream in batches; the changelog is taken every ``take_every`` batches (a
    checkpoint), and with ``restore_every`` the engine is rebuilt from the accumulated
    changelog at every that many checkpoints (as a new owner would), after checking that
    the rebuilt state equals the engine's own. ``owners``: the new owners' settings in
    turn (an operator changing them between restarts); without, ``config`` throughout."""
    config = config or engine_config(settings)
    engine = PartitionEngine(0, config)
    changelog = {} if changelog is None else changelog
    done: list[Finalised] = []
    stream = ordered(events, seed, ahead)
    checkpoints = 0
    for n, start in enumerate(range(0, len(stream), batch)):
        step(engine, stream[start : start + batch], settings)
        done += engine.finalise_due()
        if n % take_every != take_every - 1:
            continue
        apply_changes(changelog, engine.take()[0])
        checkpoints += 1
        if restore_every and checkpoints % restore_every == 0:
            if owners:
                config = owners[checkpoints // restore_every % len(owners)]
            state = restore_state(changelog.items(), config.finalise.deadline, config.history_cap)
            if not owners:
                assert_same_state(state, engine.state)
            engine = PartitionEngine(0, config, state, engine.watermark_ms, engine.input_times())
    for now in (now_ms, now_ms + config.idle_timeout_ms):
        for name in ("impressions", "interactions"):
            engine.observe(name, None, caught_up=True, now_ms=now)
    engine.advance(now_ms + config.idle_timeout_ms)
    done += engine.finalise_due()
    return engine, done


def apply_changes(changelog: dict[str, bytes], changes: dict[str, bytes | None]) -> None:
    """What a store does with a checkpoint's changelog fields."""
    for key, value in changes.items():
        if value is None:
            assert key in changelog, f"deletion of {key}, which was never written"
            del changelog[key]
        else:
            changelog[key] = value


def live_markers(state: PartitionState) -> tuple[dict[int, int], set[int]]:
    """The markers that count (hash -> deadline) and the applied interactions' hashes."""
    return state.markers.live()


def held(state: PartitionState, rid: str) -> bool:
    """Whether the request's marker is in memory (expired or not)."""
    markers = state.markers
    return bool(markers.final.find(markers.keys([rid]))[0] != NONE_MS)


def assert_same_state(restored: PartitionState, live: PartitionState) -> None:
    """Everything the join reads, rebuilt from the changelog, equals the live state."""
    assert restored.exposed.live() == live.exposed.live()
    for name in ("requests", "named_rid", "loose_user"):
        assert getattr(restored, name) == getattr(live, name), name
    assert {rid: sorted(its) for rid, its in restored.named.items()} == {
        rid: sorted(its) for rid, its in live.named.items()
    }
    assert live_markers(restored) == live_markers(live)
    assert restored.users.keys() == live.users.keys()
    for uid, user in live.users.items():
        assert restored.users[uid] == user, uid


def totals_of(done: list[Finalised]) -> dict[str, np.ndarray]:
    totals: dict[str, np.ndarray] = {}
    for fin in done:
        for request, row, cohort in zip(fin.requests, fin.rows, fin.cohort.tolist(), strict=True):
            block = totals.setdefault(request.variant, np.zeros((2, row.size)))
            block[cohort] += row
    return totals


@pytest.mark.parametrize(("restore_every", "take_every"), [(0, 1), (3, 1), (1, 4), (2, 7)])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_engine_equals_replay(seed: int, restore_every: int, take_every: int, tmp_path) -> None:
    """Checkpoints after every batch or every few (a request opened and finalised
    between two of them never reaches the changelog); restored at checkpoints."""
    settings = load_settings(environ={})
    events = generate(seed, requests=400, users=30)
    changelog: dict[str, bytes] = {}
    engine, done = run_engine(
        events,
        settings,
        seed,
        restore_every=restore_every,
        take_every=take_every,
        changelog=changelog,
    )
    report = evaluate_files(*events.write(tmp_path), settings, progress=False)
    compare_totals(totals_of(done), report, settings)
    assert engine.open_requests() == 0
    apply_changes(changelog, engine.take()[0])
    # every request segment went once all its requests were final
    assert [key for key in changelog if key[0] in "rst"] == []


def reuse_event_ids(events: EventSet, seed: int) -> None:
    """Give some request-less interactions' event ids to another user's interactions too
    (request-less, or naming that user's request): a producer reusing ids. Both users'
    events land in one partition here, where the first is the one applied."""
    rng = random.Random(seed)
    loose = [it for it in events.interactions if "request_id" not in it]
    users = sorted({e["user_id"] for e in events.impressions})
    by_user: dict[str, list[dict[str, Any]]] = {}
    for imp in events.impressions:
        by_user.setdefault(imp["user_id"], []).append(imp)
    for it in rng.sample(loose, len(loose) // 3):
        other = rng.choice([u for u in users if u != it["user_id"]])
        imp = rng.choice(by_user[other])
        ts = imp["timestamp"] + rng.randrange(-2_000, 600_000)
        if abs(ts - it["timestamp"]) < 3_500:  # the pair's order must not hang on jitter
            ts = it["timestamp"] + 3_500
        copy = {**it, "user_id": other, "item_id": rng.choice(imp["items"]), "timestamp": ts}
        if rng.random() < 0.3:
            copy["request_id"] = imp["request_id"]
        events.interactions.insert(rng.randrange(len(events.interactions) + 1), copy)


@pytest.mark.parametrize("restore_every", [0, 1, 3])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_event_id_reused_by_another_user_is_a_duplicate_live_restored_and_in_replay(
    seed: int, restore_every: int, tmp_path
) -> None:
    """Replay applies an event id once, whoever's; so does a partition, live and as
    restored from its changelog (before: each user applied it, and the two users shared
    one changelog field, so a restored state lost the second's)."""
    settings = load_settings(environ={})
    events = generate(seed, requests=300, users=12)
    reuse_event_ids(events, seed)
    # the first of two events with one id is applied: replay's file holds each pair in
    # the order the engine reads them, as a dump of the topic would (their times are
    # further apart than the order's jitter)
    events.interactions.sort(key=lambda e: e["timestamp"])
    engine, done = run_engine(events, settings, seed, restore_every=restore_every)
    report = evaluate_files(*events.write(tmp_path), settings, progress=False)
    compare_totals(totals_of(done), report, settings)
    assert engine.open_requests() == 0


@pytest.mark.parametrize("seed", [1, 2])
def test_a_rebuilt_codebook_rewrites_the_changelog_whole(
    seed: int, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a codebook bound far below the catalog, the codebook is rebuilt all along
    the stream (every code changes): the changelog's segments and codebook are
    rewritten in the same checkpoint, so every restored state equals the engine's own,
    and the engine still equals replay."""
    monkeypatch.setattr(columns, "RECODE_AT", 8)
    rebuilt = []
    recode = columns.OpenTable._recode

    def counted(table: columns.OpenTable) -> None:
        recode(table)
        rebuilt.append(table.recoded)

    monkeypatch.setattr(columns.OpenTable, "_recode", counted)
    settings = load_settings(environ={})
    events = generate(seed, requests=400, users=30)
    for event in events.impressions + events.interactions:  # a catalog that churns
        era = f"@{event['timestamp'] // 600_000}"
        if "items" in event:
            event["items"] = [item + era for item in event["items"]]
        else:
            event["item_id"] += era
    changelog: dict[str, bytes] = {}
    engine, done = run_engine(events, settings, seed, restore_every=1, changelog=changelog)
    assert sum(rebuilt) >= 2
    report = evaluate_files(*events.write(tmp_path), settings, progress=False)
    compare_totals(totals_of(done), report, settings)
    apply_changes(changelog, engine.take()[0])
    assert [key for key in changelog if key[0] in "rst"] == []


@pytest.mark.parametrize("restore_every", [1, 3])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_markers_expire_alike_in_memory_and_restored(seed: int, restore_every: int) -> None:
    """With a finalised_ttl far shorter than the stream, markers expire all along it:
    at every checkpoint the state rebuilt from the changelog (marker segments, marker
    fields, the expiry bound) equals the engine's own, and a marker segment is deleted
    once every marker in it has expired."""
    settings = load_settings(environ={})
    config = dataclasses.replace(engine_config(settings), finalised_ttl_ms=30 * 60_000)
    events = generate(seed, requests=400, users=30)
    changelog: dict[str, bytes] = {}
    engine, _ = run_engine(
        events, settings, seed, restore_every=restore_every, changelog=changelog, config=config
    )
    apply_changes(changelog, engine.take()[0])
    before = msgspec.msgpack.decode(changelog["m:"])
    segments = [
        decode_marker_segment(msgspec.msgpack.decode(v))
        for k, v in changelog.items()
        if k[0] == "g"
    ]
    assert segments, "no marker segment left: the stream must end inside the TTL"
    for _, deadlines, _, applied in segments:  # the expired went; these hold live markers
        assert max(deadlines.max(initial=0), applied.max(initial=0)) >= before
    state = engine.state
    assert live_markers(state)[0]
    # an expired marker lingers in memory only in a run that still holds live ones
    for runs in (state.markers.final, state.markers.applied):
        assert all(run.last >= before for run in runs.runs)
    assert {name for _, name in state.markers.segments} == {k for k in changelog if k[0] == "g"}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_changing_the_deadline_settings_between_owners_loses_and_doubles_no_request(
    seed: int,
) -> None:
    """New owners with a shorter, then a longer, allowed lateness and attribution window
    than the state was written with: every request is still finalised exactly once
    (a new owner judges which stored requests are final under the settings the
    finalisation ran with, ``d:``)."""
    settings = load_settings(environ={})
    base = engine_config(settings)
    owners = [
        dataclasses.replace(
            base,
            finalise=dataclasses.replace(
                base.finalise,
                allowed_lateness_ms=lateness,
                rules=dataclasses.replace(base.finalise.rules, attribution_window_ms=window),
            ),
        )
        for lateness, window in ((0, 60_000), (5 * 60_000, 45 * 60_000), (60_000, 60_000))
    ]
    events = generate(seed, requests=400, users=30)
    _, done = run_engine(events, settings, seed, restore_every=1, owners=owners)
    finalised = [r.request_id for d in done for r in d.requests]
    assert sorted(finalised) == sorted({e["request_id"] for e in events.impressions})


def test_a_request_opened_before_a_new_owner_finalises_survives_the_next_owner() -> None:
    """A new owner with a longer allowed lateness opens a request that the stored
    finalisation (``w:``, under the old settings ``d:``) would judge final, and is
    replaced before it finalises anything: the request is stored so that the next
    owner still opens it."""
    settings = load_settings(environ={})
    old = engine_config(settings)
    new = dataclasses.replace(
        old, finalise=dataclasses.replace(old.finalise, allowed_lateness_ms=10 * 60_000)
    )
    t, changelog = 1_000_000_000_000, {}

    def imp(rid: str, ts: int) -> tuple[str, dict[str, Any]]:
        event = {"event_id": "e" + rid, "request_id": rid, "user_id": "u", "variant": "a"}
        return "impressions", {**event, "timestamp": ts, "items": ["x"]}

    def owner(config: EngineConfig, engine: PartitionEngine | None) -> PartitionEngine:
        if engine is None:
            return PartitionEngine(0, config)
        state = restore_state(changelog.items(), config.finalise.deadline, config.history_cap)
        return PartitionEngine(0, config, state, engine.watermark_ms, engine.input_times())

    engine = owner(old, None)
    engine.inputs["interactions"].max_event_ms = t + 10**9  # only impressions hold it
    step(engine, [imp("A", t), imp("Z", t + 40 * 60_000)], settings)
    assert [r.request_id for d in engine.finalise_due() for r in d.requests] == ["A"]
    apply_changes(changelog, engine.take()[0])
    late = t + 40 * 60_000 - old.finalise.deadline(0) - 60_000  # final under old, open under new
    assert old.finalise.deadline(late) <= engine.state.finalised_ms < new.finalise.deadline(late)
    engine = owner(new, engine)
    step(engine, [imp("R", late)], settings)  # the watermark stays: nothing is finalised
    assert engine.finalise_due() == []
    apply_changes(changelog, engine.take()[0])
    engine = owner(new, engine)
    assert sorted(engine.state.requests) == ["R", "Z"]


def test_an_expired_marker_still_in_memory_counts_for_nothing() -> None:
    """Markers leave memory with their segment, so one may stay there after it expired
    (its segment still holds a marker that counts). It must count for nothing, as in a
    state rebuilt from the changelog: a redelivered impression of its request opens the
    request again, and an interaction naming it waits for it."""
    settings = load_settings(environ={})
    ttl = 30 * 60_000
    config = dataclasses.replace(engine_config(settings), finalised_ttl_ms=ttl)
    t0, gap = 1_000_000_000, 20 * 60_000

    def imp(rid: str, ts: int) -> tuple[str, dict[str, Any]]:
        event = {"event_id": "i" + rid, "request_id": rid, "user_id": "u", "variant": "a"}
        return "impressions", {**event, "timestamp": ts, "items": ["x", "y"]}

    def click(eid: str, rid: str, ts: int) -> tuple[str, dict[str, Any]]:
        event = {"event_id": eid, "request_id": rid, "user_id": "u", "item_id": "x"}
        return "interactions", {**event, "type": "click", "timestamp": ts}

    for restored in (False, True):
        engine = PartitionEngine(0, config)
        changelog: dict[str, bytes] = {}
        step(engine, [imp("q1", t0), imp("q2", t0 + gap)], settings)
        engine.watermark_ms = config.finalise.deadline(t0 + gap)  # both final: one segment
        engine.finalise_due()
        apply_changes(changelog, engine.take()[0])
        assert [key for key in changelog if key[0] == "g"] == ["g:0"]
        # data time moves past q1's marker TTL, not past q2's
        step(engine, [imp("q3", config.finalise.deadline(t0) + ttl + 1)], settings)
        engine.finalise_due()
        apply_changes(changelog, engine.take()[0])
        assert engine.state.markers.before_ms == config.finalise.deadline(t0) + 1
        assert "g:0" in changelog
        if restored:
            state = restore_state(changelog.items(), config.finalise.deadline, config.history_cap)
            assert not held(state, "q1")
            engine = PartitionEngine(0, config, state, engine.watermark_ms, engine.input_times())
        else:
            assert held(engine.state, "q1")  # expired, still in memory
        step(
            engine,
            [imp("q1", t0), click("c1", "q1", t0 + 1), click("c2", "q2", t0 + gap)],
            settings,
        )
        counts = engine.take()[1]
        assert (counts.duplicates, counts.late) == (0, 1), restored  # c2: q2's marker counts
        assert "q1" in engine.state.requests and engine.state.named_rid.get("c1") == "q1"


def test_a_request_finalised_and_opened_again_between_checkpoints_is_written_once() -> None:
    """A request finalised and, once its marker expired, opened again by a redelivery
    before the next checkpoint: the checkpoint writes its open row once (the latest),
    so the state rebuilt from the changelog equals the engine's own."""
    settings = load_settings(environ={})
    ttl = 30 * 60_000
    config = dataclasses.replace(engine_config(settings), finalised_ttl_ms=ttl)
    t0 = 1_000_000_000

    def imp(rid: str, ts: int) -> tuple[str, dict[str, Any]]:
        event = {"event_id": f"i{rid}{ts}", "request_id": rid, "user_id": "u", "variant": "a"}
        return "impressions", {**event, "timestamp": ts, "items": ["x", "y"]}

    engine = PartitionEngine(0, config)
    changelog: dict[str, bytes] = {}
    apply_changes(changelog, engine.take()[0])
    step(engine, [imp("q1", t0), imp("q2", t0 + 1)], settings)
    engine.watermark_ms = config.finalise.deadline(t0)  # q1 final, q2 still open
    assert [r.request_id for d in engine.finalise_due() for r in d.requests] == ["q1"]
    later = config.finalise.deadline(t0) + ttl + 1  # q1's marker expires by data time
    step(engine, [imp("q3", later)], settings)
    engine.finalise_due()
    step(engine, [imp("q1", later + 1)], settings)  # redelivered: opened again
    assert sorted(engine.state.requests) == ["q1", "q2", "q3"]
    apply_changes(changelog, engine.take()[0])
    state = restore_state(changelog.items(), config.finalise.deadline, config.history_cap)
    assert_same_state(state, engine.state)
    assert state.requests["q1"].timestamp_ms == later + 1


def test_a_late_interaction_is_counted_once_and_its_hash_goes_with_its_marker() -> None:
    """An interaction naming a finalised request is late once: redelivered (in the same
    batch, a later one, or to a new owner) it is a duplicate. Its hash is written in
    the next segment, which is deleted once its marker has expired."""
    settings = load_settings(environ={})
    ttl = 30 * 60_000
    config = dataclasses.replace(engine_config(settings), finalised_ttl_ms=ttl)
    t0, gap = 1_000_000_000, 20 * 60_000
    event = {"user_id": "u", "variant": "a", "items": ["x", "y"]}
    first = [
        ("impressions", {**event, "event_id": "i1", "request_id": "q1", "timestamp": t0}),
        ("impressions", {**event, "event_id": "i2", "request_id": "q2", "timestamp": t0 + gap}),
    ]
    late = (
        "interactions",
        {
            "event_id": "c1",
            "request_id": "q1",
            "user_id": "u",
            "item_id": "x",
            "type": "click",
            "timestamp": t0 + 1,
        },
    )
    for restored in (False, True):
        engine = PartitionEngine(0, config)
        changelog: dict[str, bytes] = {}
        step(engine, first, settings)
        engine.watermark_ms = config.finalise.deadline(t0 + gap)
        engine.finalise_due()
        apply_changes(changelog, engine.take()[0])
        assert sorted(k for k in changelog if k[0] in "gk") == ["g:0", "k:"]
        step(engine, [late, late], settings)
        changes, counts = engine.take()
        assert (counts.late, counts.duplicates) == (1, 1)
        assert "g:1" in changes  # the late interaction's hash
        apply_changes(changelog, changes)
        if restored:
            state = restore_state(changelog.items(), config.finalise.deadline, config.history_cap)
            assert_same_state(state, engine.state)
            engine = PartitionEngine(0, config, state, engine.watermark_ms, engine.input_times())
        step(engine, [late], settings)
        counts = engine.take()[1]
        assert (counts.late, counts.duplicates) == (0, 1), restored
        # q1's marker expires (the late hash with it), then q2's, as both topics move on
        for ts in (config.finalise.deadline(t0) + ttl + 1, t0 + 10 * ttl):
            imp = {**event, "event_id": f"i{ts}", "request_id": f"q{ts}", "timestamp": ts}
            click = {**late[1], "event_id": f"c{ts}", "request_id": f"q{ts}", "timestamp": ts}
            step(engine, [("impressions", imp), ("interactions", click)], settings)
            engine.finalise_due()
            apply_changes(changelog, engine.take()[0])
        assert engine.state.markers.finalised(["q1", "q2"]) == [False, False]
        assert not engine.state.markers.applied.runs
        assert not {"g:0", "g:1"} & changelog.keys(), restored


def test_markers_of_the_previous_format_are_read_and_go_once_expired() -> None:
    """Versions before hashed markers wrote rows of ids (``g:``) and ``f:<request>``
    overrides, without a seed: a new owner reads them (a redelivery of what they
    hold is a duplicate, an interaction they do not hold is late), deletes an
    ``f:`` field loaded expired at once, and the others as they expire."""
    settings = load_settings(environ={})
    config = engine_config(settings)
    encode = msgspec.msgpack.encode
    t0 = 1_000_000_000
    old = {
        "m:": encode(t0),
        "g:3": encode([["q1", t0 + 10, ["c1"]], ["q2", t0 + 20, []], ["q0", t0 - 5, []]]),
        "f:q2": encode([t0 + 20, ["c2"]]),
        "f:q0": encode([t0 - 5, ["c0"]]),
    }
    state = restore_state(old.items(), config.finalise.deadline, config.history_cap)
    assert state.changes == {"f:q0": None}
    assert state.markers.finalised(["q1", "q2", "q0", "q3"]) == [True, True, False, False]
    engine = PartitionEngine(0, config, state, t0, {"impressions": t0, "interactions": t0})
    engine.take()

    def click(eid: str, rid: str) -> tuple[str, dict[str, Any]]:
        event = {"event_id": eid, "request_id": rid, "user_id": "u", "item_id": "x"}
        return "interactions", {**event, "type": "click", "timestamp": t0}

    imp = {"event_id": "i1", "request_id": "q1", "user_id": "u", "variant": "a"}
    step(engine, [click("c1", "q1"), click("c2", "q2"), click("c9", "q2")], settings)
    step(engine, [("impressions", {**imp, "timestamp": t0, "items": ["x"]})], settings)
    changes, counts = engine.take()
    assert (counts.late, counts.duplicates) == (1, 3)  # c9 late; c1, c2, q1 duplicates
    assert {"k:", "g:4"} <= changes.keys()  # the seed with the first hashes written
    step(engine, [click("c8", "q1"), click("c9", "q2")], settings)
    changes, counts = engine.take()
    assert (counts.late, counts.duplicates, "k:" in changes) == (1, 1, False)
    assert "g:5" in changes
    engine.state.markers.expire(t0 + 15)
    assert engine.state.changes.keys() >= {"m:"} and "g:3" not in engine.state.changes
    engine.state.markers.expire(t0 + 21)
    assert {"g:3", "f:q2"} <= engine.state.changes.keys()


def test_loose_interaction_fields_of_the_previous_format_are_hashed_and_go_once_expired() -> None:
    """Versions before 2026-12-07 wrote one ``x:<event>`` field (its time) per loose
    interaction taken, expired or late: a new owner hashes them (a redelivery is a
    duplicate), deletes one loaded expired at once and the others as they expire,
    and marks new ones as hashes in a ``g:`` segment, not fields."""
    settings = load_settings(environ={})
    config = engine_config(settings)
    encode = msgspec.msgpack.encode
    t0 = 1_000_000_000
    bound = t0 - 2 * config.horizon_ms  # markers expire 6 h of data time after
    old = {"m:": encode(bound), "x:L1": encode(bound + 10), "x:L0": encode(bound - 5)}
    state = restore_state(old.items(), config.finalise.deadline, config.history_cap)
    assert state.changes == {"x:L0": None}
    assert state.were_seen(["L1", "L0", "L9"]) == [True, False, False]
    engine = PartitionEngine(0, config, state, t0, {"impressions": t0, "interactions": t0})
    engine.take()

    def click(eid: str, ts: int) -> tuple[str, dict[str, Any]]:
        event = {"event_id": eid, "user_id": "u", "item_id": "x", "type": "click"}
        return "interactions", {**event, "timestamp": ts}

    late = t0 - config.horizon_ms - 1  # before the join horizon, after the marker bound
    step(engine, [click("L1", bound + 10), click("L2", late), click("L2", late)], settings)
    changes, counts = engine.take()
    assert (counts.late, counts.duplicates) == (1, 2)  # L2 late; L1 and L2 again duplicates
    assert {"k:", "g:0"} <= changes.keys() and not [n for n in changes if n[:2] == "x:"]
    assert engine.state.markers.seen_keys(["L2"])[0] in engine.state.markers.live()[1]
    step(engine, [click("L2", late)], settings)
    assert engine.take()[1].duplicates == 1
    engine.state.markers.expire(bound + 10)
    assert "x:L1" not in engine.state.changes
    engine.state.markers.expire(bound + 11)
    assert engine.state.changes.get("x:L1", b"") is None


def test_applied_interactions_hashed_as_the_previous_version_did_stay_duplicates() -> None:
    """Versions before 2026-12-08 marked an applied interaction as the hash of
    (request, event, deadline): a new owner still finds its redelivery a duplicate,
    not late; new ones are marked by event id, so its id reused by another event
    (another request's, or request-less) is a duplicate too, as in replay."""
    settings = load_settings(environ={})
    config = engine_config(settings)
    t0 = 1_000_000_000
    deadline = config.finalise.deadline(t0)
    old_log: dict[str, bytes | None] = {}

    class Log:
        def set(self, name: str, value: bytes | None) -> None:
            old_log[name] = value

    before = Markers(Log())  # what the previous version wrote for q1 and its click c1
    before.add(["q1"], [deadline])
    before.add_applied(before.pair_keys(["q1"], ["c1"], [deadline]), np.array([deadline]))
    before.write(old_log, rows=100)
    old = {"m:": msgspec.msgpack.encode(t0 - 1), **old_log}
    state = restore_state(
        [(k, v) for k, v in old.items() if v is not None],
        config.finalise.deadline,
        config.history_cap,
    )
    engine = PartitionEngine(0, config, state, deadline, {"impressions": t0, "interactions": t0})
    engine.take()

    def click(eid: str, rid: str | None, user: str = "u") -> tuple[str, dict[str, Any]]:
        event = {"event_id": eid, "user_id": user, "item_id": "x", "type": "click"}
        named = {"request_id": rid} if rid else {}
        return "interactions", {**event, "timestamp": t0 + 5, **named}

    # c1 a duplicate (the old hash), then its id request-less: a duplicate too; c2 late
    step(engine, [click("c1", "q1"), click("c1", None), click("c2", "q1")], settings)
    counts = engine.take()[1]
    assert (counts.late, counts.duplicates) == (1, 2)
    assert "c1" not in engine.state.loose_user
    # a duplicate is no relevant interaction of the cold-start history; a late one is
    assert [eid for _, eid in engine.state.users["u"].history] == ["c2"]
    step(engine, [click("c2", "q1"), click("c2", None), click("c1", "q1")], settings)
    counts = engine.take()[1]
    assert (counts.late, counts.duplicates) == (0, 3)
    assert engine.state.markers.seen_keys(["c2"])[0] in engine.state.markers.live()[1]
    # late, then its id reused by another user's request-less click in the same batch
    step(engine, [click("c3", "q1"), click("c3", None, user="v")], settings)
    counts = engine.take()[1]
    assert (counts.late, counts.duplicates) == (1, 1)
    assert "c3" not in engine.state.loose_user


def test_a_loose_interaction_older_than_the_marker_ttl_is_late_and_writes_no_marker() -> None:
    """A request-less interaction whose time is already before the markers' expiry
    bound is counted late and leaves no hash (it would count for nothing): a later
    redelivery is late again, as any event redelivered after ``finalised_ttl``."""
    settings = load_settings(environ={})
    config = engine_config(settings)
    t0 = 1_000_000_000
    old = {"m:": msgspec.msgpack.encode(t0)}
    state = restore_state(old.items(), config.finalise.deadline, config.history_cap)
    engine = PartitionEngine(0, config, state, t0, {"impressions": t0, "interactions": t0})
    engine.take()
    event = {"event_id": "L", "user_id": "u", "item_id": "x", "type": "click"}
    click = ("interactions", {**event, "timestamp": t0 - config.horizon_ms - 1})  # late
    step(engine, [click, click], settings)
    changes, counts = engine.take()
    assert (counts.late, counts.duplicates) == (1, 1)  # the same batch: a duplicate
    assert not [name for name in changes if name[:2] in ("g:", "x:")]
    step(engine, [click], settings)
    assert engine.take()[1].late == 1


def test_segments_hold_at_most_segment_rows_and_restore_whole() -> None:
    """A checkpoint after many new requests (and finalisations) writes several
    segments of at most ``segment_rows`` rows; the state rebuilt from them is whole."""
    settings = load_settings(environ={})
    config = engine_config(settings)
    engine = PartitionEngine(0, config)
    engine.state.segment_rows = 3
    events = generate(4, requests=40, users=8)
    changelog: dict[str, bytes] = {}
    imps = sorted(events.impressions, key=lambda e: e["timestamp"])
    clicks = [  # one interaction naming each request: rows of interaction segments
        {
            "event_id": f"c{n}",
            "user_id": e["user_id"],
            "request_id": e["request_id"],
            "item_id": e["items"][0],
            "type": "click",
            "timestamp": e["timestamp"] + 1,
        }
        for n, e in enumerate(imps)
    ]
    stream = [("impressions", e) for e in imps] + [("interactions", e) for e in clicks]
    step(engine, stream, settings)
    engine.watermark_ms = config.finalise.deadline(imps[len(imps) // 2]["timestamp"])
    assert 3 < sum(len(d.requests) for d in engine.finalise_due()) < len(imps) - 3
    apply_changes(changelog, engine.take()[0])
    assert not [key for key in changelog if key.startswith("i:")]
    for kind in "tgj":
        sizes = [
            decode_segment(v).size
            if kind == "t"
            else decode_marker_segment(msgspec.msgpack.decode(v))[0].size
            if kind == "g"
            else len(msgspec.msgpack.decode(v))
            for k, v in changelog.items()
            if k[0] == kind
        ]
        assert len(sizes) > 1, kind
        assert max(sizes) <= 3, kind
    state = restore_state(changelog.items(), config.finalise.deadline, config.history_cap)
    assert_same_state(state, engine.state)


@pytest.mark.parametrize("kind", ["impressions", "interactions"])
def test_a_topic_consumed_hours_ahead_of_the_other_changes_nothing(kind: str, tmp_path) -> None:
    """A backlog's two topics are fetched at their own rates, so one can run hours of
    event time ahead of the other. Nothing may expire by the leading topic's time:
    interactions naming requests still to come wait for them (here the lead is four
    times ``finalised_ttl``), and the result is replay's."""
    settings = load_settings(environ={})
    events = generate(5, requests=400, users=30)
    config = dataclasses.replace(engine_config(settings), finalised_ttl_ms=30 * 60_000)
    engine, done = run_engine(
        events, settings, 5, config=config, restore_every=2, ahead=(kind, 2 * 3_600_000)
    )
    report = evaluate_files(*events.write(tmp_path), settings, progress=False)
    compare_totals(totals_of(done), report, settings)
    assert engine.open_requests() == 0


def test_interactions_naming_unknown_requests_expire_alike_when_restored() -> None:
    """An interaction naming a request that never arrives waits one ``finalised_ttl``
    of data time, then its ``i:`` field is deleted, in the engine and in a state rebuilt
    from the changelog. One naming an open request is a row of an interaction segment,
    consumed by the request's finalisation (the segment goes then), and has no expiry
    entry (the expiry heap would otherwise hold every interaction of the TTL)."""
    settings = load_settings(environ={})
    ttl = 30 * 60_000
    config = dataclasses.replace(engine_config(settings), finalised_ttl_ms=ttl)
    t0 = 1_000_000_000
    imp = {"event_id": "i1", "request_id": "q1", "user_id": "u1", "variant": "a"}
    click = {"user_id": "u1", "item_id": "x", "type": "click"}
    first = [
        ("impressions", {**imp, "timestamp": t0, "items": ["x", "y"]}),
        ("interactions", {**click, "event_id": "e1", "request_id": "q1", "timestamp": t0 + 1}),
        ("interactions", {**click, "event_id": "e2", "request_id": "ghost", "timestamp": t0 + 2}),
    ]
    for restored in (False, True):
        engine = PartitionEngine(0, config)
        changelog: dict[str, bytes] = {}
        step(engine, first, settings)
        kept = [key for _, key in engine.state.expiry]
        assert kept == ["e2"]
        apply_changes(changelog, engine.take()[0])
        assert "i:e2" in changelog  # its request is not open: a field of its own
        assert [row[0] for row in msgspec.msgpack.decode(changelog["j:0"])] == ["e1"]
        if restored:
            state = restore_state(changelog.items(), config.finalise.deadline, config.history_cap)
            assert [key for _, key in state.expiry] == ["e2"]
            engine = PartitionEngine(0, config, state, engine.watermark_ms, engine.input_times())
        # data time moves on past the TTL: q1 is final, then the orphan expires
        for ts in (t0 + ttl // 2, t0 + ttl + config.horizon_ms + 10_000):
            later = {**imp, "event_id": f"i{ts}", "request_id": f"q{ts}", "timestamp": ts}
            own = {**click, "event_id": f"e{ts}", "request_id": f"q{ts}", "timestamp": ts}
            step(
                engine,
                [("impressions", {**later, "items": ["z"]}), ("interactions", own)],
                settings,
            )
            engine.finalise_due()
            apply_changes(changelog, engine.take()[0])
        assert "j:0" not in changelog  # q1 is final
        assert "i:e2" not in changelog, restored
        assert not {"e1", "e2"} & engine.state.named_rid.keys()


def test_requests_stored_one_field_each_load_and_go_when_final() -> None:
    """A partition written before request segments holds one ``r:`` field per open
    request: they load as open, and each field is deleted when its request is final."""
    settings = load_settings(environ={})
    config = engine_config(settings)
    later = 10 * 86_400_000
    fields = [
        (f"r:{rid}", msgspec.msgpack.encode((user, "a", ts, ["x", "y"], [], "", [], "", None)))
        for rid, user, ts in (("q1", "u1", 1_000), ("q2", "u2", later))
    ]
    state = restore_state(fields, config.finalise.deadline, config.history_cap)
    assert sorted(state.requests) == ["q1", "q2"]
    engine = PartitionEngine(0, config, state)
    engine.watermark_ms = config.finalise.deadline(1_000)
    done = engine.finalise_due()
    assert [r.request_id for d in done for r in d.requests] == ["q1"]
    changes, _ = engine.take()
    assert changes["r:q1"] is None
    assert "r:q2" not in changes
    assert not [key for key in changes if key.startswith("t:")]  # nothing new opened


def test_interaction_fields_of_open_requests_load_and_go_when_final() -> None:
    """A partition written before interaction segments holds one ``i:`` field per
    waiting interaction, also for open requests: they load as waiting, join their
    request, and each field is deleted when its request is final."""
    settings = load_settings(environ={})
    config = engine_config(settings)
    request = msgspec.msgpack.encode(("u1", "a", 1_000, ["x", "y"], [], "", [], "", None))
    fields = [
        ("r:q1", request),
        ("i:e1", msgspec.msgpack.encode(("q1", "y", 1_500, 1.0))),
    ]
    state = restore_state(fields, config.finalise.deadline, config.history_cap)
    assert state.named == {"q1": [("e1", "y", 1_500, 1.0)]}
    engine = PartitionEngine(0, config, state)
    engine.watermark_ms = config.finalise.deadline(1_000)
    (done,) = engine.finalise_due()
    assert done.rows[0, 1] == 1.0  # engaged: the interaction joined its request
    changes, _ = engine.take()
    assert changes["i:e1"] is None
    assert changes["r:q1"] is None


def test_unwritten_counts_fields_and_segment_rows_until_the_flush() -> None:
    """What the early-checkpoint bound (``MAX_PENDING_FIELDS``) sees: changed fields,
    and the request and interaction rows that the next flush writes as segments."""
    settings = load_settings(environ={})
    engine = PartitionEngine(0, engine_config(settings))
    imp = {"event_id": "i1", "request_id": "q1", "user_id": "u1", "variant": "a"}
    click = {"event_id": "e1", "request_id": "q1", "user_id": "u1", "item_id": "x"}
    stream = [
        ("impressions", {**imp, "timestamp": 1_000, "items": ["x", "y"]}),
        ("interactions", {**click, "type": "click", "timestamp": 1_001}),
    ]
    step(engine, stream, settings)
    state = engine.state
    assert (len(state.fresh), len(state.waiting)) == (1, 1)
    assert state.unwritten() == len(state.changes) + 2
    changes, _ = engine.take()
    assert {"t:0", "c:0", "j:0"} <= changes.keys()
    assert state.unwritten() == 0


def test_engine_counts_duplicates_and_late(tmp_path) -> None:
    settings = load_settings(environ={})
    events = generate(5, requests=200, users=20)
    end = max(e["timestamp"] for e in events.impressions + events.interactions)
    # the partition goes idle 2 h after its last event: every request is final, and
    # the finalised markers (kept 2 days of event time) still know every event
    engine, done = run_engine(events, settings, 5, now_ms=end + 2 * 3_600_000)
    engine.take()
    # redelivering everything after finalisation: nothing is counted twice
    finalised = sum(len(d.requests) for d in done)
    step(engine, ordered(events, 5), settings)
    assert engine.finalise_due() == []
    _, again = engine.take()
    assert again.finalised == 0
    assert again.late == 0
    n_events = len(events.impressions) + len(events.interactions)
    assert again.duplicates == n_events
    assert finalised == len({e["request_id"] for e in events.impressions})


def test_watermark_waits_for_every_busy_input() -> None:
    settings = load_settings(environ={})
    engine = PartitionEngine(0, engine_config(settings))
    engine.observe("impressions", 100_000, caught_up=False, now_ms=0)
    assert engine.advance(0) is None  # interactions have not delivered yet
    engine.observe("interactions", None, caught_up=True, now_ms=0)
    assert engine.advance(1_000) is None  # caught up, but not for idle_timeout yet
    assert engine.advance(30_000) is None  # no confirmation since: maybe an outage
    engine.observe("interactions", None, caught_up=True, now_ms=30_000)
    assert engine.advance(30_000) == 100_000 - 5_000  # idle: impressions alone decide
    engine.observe("interactions", 50_000, caught_up=False, now_ms=31_000)
    assert engine.advance(31_000) == 95_000  # never moves back
    for now in (40_000, 69_000):
        engine.observe("impressions", None, caught_up=True, now_ms=now)
        engine.observe("interactions", None, caught_up=True, now_ms=now)
    assert engine.advance(69_000) == 95_000
    for now in (70_000, 200_000):
        engine.observe("impressions", None, caught_up=True, now_ms=now)
        engine.observe("interactions", None, caught_up=True, now_ms=now)
    # all idle: the partition follows the wall clock (past its largest event time)
    assert engine.advance(200_000) == 195_000


def test_an_input_keeping_up_with_a_live_producer_is_not_idle() -> None:
    """At the end offset after every poll, but delivering: busy, so the watermark
    follows the data, never the wall clock."""
    settings = load_settings(environ={})
    engine = PartitionEngine(0, engine_config(settings))
    for second in range(0, 120):
        now = 5_000_000 + second * 1_000  # the wall clock runs ahead of the data
        t = 1_000_000 + second * 1_000
        engine.observe("impressions", t, caught_up=True, now_ms=now)
        engine.observe("interactions", t, caught_up=True, now_ms=now)
        assert engine.advance(now) == t - 5_000


def test_a_limit_holds_the_watermark_and_never_moves_it_back() -> None:
    settings = load_settings(environ={})
    engine = PartitionEngine(0, engine_config(settings))
    engine.observe("impressions", 100_000, caught_up=False, now_ms=0)
    engine.observe("interactions", 100_000, caught_up=False, now_ms=0)
    assert engine.advance(0, limit_ms=-(2**62)) is None  # unknown: hold
    assert engine.advance(0, limit_ms=50_000) == 50_000
    assert engine.own_ms == 95_000  # what the others wait for is not limited
    assert engine.advance(0, limit_ms=40_000) == 50_000
    assert engine.advance(0) == 95_000


def test_engine_and_replay_deduplicate_impressions_by_request_id(tmp_path) -> None:
    """A redelivered impression repeats its request id and is a duplicate; one that
    reuses another's event id under a new request id is a request of its own. The
    engine and replay count the same requests, duplicates and results."""
    settings = load_settings(environ={})
    events = generate(7, requests=120, users=15)
    first, second = events.impressions[0], events.impressions[1]
    events.impressions += [
        {**first, "event_id": "imp-resent-with-a-new-id"},  # same request: a duplicate
        {**second, "request_id": "req-reusing-an-event-id"},  # same event id: a request
    ]
    _, done = run_engine(events, settings, 7)
    report = evaluate_files(*events.write(tmp_path), settings, progress=False)
    compare_totals(totals_of(done), report, settings)
    requests = {e["request_id"] for e in events.impressions}
    assert sum(len(d.requests) for d in done) == len(requests)
    assert sum(v["requests"] for v in report["variants"].values()) == len(requests)


def test_open_requests_keep_each_item_id_and_attribute_value_once() -> None:
    """Decoding gives every impression strings of its own; the open requests keep one
    code per distinct item id and attribute value (they repeat across requests and are
    most of a request's memory), so the requests made of them share one object each,
    also when loaded from the changelog."""
    settings = load_settings(environ={})
    config = engine_config(settings)
    events = [
        {
            "event_id": f"i{n}",
            "request_id": f"q{n}",
            "user_id": f"u{n}",
            "variant": "a",
            "timestamp": 1_000 + n,
            "items": ["item-x", "item-y"],
            "item_attributes": {config.attribute: ["cat-1", "cat-1"]},
        }
        for n in range(2)
    ]
    engine = PartitionEngine(0, config)
    step(engine, [("impressions", e) for e in events], settings)
    first, second = (engine.state.requests[f"q{n}"] for n in range(2))
    assert first.items == second.items == ("item-x", "item-y")
    assert all(a is b for a, b in zip(first.items, second.items, strict=True))
    assert first.attributes[0] is first.attributes[1] is second.attributes[1]
    assert first.shadow == first.interactions == ()
    # item ids, the attribute value, the variant and the empty context: one entry each
    assert len(engine.state.requests.book) == 5
    changelog: dict[str, bytes] = {}
    apply_changes(changelog, engine.take()[0])
    state = restore_state(changelog.items(), config.finalise.deadline, config.history_cap)
    assert state.requests == engine.state.requests
    assert len(state.requests.book) == 5


def test_a_request_less_interaction_counts_once_even_for_a_late_impression() -> None:
    """A click without a request id is attributed to one request only. An impression
    arriving after its deadline (late) is still finalised, but cannot take a click an
    earlier request already took: engaged once in all, one attribution. The same
    after a new owner rebuilds the state from the changelog."""
    settings = load_settings(environ={})
    config = engine_config(settings)
    minute, t = 60_000, 1_000_000_000_000

    def imp(rid: str, ts: int, items: list[str]) -> tuple[str, dict[str, Any]]:
        return "impressions", {
            "event_id": "e" + rid,
            "request_id": rid,
            "user_id": "u",
            "variant": "a",
            "timestamp": ts,
            "items": items,
        }

    def click(eid: str, ts: int, item: str, user: str = "u") -> tuple[str, dict[str, Any]]:
        event = {"event_id": eid, "user_id": user, "item_id": item, "type": "click"}
        return "interactions", {**event, "timestamp": ts}

    engine = PartitionEngine(0, config)
    changelog: dict[str, bytes] = {}
    done: list[Finalised] = []
    for chunk in (
        [imp("A", t, ["x", "y"]), click("L", t + 10 * minute, "x")],
        # both inputs move the watermark past A's deadline (another user's click)
        [imp("Z", t + 40 * minute, ["q"]), click("V1", t + 40 * minute, "q", "v")],
        [imp("B", t + 5 * minute, ["x"])],  # 35 minutes late, showing the clicked item
        [imp("Y", t + 80 * minute, ["q"]), click("V2", t + 80 * minute, "q", "v")],
    ):
        step(engine, chunk, settings)
        done += engine.finalise_due()
        apply_changes(changelog, engine.take()[0])
        restored = restore_state(changelog.items(), config.finalise.deadline, config.history_cap)
        assert_same_state(restored, engine.state)
    engaged = {
        r.request_id: float(row[1]) for d in done for r, row in zip(d.requests, d.rows, strict=True)
    }
    assert engaged == {"A": 1.0, "Z": 0.0, "B": 0.0}
    assert sum(d.outcomes["attributed"] for d in done) == 1
    assert "l:L" not in changelog  # taken: its marker is a hash in a g: segment
    assert not [name for name in changelog if name.startswith("x:")]
    step(engine, [click("L", t + 10 * minute, "x")], settings)
    assert engine.counts.duplicates == 1


def test_a_request_less_interaction_held_again_expires_at_its_own_time() -> None:
    """An id taken without a marker (its time already past the markers' bound, with
    ``finalised_ttl`` under the join horizon) and held again at a later time is
    expired by its own time, not by the entry its first holding left: as a state
    restored from the changelog, which knows only the second, expires it."""
    state = PartitionState(history_cap=3)
    state.markers.expire(200)
    first = PendingInteraction("L", "x", 100, 1.0)
    state.add_loose("u", first)
    state.take_loose([("u", first)])
    assert state.were_seen(["L"]) == [False]  # no marker: older than the bound
    state.add_loose("u", PendingInteraction("L", "x", 500, 1.0))
    changelog: dict[str, bytes] = {}
    apply_changes(changelog, state.flush())
    state.expire(loose_before_ms=101, markers_before_ms=200)
    assert state.loose_user == {"L": "u"} and "l:L" not in state.changes  # no deletion
    restored = restore_state(changelog.items(), lambda t: t, 3)
    assert restored.loose_user == state.loose_user
    assert restored.users["u"].loose == state.users["u"].loose
    state.expire(loose_before_ms=501, markers_before_ms=200)
    assert state.loose_user == {} and state.were_seen(["L"]) == [True]


def test_a_batch_of_histories_is_each_users_earliest_and_latest_day() -> None:
    """:meth:`PartitionState.add_histories` over a batch: each user keeps the ``cap``
    earliest (time, event id) of their relevant interactions, repeats ignored, and
    the activity time is the first interaction met (in batch order) of the latest
    day; one changelog value per changed user, equal to what the state holds."""
    day, t0 = 86_400_000, 1_700_000_000_000
    rng = random.Random(3)
    state = PartitionState(history_cap=3)
    events = [
        (f"u{rng.randrange(12)}", f"e{rng.randrange(300)}", t0 + rng.randrange(5 * day))
        for _ in range(400)
    ]
    for start in range(0, len(events), 37):
        state.add_histories(events[start : start + 37])
    changes = state.flush()
    for user in {u for u, _, _ in events}:
        mine = [(t, e) for u, e, t in events if u == user]
        assert state.users[user].history == sorted(set(mine))[:3]
        latest = max(t // day for t, _ in mine)
        assert state.users[user].active_ms == next(t for t, _ in mine if t // day == latest)
        assert msgspec.msgpack.decode(changes["h:" + user]) == [
            list(e) for e in sorted(set(mine))[:3]
        ]
        assert msgspec.msgpack.decode(changes["a:" + user]) == state.users[user].active_ms


def test_an_active_users_history_outlives_its_ttl() -> None:
    """The cold-start history expires 30 days after the user's latest relevant
    interaction, not after the newest of the earliest ones it keeps: a user active every
    day stays established, as in replay (before, the sweep on day 33 made them cold
    start again). The activity time survives a reload."""
    day, t0 = 86_400_000, 1_700_000_000_000
    state = PartitionState(history_cap=3)
    changelog: dict[str, bytes] = {}
    for d in range(34):
        state.add_histories([("active", f"a{d}", t0 + d * day)])
    state.add_histories([("quiet", "q0", t0)])
    apply_changes(changelog, state.flush())
    state.drop_history_before(t0 + 33 * day - 30 * day)
    apply_changes(changelog, state.flush())
    assert [t for t, _ in state.users["active"].history] == [t0, t0 + day, t0 + 2 * day]
    assert "quiet" not in state.users
    restored = restore_state(changelog.items(), lambda t: t, 3)
    assert restored.users["active"] == state.users["active"]
    assert "quiet" not in restored.users
    restored.drop_history_before(t0 + 64 * day - 30 * day)  # quiet since day 33
    assert "active" not in restored.users
