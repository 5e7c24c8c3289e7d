"""The newest open requests, held as they came until read as columns: every read answers
as the plain dict of requests does, whatever the order of the reads, and the rows
become one chunk per checkpoint, not one per batch."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from evaluator.core.due import OpenRequest, requests_of
from evaluator.core.tokens import Spans, string_spans
from evaluator.engine.codebook import ITEM_SEED
from evaluator.engine.columns import OpenTable
from tests.test_columns import request, row, small_chunks


def spans_of(batch: list[list[Any]]) -> Spans:
    """The batch's item ids as hashed spans, one owner a row (as the live decoder
    hands them over)."""
    flat = string_spans([item for r in batch for item in r[4]])
    off = np.zeros(len(batch) + 1, dtype=np.int64)
    np.cumsum([len(r[4]) for r in batch], out=off[1:])
    return flat._replace(off=off).hashed(ITEM_SEED)


def shown(table: OpenTable, users: list[str]) -> list[tuple[str, str, int, tuple[str, ...]]]:
    got = table.of_users(users)
    names = table.book.strings
    return sorted(
        (rid, uid, ms, tuple(names[c] for c in items))
        for uid, ms, rid, items in zip(
            got.user, got.ms.tolist(), got.request, got.items.lists(), strict=True
        )
    )


def expected(
    reference: dict[str, OpenRequest], users: list[str]
) -> list[tuple[str, str, int, tuple[str, ...]]]:
    return sorted(
        (r.request_id, r.user_id, r.timestamp_ms, r.items)
        for r in reference.values()
        if r.user_id in users
    )


@pytest.mark.parametrize("seed", range(6))
def test_reads_in_any_order_answer_as_a_dict(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches with and without hashed item spans; between two checkpoints the reads the
    engine makes, in a random order, before anything makes the held rows a chunk:
    membership, the open requests of some users, the due ones (closed where they were
    found after a read of users, as the finalisation does), the provisional peek."""
    small_chunks(monkeypatch, 16)
    rng = random.Random(seed)
    table, reference = OpenTable(), {}
    made = 0
    for _ in range(80):
        for _ in range(rng.randrange(1, 5)):  # the polls between two checkpoints
            batch = [row(made + k, rng) for k in range(rng.randrange(0, 12))]
            made += len(batch)
            table.append(batch, spans_of(batch) if rng.random() < 0.7 else None, record=True)
            reference.update((r[0], request(r)) for r in batch)
        for read in rng.sample(["contains", "users", "due", "peek"], 4):
            if read == "contains":
                probe = [*rng.sample(sorted(reference), min(15, len(reference))), "req-x"]
                assert table.contains(probe) == [rid in reference for rid in probe]
            elif read == "users":
                users = [f"user-{rng.randrange(25)}" for _ in range(3)]
                assert shown(table, users) == expected(reference, users)
            elif read == "due":
                through = 1_000 + rng.randrange(200)  # often none of the newest
                due, places = table.due(through)
                users = [f"user-{rng.randrange(25)}" for _ in range(4)]
                assert shown(table, users) == expected(reference, users)
                want = sorted(
                    (r for r in reference.values() if r.timestamp_ms <= through),
                    key=lambda r: (r.timestamp_ms, r.request_id),
                )
                assert requests_of(due, table.book.strings) == want
                table.close(places)
                for r in want:
                    del reference[r.request_id]
            else:
                after, through = 1_000 + rng.randrange(300), 1_200 + rng.randrange(300)
                got = requests_of(table.peek(after, through), table.book.strings)
                assert got == sorted(
                    (r for r in reference.values() if after < r.timestamp_ms <= through),
                    key=lambda r: (r.timestamp_ms, r.request_id),
                )
            assert len(table) == len(reference)
        table.take_built()  # the checkpoint
        assert table.as_dict() == reference


def test_the_batches_between_two_checkpoints_become_one_chunk() -> None:
    """Ten polls' requests, found open by id all along, are one chunk at the checkpoint
    (the cost of a chunk is paid per checkpoint, not per poll); rows a new owner
    reloads are not reported as opened."""
    rng = random.Random(1)
    table, made = OpenTable(), 0
    table.append([row(made + k, rng) for k in range(5)])  # reloaded: not reported
    made += 5
    ids: list[str] = []
    for _ in range(10):
        batch = [row(made + k, rng) for k in range(8)]
        made += len(batch)
        table.append(batch, spans_of(batch), record=True)
        ids += [r[0] for r in batch]
        assert table.contains(ids) == [True] * len(ids)
    built = table.take_built()
    assert [chunk.size for chunk in built] == [80]
    assert built[0].ids.texts(np.arange(80)) == ids
    assert table.take_built() == []
    assert len(table) == made
