"""Strings as hashed spans: the hash's promises and the repeat check, against sets."""

from __future__ import annotations

import random

import numpy as np
import pytest

from evaluator.core.tokens import Spans, hash_spans, repeated, string_spans


def test_short_strings_of_one_length_never_share_a_hash() -> None:
    """Up to 8 bytes the hash is a bijection of the bytes (per length): every 2-byte
    string, and a sample of 8-byte ones, hash apart."""
    pairs = [chr(a) + chr(b) for a in range(128) for b in range(128)]
    keys = hash_spans(string_spans(pairs), seed=7)
    assert np.unique(keys).size == len(pairs)
    rng = random.Random(1)
    long = list({"".join(rng.choice("ab") for _ in range(8)) for _ in range(300)})
    assert np.unique(hash_spans(string_spans(long), seed=7)).size == len(long)


def test_keys_depend_on_the_seed_and_on_every_byte() -> None:
    words = ["p-0001", "p-0002", "a" * 30 + "x", "a" * 30 + "y", "", "a"]
    one, two = hash_spans(string_spans(words), 1), hash_spans(string_spans(words), 2)
    assert np.unique(one).size == len(words)
    assert (one != two).all()


@pytest.mark.parametrize("seed", range(5))
def test_repeated_agrees_with_sets(seed: int) -> None:
    rng = random.Random(seed)
    lists = [[f"i{rng.randrange(30)}" for _ in range(rng.randrange(0, 9))] for _ in range(200)]
    flat = string_spans([s for row in lists for s in row])
    counts = np.array([len(row) for row in lists], dtype=np.int64)
    off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    spans = Spans(flat.buf, flat.start, flat.length, off)
    got = repeated(spans, hash_spans(spans, seed))
    assert got.tolist() == [len(set(row)) != len(row) for row in lists]
