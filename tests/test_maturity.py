"""The maturity curve's core (evaluator/core/maturity.py) against a reference that
scores each request from scratch with the interactions of its first minutes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from evaluator.config import ConfigError, load_settings
from evaluator.core.finalise import Attributed
from evaluator.core.maturity import curve, maturity_increments, partial_ndcg
from evaluator.core.provisional import MATURITY
from evaluator.core.regression import DAY_MS, SCALE, variant_codes
from evaluator.core.scoring import ScoringConfig, score_sparse
from tests import reference

KS = (3, 10)
AGES = (60_000, 300_000, 1_200_000)


def world(seed: int, n: int = 300) -> tuple[Attributed, np.ndarray, list[str]]:
    """Requests of 12 items over two days; each gets 0-4 interactions (grades 1-3, some
    on the same item) at delays from seconds to half an hour."""
    rng = random.Random(seed)
    request_ms = np.array([rng.randrange(2 * DAY_MS) for _ in range(n)], dtype=np.int64)
    rows, positions, grades, times = [], [], [], []
    for r in range(n):
        for _ in range(rng.choice([0, 0, 1, 2, 4])):
            rows.append(r)
            positions.append(rng.randrange(12))
            grades.append(float(rng.choice([1, 1, 2, 3])))
            times.append(int(request_ms[r]) + int(rng.expovariate(1 / 240_000)) % 1_800_000)
    attributed = Attributed(
        np.array(rows, dtype=np.int64),
        np.array(positions, dtype=np.int64),
        np.array(grades),
        np.array(times, dtype=np.int64),
    )
    return attributed, request_ms, [rng.choice("AB") for _ in range(n)]


def reference_ndcg(attributed: Attributed, request_ms: np.ndarray, r: int, age: float) -> list:
    """nDCG@K of request ``r`` from the grades of its interactions within ``age``."""
    grades = [0.0] * 12
    for row, pos, grade, ms in zip(*attributed, strict=True):
        if row == r and ms - request_ms[r] <= age:
            grades[pos] = max(grades[pos], grade)
    return [reference.ndcg(grades, k) for k in KS]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_partial_ndcg_is_each_request_scored_with_its_first_minutes(seed: int) -> None:
    attributed, request_ms, _ = world(seed)
    n = len(request_ms)
    scoring = ScoringConfig(ks=KS)
    final = score_sparse(n, *attributed[:3], scoring, metrics=("ndcg",))
    values, engaged = partial_ndcg(attributed, request_ms, final.values["ndcg"], AGES, scoring)
    assert values.shape == (n, len(AGES), len(KS))
    for r in range(n):
        assert reference_ndcg(attributed, request_ms, r, np.inf) == pytest.approx(
            final.values["ndcg"][r].tolist(), abs=1e-12
        )
        for a, age in enumerate(AGES):
            want = reference_ndcg(attributed, request_ms, r, age)
            assert values[r, a].tolist() == pytest.approx(want, abs=1e-12), (r, age)
            mine = attributed.ms[attributed.row == r] - request_ms[r]
            seen = mine <= age
            assert engaged[r, a] == seen.any()  # every grade here is positive
    # only requests with a relevant interaction after an age were scored again
    late = np.zeros((n, len(AGES)), dtype=bool)
    for row, grade, ms in zip(attributed.row, attributed.grade, attributed.ms, strict=True):
        late[row] |= grade > 0 and np.array(AGES) < ms - request_ms[row]
    same = values == final.values["ndcg"][:, None, :]
    assert same[~late].all() and not same[late].all()


def test_the_curve_is_the_share_of_the_final_sum_over_the_recent_days() -> None:
    attributed, request_ms, variants = world(4, n=600)
    n = len(request_ms)
    scoring = ScoringConfig(ks=KS)
    final = score_sparse(n, *attributed[:3], scoring, metrics=("ndcg",))
    ndcg = final.values["ndcg"]
    aged = partial_ndcg(attributed, request_ms, ndcg, AGES, scoring)
    deadline = request_ms + 31 * 60_000
    codes = variant_codes(variants)
    # two halves added separately sum to the whole (whole numbers of 1e-9)
    half = n // 2
    parts = [
        maturity_increments(
            deadline[s],
            (codes[0], codes[1][s]),
            (ndcg[s], final.engaged[s]),
            (aged[0][s], aged[1][s]),
        )
        for s in (slice(0, half), slice(half, n))
    ]
    whole = maturity_increments(deadline, codes, (ndcg, final.engaged), aged)
    for key, array in whole.items():
        summed = sum(p[key] for p in parts if key in p)
        assert np.array_equal(summed, array), key
        assert key[0] % DAY_MS == 0 and key[1].startswith(MATURITY)
        assert array.shape == (len(AGES) + 1, 2 + 2 * len(KS))
    since = 2 * DAY_MS - 1  # the last day only
    found = curve(whole, since, KS)
    last_day = deadline >= DAY_MS * (since // DAY_MS)
    for (variant, k), shares in found.items():
        i = KS.index(k)
        mine = last_day & (np.array(variants) == variant)
        want = [
            np.rint(aged[0][mine, a, i] * SCALE).sum() / np.rint(ndcg[mine, i] * SCALE).sum()
            for a in range(len(AGES))
        ]
        assert shares.tolist() == pytest.approx(want, rel=1e-12)
        assert shares[0] > 0  # not monotone in general: a late grade can raise the ideal
    assert {v for v, _ in found} == set(variants)


@pytest.mark.parametrize(
    "ages", [["5m", "1m"], ["0s"], ["1m"] * 2, [f"{m}m" for m in range(1, 14)]]
)
def test_bad_maturity_ages_stop_start_up_naming_the_key(ages: list[str]) -> None:
    with pytest.raises(ConfigError, match="maturity_ages"):
        load_settings(environ={}, overrides={"regression": {"maturity_ages": ages}})


def test_ages_not_shorter_than_the_window_are_left_out() -> None:
    settings = load_settings(environ={}, overrides={"join": {"attribution_window": "5m"}})
    assert settings.maturity_ages_ms() == (60_000, 120_000)
    off = load_settings(environ={}, overrides={"regression": {"maturity_ages": []}})
    assert off.maturity_ages_ms() == () and off.layout().maturity_ages_ms == ()
