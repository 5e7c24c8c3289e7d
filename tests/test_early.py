"""The provisional pass, a batch at a time: every slot the readout uses is whole, the
pass runs about once a slot rather than at every poll, and state written before its
``q:`` mark (a pass at every poll) is continued without a request scored twice or
skipped."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from evaluator.app.replay import replay_history
from evaluator.config import load_settings
from evaluator.core.provisional import PROVISIONAL
from evaluator.core.regression import HistoryKey
from evaluator.engine import early
from evaluator.engine.partition import PartitionEngine
from evaluator.engine.restore import restore_state
from evaluator.engine.state import PartitionState
from tests.eventgen import generate
from tests.test_engine import NOW_MS, apply_changes, engine_config, ordered, step

SETTINGS = load_settings(environ={}, overrides={"join": {"attribution_window": "10m"}})


def provisional_of(history: dict[HistoryKey, np.ndarray]) -> dict[HistoryKey, np.ndarray]:
    return {key: array for key, array in history.items() if key[1].startswith(PROVISIONAL)}


def add(into: dict[HistoryKey, np.ndarray], increments: dict[HistoryKey, np.ndarray]) -> None:
    for key, array in increments.items():
        into[key] = into[key] + array if key in into else array.copy()


def used_rows(history: dict[HistoryKey, np.ndarray], watermark_ms: int) -> dict[Any, np.ndarray]:
    """The provisional slots the detector reads at data time ``watermark_ms``
    (:func:`evaluator.core.regression.detect`: those before ``ready``)."""
    layout = SETTINGS.layout()
    slot = layout.history_slot_ms
    ready = (watermark_ms - (layout.provisional_ms - layout.provisional_key_ms)) // slot * slot
    out = {}
    for (hour, name), array in history.items():
        for i, row in enumerate(array):
            if hour + i * slot < ready:
                out[(hour + i * slot, name)] = row
    return out


def run(
    events: Any, *, batch: int, restore_at: int = 0, old_until: int = 0
) -> tuple[dict[HistoryKey, np.ndarray], list[tuple[int, dict[HistoryKey, np.ndarray]]], int, int]:
    """Feed the events in batches of ``batch``, a checkpoint after each; rebuilt from
    the changelog at checkpoint ``restore_at``. The first ``old_until`` batches run as
    versions before ``q:`` did (a pass at every poll, no mark written; the mark is
    dropped from the changelog). Returns the provisional history, (watermark, history)
    after each batch, the polls and the passes that scored."""
    config = engine_config(SETTINGS)
    engine = PartitionEngine(0, config)
    changelog: dict[str, bytes] = {}
    history: dict[HistoryKey, np.ndarray] = {}
    seen: list[tuple[int, dict[HistoryKey, np.ndarray]]] = []
    stream = ordered(events, 7)
    polls = passes = 0
    for n, start in enumerate(range(0, len(stream), batch)):
        old = n < old_until
        step(engine, stream[start : start + batch], SETTINGS)
        if old:
            engine.state.scored_ms = None  # the pass starts where the old one did
        with pytest.MonkeyPatch.context() as patch:
            if old:
                patch.setattr(early, "due", lambda after, through, *_: through > after)
            engine.finalise_due()
        changes, counts = engine.take()
        if old:
            changes.pop("q:", None)
        passes += "q:" in changes
        polls += 1
        apply_changes(changelog, changes)
        add(history, provisional_of(counts.provisional))
        if engine.watermark_ms is not None:
            seen.append((engine.watermark_ms, dict(history)))
        if n == restore_at and restore_at:
            state = restore_state(changelog.items(), config.finalise.deadline, config.history_cap)
            assert state.scored_ms == (None if old else engine.state.scored_ms)
            engine = PartitionEngine(0, config, state, engine.watermark_ms, engine.input_times())
    for name in ("impressions", "interactions"):
        for now in (NOW_MS, NOW_MS + config.idle_timeout_ms):
            engine.observe(name, None, caught_up=True, now_ms=now)
    engine.advance(NOW_MS + config.idle_timeout_ms)
    engine.finalise_due()
    add(history, provisional_of(engine.take()[1].provisional))
    return history, seen, polls, passes


@pytest.fixture(scope="module")
def events_and_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    events = generate(5, requests=600, users=40)
    paths = events.write(tmp_path_factory.mktemp("early"))
    return events, provisional_of(replay_history(*paths, SETTINGS))


@pytest.mark.parametrize("batch", [3, 40])
def test_every_slot_the_readout_uses_is_whole_and_the_pass_runs_a_slot_at_a_time(
    events_and_reference: tuple[Any, Any], batch: int
) -> None:
    events, reference = events_and_reference
    assert reference  # the data span many slots
    history, seen, polls, passes = run(events, batch=batch, restore_at=17)
    assert history.keys() == reference.keys()
    for key, array in reference.items():
        assert np.array_equal(history[key], array), key
    expected = used_rows(reference, 2**62)
    checked = 0
    for watermark, partial in seen:
        for slot, row in used_rows(partial, watermark).items():
            assert np.array_equal(row, expected[slot]), (watermark, slot)
            checked += 1
        # a slot the readout uses has no requests still to come
        assert used_rows(partial, watermark).keys() <= expected.keys()
    assert checked > 100
    # 4 hours of 5-minute slots: about a pass a slot (finalisation, 8 minutes of event
    # time behind the pass, never has to wait for one here), not one per poll
    span = max(e["timestamp"] for e in events.impressions) - min(
        e["timestamp"] for e in events.impressions
    )
    assert passes <= span // SETTINGS.layout().history_slot_ms + 2
    assert batch > 3 or passes * 8 < polls


@pytest.mark.parametrize("restore_at", [9, 30])
def test_state_of_a_pass_at_every_poll_is_continued_exactly(
    events_and_reference: tuple[Any, Any], restore_at: int
) -> None:
    """Upgraded over state without ``q:``: the new owner scores from the finalised
    watermark on, as the old version would have: nothing twice, nothing skipped."""
    events, reference = events_and_reference
    history, *_ = run(events, batch=20, restore_at=restore_at, old_until=restore_at + 1)
    assert history.keys() == reference.keys()
    for key, array in reference.items():
        assert np.array_equal(history[key], array), key


def test_a_state_without_the_mark_starts_at_the_finalised_watermark() -> None:
    state = PartitionState()
    assert early.scored_through(state, 60_000) == -(2**62)
    state.finalised_ms = 1_000_000
    assert early.scored_through(state, 60_000) == 940_000
    state.scored_through(900_000)
    assert early.scored_through(state, 60_000) == 900_000


@pytest.mark.parametrize("offset", ["-skew", "+age"])
def test_loose_interactions_at_the_edges_of_the_span_count(offset: str) -> None:
    """Only the user's loose interactions that can count for a young request are
    joined: one as early as the clock skew allows and one at the provisional age
    exactly still count (the same increments as with every interaction joined)."""
    layout, rules = SETTINGS.layout(), SETTINGS.join.rules()
    t0 = 1_700_000_000_000
    at = {"-skew": t0 - rules.max_clock_skew_ms, "+age": t0 + layout.provisional_age_ms}[offset]
    imp = {"event_id": "i1", "request_id": "r1", "user_id": "u", "variant": "A"}
    click = {"event_id": "c1", "user_id": "u", "type": "click"}
    events = [
        ("impressions", {**imp, "timestamp": t0, "items": ["a", "b", "c"]}),
        ("interactions", {**click, "item_id": "b", "timestamp": at}),
    ]
    scored = []
    for spans in (True, False):
        engine = PartitionEngine(0, engine_config(SETTINGS))
        step(engine, events, SETTINGS)
        step(
            engine,
            [
                (
                    "impressions",
                    {**imp, "request_id": "r2", "timestamp": t0 + 3_600_000, "items": ["z"]},
                ),
                (
                    "interactions",
                    {**click, "event_id": "c2", "item_id": "z", "timestamp": t0 + 3_600_000},
                ),
            ],
            SETTINGS,
        )
        with pytest.MonkeyPatch.context() as patch:
            if not spans:
                patch.setattr(early, "_spans", lambda *_: None)
            engine.finalise_due()
        scored.append(provisional_of(engine.take()[1].provisional))
    with_spans, without = scored
    assert with_spans.keys() == without.keys() and with_spans
    for key, array in without.items():
        assert np.array_equal(with_spans[key], array), key
    (array,) = [a for (_, name), a in without.items() if name == PROVISIONAL + "A"]
    assert array[..., 1].sum() == 1  # the one request, engaged by the click
