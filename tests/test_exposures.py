"""Each experiment's exposed users as hashed sets: checked against a plain set of ids,
through flushes, merges, a rebuild from the changelog and an upgrade from ``e:``
fields."""

from __future__ import annotations

import dataclasses
import random

import msgspec
import pytest

from evaluator.config import load_settings
from evaluator.engine import exposures as exposures_module
from evaluator.engine.partition import PartitionEngine
from evaluator.engine.restore import restore_state
from evaluator.engine.state import PartitionState
from tests.test_engine import engine_config, step


def apply(changelog: dict[str, bytes], changes: dict[str, bytes | None]) -> None:
    for name, value in changes.items():
        if value is None:
            changelog.pop(name, None)
        else:
            changelog[name] = value


@pytest.mark.parametrize("rows", [4, 1 << 20], ids=["runs-capped", "default-cap"])
def test_first_exposures_match_a_set_of_ids_through_flushes_and_rebuilds(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of users, repeats within a batch and across batches, two experiments:
    ``first`` is True exactly for a user not seen before in that experiment, whether
    the earlier sighting is pending, in a run, in a merged run, or in a state rebuilt
    from the changelog; the changelog holds few fields."""
    monkeypatch.setattr(exposures_module, "RUN_ROWS", rows)
    rng = random.Random(5)
    state = PartitionState()
    changelog: dict[str, bytes] = {}
    seen: dict[str, set[str]] = {"x": set(), "y": set()}
    for n in range(60):
        experiment = "xy"[n % 2]
        users = [f"u{rng.randrange(300)}" for _ in range(rng.randrange(0, 12))]
        want = []
        for user in users:
            want.append(user not in seen[experiment])
            seen[experiment].add(user)
        assert state.expose(experiment, users) == want
        if n % 3 == 2:
            apply(changelog, state.flush())
        if n % 10 == 9:
            apply(changelog, state.flush())
            rebuilt = restore_state(changelog.items(), lambda t: t, 3)
            assert rebuilt.exposed.live() == state.exposed.live()
            state = rebuilt
    assert {name: len(s) for name, s in state.exposed.sets.items()} == {
        k: len(v) for k, v in seen.items()
    }
    stored = [name for name in changelog if name.startswith("v:")]
    runs = sum(len(s.names()) for s in state.exposed.sets.values())
    assert sorted(stored) == sorted(n for s in state.exposed.sets.values() for n in s.names())
    if rows == 4:  # runs of more than two hashes are searched in the base
        assert all(s.frozen and s.base.size for s in state.exposed.sets.values())
    if rows > 4:
        assert runs <= 2 * 9  # merged: a logarithmic number per experiment


def test_dropping_an_experiment_deletes_its_fields_and_keeps_the_others() -> None:
    state = PartitionState()
    changelog: dict[str, bytes] = {}
    state.expose("x", ["a", "b"])
    state.expose("y", ["a"])
    apply(changelog, state.flush())
    state.expose("x", ["c"])
    assert state.drop_exposures("x") == 3
    apply(changelog, state.flush())
    rebuilt = restore_state(changelog.items(), lambda t: t, 3)
    assert set(rebuilt.exposed.live()) == {"y"}
    assert rebuilt.expose("x", ["a"]) == [True]  # forgotten
    assert rebuilt.expose("y", ["a"]) == [False]


def test_exposures_of_the_previous_format_are_converted_once() -> None:
    """Versions before exposure sets wrote one ``e:<experiment US user>`` field per
    user: a new owner reads them (those users are not counted again), writes them as
    a ``v:`` segment with the seed, and deletes the old fields in the same checkpoint."""
    settings = load_settings(environ={})
    config = dataclasses.replace(engine_config(settings), experiments=settings.ab.experiment_list())
    encode = msgspec.msgpack.encode
    t0 = 1_000_000_000
    old = {
        "e:default\x1fu1": encode(["A", t0 - 10]),
        "e:default\x1fu2": encode(["B", t0 - 5]),
        "w:": encode(t0 - 1),
    }
    state = restore_state(old.items(), config.finalise.deadline, config.history_cap)
    engine = PartitionEngine(0, config, state, t0, {"impressions": t0, "interactions": t0})
    imps = [
        ("impressions", {"event_id": f"i{n}", "request_id": f"r{n}", "user_id": user,
                         "variant": variant, "timestamp": t0 + n, "items": ["x"]})
        for n, (user, variant) in enumerate([("u1", "B"), ("u2", "B"), ("u3", "A")])
    ]  # fmt: skip
    step(engine, imps, settings)
    changes, counts = engine.take()
    assert dict(counts.exposures) == {"default\x1fA": 1}  # only u3 is new
    assert changes["e:default\x1fu1"] is None and changes["e:default\x1fu2"] is None
    assert "k:" in changes and any(name.startswith("v:") for name in changes)
    changelog = dict(old)
    apply(changelog, changes)
    assert not any(name.startswith("e:") for name in changelog)
    rebuilt = restore_state(changelog.items(), config.finalise.deadline, config.history_cap)
    assert rebuilt.exposed.live() == engine.state.exposed.live()
    assert rebuilt.expose("default", ["u1", "u2", "u3", "u4"]) == [False, False, False, True]


def test_hashes_are_keyed_by_the_partition_seed() -> None:
    """The same user hashes differently in two partitions (their own random seeds), and
    the same in a state rebuilt from the changelog (the seed is written with them)."""
    a, b = PartitionState(), PartitionState()
    a.expose("x", ["u1"])
    b.expose("x", ["u1"])
    assert a.exposed.live() != b.exposed.live()
    changes = a.flush()
    assert "k:" in changes
    rebuilt = restore_state([(k, v) for k, v in changes.items() if v is not None], lambda t: t, 3)
    assert rebuilt.exposed.live() == a.exposed.live()
