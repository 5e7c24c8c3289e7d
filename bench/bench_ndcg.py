"""Lists per second for batch nDCG@10: this package, a naive per-list loop, and pytrec_eval.

    .venv/bin/python bench/bench_ndcg.py [--lists 1000000] [--repeats 5]

All three score the same random lists of 20 items (linear gain, so trec_eval's
ndcg_cut_10 is the same quantity). The slow competitors run on a subset and are
reported as rates, which is fair because their cost is linear in the lists.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from _common import machine, median_rate

from evaluator.core.metrics.ndcg import ndcg


def naive(rows: list[list[int]], k: int) -> list[float]:
    out = []
    for row in rows:
        dcg = sum(g / math.log2(i + 2) for i, g in enumerate(row[:k]))
        ideal = sorted(row, reverse=True)
        idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal[:k]))
        out.append(dcg / idcg if idcg > 0 else 0.0)
    return out


def trec(rows: list[list[int]]) -> dict:
    import pytrec_eval

    qrels = {f"q{q}": {f"d{i}": g for i, g in enumerate(row)} for q, row in enumerate(rows)}
    run = {f"q{q}": {f"d{i}": float(20 - i) for i in range(len(row))} for q, row in enumerate(rows)}
    return pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lists", type=int, default=1_000_000)
    parser.add_argument("--subset", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    grades = (rng.integers(0, 4, (args.lists, 20)) * (rng.random((args.lists, 20)) < 0.2)).astype(
        np.float64
    )
    rows = grades[: args.subset].astype(int).tolist()

    ours, spread = median_rate(lambda: ndcg(grades, [10], gain="linear"), args.lists, args.repeats)
    slow, _ = median_rate(lambda: naive(rows, 10), args.subset, args.repeats)
    ref, _ = median_rate(lambda: trec(rows), args.subset, args.repeats)
    check = ndcg(grades[: args.subset], [10], gain="linear")[:, 0]
    assert np.allclose(check, naive(rows, 10), atol=1e-12)
    print(f"machine: {machine()}")
    print(f"lists of 20 items, K=10, median of {args.repeats} runs")
    print(f"  evaluator batch nDCG : {ours:12,.0f} lists/s  (max/min spread {spread:.2f})")
    print(f"  naive per-list Python: {slow:12,.0f} lists/s  -> evaluator is {ours / slow:,.0f}x")
    print(f"  pytrec_eval          : {ref:12,.0f} lists/s  -> evaluator is {ours / ref:,.0f}x")


if __name__ == "__main__":
    main()
