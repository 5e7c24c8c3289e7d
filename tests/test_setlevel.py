import numpy as np
import pytest

from evaluator.core.metrics.composite import composite_score
from evaluator.core.metrics.setlevel import (
    coverage_exact,
    coverage_sketch,
    distinct_by_cutoff,
    distinct_codes,
    encode_top,
    intra_list_diversity,
)
from evaluator.core.sketch import HyperLogLog, hash_strings


def test_coverage_exact() -> None:
    lists = [["a", "b", "c"], ["b", "d"], ["e"]]
    assert coverage_exact(lists, 10) == pytest.approx(0.5)
    assert coverage_exact(lists, 10, k=1) == pytest.approx(0.3)  # a, b, e
    assert coverage_exact(lists, 0) == 0.0


def test_distinct_by_cutoff_matches_a_set_per_cutoff() -> None:
    rng = np.random.default_rng(3)
    lists = [
        [f"i{v}" for v in rng.choice(60, size=rng.integers(1, 25), replace=False)]
        for _ in range(200)
    ]
    ks = [20, 1, 5, 10, 100]
    counts, full = distinct_by_cutoff(lists, ks)
    for k in ks:
        assert counts[k] == len({item for items in lists for item in items[:k]}), k
    assert full == {item for items in lists for item in items}
    assert distinct_by_cutoff([], [10]) == ({10: 0}, set())


def test_sketch_is_close_to_exact_on_a_large_set() -> None:
    lists = [[f"item-{i * 7 + j}" for j in range(20)] for i in range(20_000)]
    exact = coverage_exact(lists, 200_000)
    assert coverage_sketch(lists, 200_000) == pytest.approx(exact, rel=0.03)


def test_sketch_small_counts_and_merge() -> None:
    a, b = HyperLogLog(12), HyperLogLog(12)
    a.add([f"x{i}" for i in range(300)])
    b.add([f"x{i}" for i in range(200, 700)])
    assert a.count() == pytest.approx(300, rel=0.03)
    a.merge(b)
    assert a.count() == pytest.approx(700, rel=0.03)
    with pytest.raises(ValueError):
        a.merge(HyperLogLog(10))


def _reference_hash(value: str) -> int:
    """FNV-1a over the code points, then the 64-bit finaliser, one value at a time."""
    mask = (1 << 64) - 1
    h = 0xCBF29CE484222325
    for ch in value:
        h = ((h ^ ord(ch)) * 0x100000001B3) & mask
    for multiplier in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
        h = ((h ^ (h >> 33)) * multiplier) & mask
    return h ^ (h >> 33)


@pytest.mark.parametrize(
    "values",
    [
        ["p1", "p22", "p333", "", "x" * 40, "p1"],  # ASCII of several lengths: the fast path
        ["short", "ünïcode-é", "日本", ""],  # any code points
    ],
)
def test_hash_matches_a_per_value_reference(values: list[str]) -> None:
    assert hash_strings(values).tolist() == [_reference_hash(v) for v in values]


def test_hash_is_stable_across_batches_and_unicode_safe() -> None:
    alone = hash_strings(["ünïcode-é"])[0]
    among_longer = hash_strings(["short", "ünïcode-é", "a much longer neighbour string"])[1]
    assert alone == among_longer
    assert len(set(hash_strings([f"k{i}" for i in range(10_000)]).tolist())) == 10_000


def test_intra_list_diversity_hand_computed() -> None:
    codes = encode_top([["x", "x", "y"], ["x"], ["a", "b", "c", "d"]], k=3)
    ild = intra_list_diversity(codes)
    # list 1: pairs (x,x) same, (x,y) diff, (x,y) diff -> 2/3; list 2: one item -> NaN;
    # list 3 cut at 3: all different -> 1
    assert ild[0] == pytest.approx(2 / 3)
    assert np.isnan(ild[1])
    assert ild[2] == 1.0


def test_composite() -> None:
    values = {"ndcg@10": 0.5, "coverage@10": 0.25, "diversity@10": 1.0}
    weights = {"ndcg@10": 0.7, "coverage@10": 0.2, "diversity@10": 0.1}
    assert composite_score(values, weights) == pytest.approx(0.35 + 0.05 + 0.1)
    assert np.isnan(composite_score({"ndcg@10": 0.5}, weights))


def test_encode_top_and_distinct_codes() -> None:
    codes = encode_top([["a", "b", "c"], ["b"], []], k=2)
    assert codes.shape == (3, 2)
    assert codes[0, 0] != codes[0, 1] and codes[1, 0] == codes[0, 1]
    assert codes[1, 1] == -1 and (codes[2] == -1).all()
    assert distinct_codes(codes) == 2
