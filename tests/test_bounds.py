"""Forwarding bounds: how far a partition may finalise while events may be forwarded."""

from __future__ import annotations

from evaluator.engine.bounds import (
    FORWARDING_SPAN,
    MARKS_EVERY_MS,
    NO_LIMIT,
    ForwardingBounds,
    fresher,
)
from evaluator.engine.checkpoint import Marks

IDLE_MS = 1_000


def test_fresher_takes_the_later_of_stored_and_in_memory_marks() -> None:
    stored = {0: Marks(100, None), 1: Marks(500, 7), 2: Marks(None, None)}
    local = {0: Marks(300, 9), 1: Marks(400, None), 2: Marks(None, None)}
    assert fresher(stored, local) == {0: Marks(300, 9), 1: Marks(500, 7), 2: Marks(None, None)}
    # partitions owned elsewhere keep the stored marks; one unknown to the store is added
    assert fresher(stored, {3: Marks(50, None)})[3] == Marks(50, None)
    assert fresher(stored, {})[1] == Marks(500, 7)


def test_a_bound_applies_once_the_repartition_input_was_confirmed_after_its_read() -> None:
    marks = {0: Marks(1_000, None), 1: Marks(2_000, None)}
    bounds = ForwardingBounds(lambda: dict(marks), IDLE_MS)
    # read at 0; the repartition input of 0 last confirmed before the read: hold
    assert bounds.limits([0, 1], {"repartition:0": -5}, 0) == {0: NO_LIMIT, 1: NO_LIMIT}
    # confirmed after the read: the smallest own watermark over all partitions
    assert bounds.limits([0, 1], {"repartition:0": 0}, 10) == {0: 1_000, 1: NO_LIMIT}
    marks[0] = Marks(3_000, None)  # read again only MARKS_EVERY_MS later
    assert bounds.limits([0, 1], {"repartition:0": 20}, 20)[0] == 1_000
    at = MARKS_EVERY_MS + 20
    assert bounds.limits([0], {"repartition:0": at - 1}, at)[0] == 1_000  # not yet
    assert bounds.limits([0], {"repartition:0": at}, at + 1)[0] == 2_000
    marks[1] = Marks(None, None)  # a partition's progress unknown: the bound holds...
    later = 2 * MARKS_EVERY_MS + 20
    assert bounds.limits([0], {"repartition:0": later}, later)[0] == 2_000  # ...never back


def test_bounds_end_once_nothing_was_forwarded_for_the_span() -> None:
    marks = {0: Marks(1_000, None), 1: Marks(2_000, None)}
    bounds = ForwardingBounds(lambda: dict(marks), IDLE_MS)
    assert bounds.limits([0], {"repartition:0": 0}, 0) == {0: 1_000}
    span = IDLE_MS * FORWARDING_SPAN
    assert bounds.limits([0], {"repartition:0": span}, span) == {0: 1_000}  # still young
    over = span + MARKS_EVERY_MS  # the next read
    assert bounds.limits([0], {"repartition:0": over}, over) == {}
    marks[1] = Marks(2_000, over + 5)  # a partition forwards: bounded again
    now = over + MARKS_EVERY_MS
    assert bounds.limits([0], {"repartition:0": now}, now) == {0: 1_000}


def test_a_reloaded_partition_earns_its_limit_again() -> None:
    """A partition reloaded from its checkpoint resumes behind its repartition input:
    the limit its earlier engine earned does not hold until the input is confirmed at
    its end again."""
    marks = {0: Marks(1_000, None), 1: Marks(2_000, None)}
    bounds = ForwardingBounds(lambda: dict(marks), IDLE_MS)
    assert bounds.limits([0], {"repartition:0": 0}, 0) == {0: 1_000}
    bounds.forget(0)
    assert bounds.limits([0], {}, 10) == {0: NO_LIMIT}  # behind its input: hold
    assert bounds.limits([0], {"repartition:0": 20}, 20) == {0: 1_000}
