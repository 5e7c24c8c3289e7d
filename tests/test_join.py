import pytest

from evaluator.core.join import (
    JoinOutcome,
    JoinRules,
    in_window,
    join_by_request,
    join_by_user,
)

RULES = JoinRules(attribution_window_ms=1_000, max_clock_skew_ms=100)


@pytest.mark.parametrize(
    ("t", "inside"), [(899, False), (900, True), (1_000, True), (2_000, True), (2_001, False)]
)
def test_window_bounds_are_inclusive(t: int, inside: bool) -> None:
    assert in_window(t, 1_000, RULES) is inside


def test_join_by_request() -> None:
    items = ["a", "b", "c"]
    assert join_by_request("c", 1_500, 1_000, items, RULES) == (JoinOutcome.ATTRIBUTED, 2)
    assert join_by_request("z", 1_500, 1_000, items, RULES) == (JoinOutcome.NOT_IN_LIST, -1)
    assert join_by_request("c", 5_000, 1_000, items, RULES) == (JoinOutcome.OUTSIDE_WINDOW, -1)
    assert join_by_request("c", 1_500, None, None, RULES) == (JoinOutcome.NO_IMPRESSION, -1)


def test_join_by_user_picks_most_recent_impression_with_the_item() -> None:
    ts = [1_000, 1_400, 1_500, 1_700]
    lists = [
        ["a", "b"],
        ["b", "a"],
        ["c"],  # most recent, but without the item
        ["a"],  # after the interaction by more than the skew
    ]
    assert join_by_user("a", 1_550, ts, lists, RULES) == (JoinOutcome.ATTRIBUTED, 1, 1)
    # within the clock skew, an impression slightly after the interaction wins
    assert join_by_user("a", 1_650, ts, lists, RULES) == (JoinOutcome.ATTRIBUTED, 3, 0)
    assert join_by_user("b", 9_000, ts, lists, RULES) == (JoinOutcome.OUTSIDE_WINDOW, -1, -1)
    assert join_by_user("z", 1_550, ts, lists, RULES) == (JoinOutcome.NOT_IN_LIST, -1, -1)
    assert join_by_user("a", 1_550, [], [], RULES) == (JoinOutcome.NO_IMPRESSION, -1, -1)


def test_rules_validate() -> None:
    with pytest.raises(ValueError):
        JoinRules(attribution_window_ms=0)
    with pytest.raises(ValueError):
        JoinRules(max_clock_skew_ms=-1)


def test_batch_request_join_equals_one_by_one() -> None:
    import random

    import numpy as np

    from evaluator.core.join import OUTCOME_CODES, join_by_request_batch

    rng = random.Random(4)
    rules = JoinRules(attribution_window_ms=1_000, max_clock_skew_ms=100)
    lists = [[f"i{rng.randrange(30)}" for _ in range(rng.randint(1, 8))] for _ in range(40)]
    shown = [rng.randrange(10_000) for _ in lists]
    rows = [rng.randrange(-1, len(lists)) for _ in range(2_000)]
    items = [f"i{rng.randrange(30)}" for _ in rows]
    times = [(shown[r] if r >= 0 else 5_000) + rng.randrange(-300, 1_300) for r in rows]
    codes, positions = join_by_request_batch(
        items, np.asarray(times), rows, np.asarray(shown), lists, rules=rules
    )
    for j, (row, item, t) in enumerate(zip(rows, items, times, strict=True)):
        want = join_by_request(
            item, t, shown[row] if row >= 0 else None, lists[row] if row >= 0 else None, rules
        )
        got = (OUTCOME_CODES[codes[j]], int(positions[j]))
        assert got == (want[0], want[1] if want[0] == JoinOutcome.ATTRIBUTED else -1)
    assert len(set(codes.tolist())) == 4  # every outcome occurred
    # items as codes of a Ragged (the live engine's): the same outcomes and positions
    from evaluator.core.due import Ragged

    coded: dict[str, int] = {}
    ragged = Ragged.of_lists([[coded.setdefault(i, len(coded)) for i in row] for row in lists])
    item_codes = np.array([coded.get(i, -1) for i in items], dtype=np.int64)
    got_codes, got_positions = join_by_request_batch(
        item_codes, np.asarray(times), rows, np.asarray(shown), ragged, rules=rules
    )
    assert got_codes.tolist() == codes.tolist()
    assert got_positions.tolist() == positions.tolist()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_batch_user_join_equals_one_by_one(seed: int) -> None:
    import random

    import numpy as np

    from evaluator.core.due import Ragged
    from evaluator.core.join import (
        UserImpressions,
        join_by_user_batch,
        join_by_user_each,
        user_order,
    )

    rng = random.Random(seed)
    n = 300
    user = np.array([rng.randrange(8) for _ in range(n)], dtype=np.int64)
    ms = np.array([rng.randrange(0, 6_000, 50) for _ in range(n)], dtype=np.int64)  # ties
    ids = [f"r{rng.randrange(10**6)}" for _ in range(n)]
    lists = [[f"i{rng.randrange(25)}" for _ in range(rng.randint(1, 6))] for _ in range(n)]
    order = user_order(user, ms, ids)
    want_order = sorted(range(n), key=lambda r: (user[r], ms[r], ids[r]))
    assert order.tolist() == want_order
    index = UserImpressions(user[order], ms[order], [lists[r] for r in order.tolist()])
    m = 3_000
    items = [f"i{rng.randrange(30)}" for _ in range(m)]
    times = np.array([rng.randrange(-2_000, 9_000) for _ in range(m)], dtype=np.int64)
    users = np.array([rng.randrange(-1, 9) for _ in range(m)], dtype=np.int64)
    got = join_by_user_batch(items, times, users, index, rules=RULES)
    want = join_by_user_each(items, times, users, index, rules=RULES)
    for a, b in zip(got, want, strict=True):
        assert a.tolist() == b.tolist()
    assert set(got[0].tolist()) == {0, 1, 2, 3}  # every outcome occurred
    # unclassified: the same attributions, every other interaction code 2
    codes, chosen, positions = join_by_user_batch(
        items, times, users, index, rules=RULES, classify=False
    )
    assert codes.tolist() == [0 if c == 0 else 2 for c in want[0].tolist()]
    assert chosen.tolist() == want[1].tolist() and positions.tolist() == want[2].tolist()
    # items as codes (the live engine's): the same answers, classified or not
    coded: dict[str, int] = {}
    ragged = Ragged.of_lists(
        [[coded.setdefault(i, len(coded)) for i in lists[r]] for r in order.tolist()]
    )
    item_codes = np.array([coded.get(i, -1) for i in items], dtype=np.int64)
    index = UserImpressions(user[order], ms[order], ragged)
    for classify in (True, False):
        got = join_by_user_batch(item_codes, times, users, index, rules=RULES, classify=classify)
        codes = want[0].tolist() if classify else [0 if c == 0 else 2 for c in want[0].tolist()]
        assert got[0].tolist() == codes
        assert got[1].tolist() == want[1].tolist() and got[2].tolist() == want[2].tolist()
