"""The totals a partition's owner holds of the arrays its checkpoints add to
(``evaluator/adapters/redis/totals.py``): what it must read again, and sums bit for
bit those of adding one checkpoint after another. Pure; the store contract suite
checks them against Redis."""

from __future__ import annotations

import numpy as np

from evaluator.adapters.redis.totals import HELD_S, Target, Totals
from evaluator.config import load_settings

LAYOUT = load_settings(environ={}).layout()


def test_an_owner_reads_again_after_a_new_epoch_a_pause_or_a_refused_write() -> None:
    now = [0.0]
    totals = Totals(clock=lambda: now[0])
    targets = [Target("b:x", 3, False), Target("b:y", 2, False)]
    assert totals.unknown(0, 1, targets) == ["b:x", "b:y"]
    incs = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    _, new = totals.sums(0, 1, targets, incs.tobytes(), read={}, layout=LAYOUT)
    assert totals.unknown(0, 1, targets) == ["b:x", "b:y"]  # nothing held until written
    totals.keep(0, 1, new, targets, 0)
    assert totals.unknown(0, 1, targets) == []
    assert totals.unknown(1, 1, targets) == ["b:x", "b:y"]  # another partition's
    now[0] = HELD_S - 1
    assert totals.unknown(0, 1, targets) == []
    now[0] = HELD_S + 1  # unused for HELD_S: perhaps expired in Redis
    assert totals.unknown(0, 1, targets) == ["b:x", "b:y"]
    totals.keep(0, 1, new, targets, 0)
    assert totals.unknown(0, 2, targets) == ["b:x", "b:y"]  # a new owner epoch
    totals.keep(0, 2, new, targets, 0)
    totals.forget(0)
    assert totals.unknown(0, 2, targets) == ["b:x", "b:y"]


def test_sums_equal_adding_each_checkpoint_in_turn() -> None:
    """A key twice in one checkpoint (two finalisations between checkpoints) adds
    twice, in order; a key held adds to its total; one read adds to the stored value."""
    rng = np.random.default_rng(3)
    totals = Totals()
    x, y = Target("rh:x", 4, False), Target("rh:y", 4, False)
    stored = rng.random(4)
    first = rng.random(12)
    sums, new = totals.sums(
        0, 1, [x, y, x], first.tobytes(), read={"rh:y": stored.tobytes()}, layout=LAYOUT
    )
    got = np.frombuffer(sums)
    assert np.array_equal(got[:4], first[:4])
    assert np.array_equal(got[4:8], stored + first[4:8])
    assert np.array_equal(got[8:], first[:4] + first[8:])
    totals.keep(0, 1, new, [x, y, x], 0)
    second = rng.random(8)
    sums, _ = totals.sums(0, 1, [y, x], second.tobytes(), read={}, layout=LAYOUT)
    got = np.frombuffer(sums)
    assert np.array_equal(got[:4], stored + first[4:8] + second[:4])
    assert np.array_equal(got[4:], first[:4] + first[8:] + second[4:])


def test_a_block_stored_before_columns_were_added_is_read_widened() -> None:
    block = LAYOUT.block_shape
    narrow = np.arange(block[0] * block[1] * (block[2] - 2), dtype=np.float64)
    target = Target("b:z", int(np.prod(block)), True)
    incs = np.ones(target.doubles)
    sums, _ = Totals().sums(
        0, 1, [target], incs.tobytes(), read={"b:z": narrow.tobytes()}, layout=LAYOUT
    )
    got = np.frombuffer(sums).reshape(block)
    want = np.zeros(block)
    want[..., :-2] = narrow.reshape(block[0], block[1], block[2] - 2)
    assert np.array_equal(got, want + 1.0)
