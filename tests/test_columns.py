"""The columnar open requests against a plain dict of request objects: the same
answers after any sequence of openings and closings, hash collisions included."""

from __future__ import annotations

import random
import uuid
from typing import Any

import msgspec
import numpy as np
import pytest

from evaluator.core.ab.interleaving import draft
from evaluator.core.due import OpenRequest, requests_of
from evaluator.engine import chunks, columns, merges, segments, uuids
from evaluator.engine.codebook import Codebook
from evaluator.engine.columns import OpenTable
from evaluator.engine.restore import restore_state
from evaluator.engine.state import PartitionState


def row(n: int, rng: random.Random, *, drafts: bool = True) -> list[Any]:
    """A changelog request row; with ``drafts`` a fifth of them interleaved."""
    items = [f"item-{rng.randrange(40)}" for _ in range(rng.randrange(0, 6))]
    attrs = [f"cat-{rng.randrange(3)}" for _ in items] if rng.random() < 0.5 else []
    shadow = [f"item-{rng.randrange(40)}" for _ in range(3)] if rng.random() < 0.3 else []
    rnd = [rng.choice(["topn", "swap"]), rng.randrange(1, 5)] if rng.random() < 0.2 else None
    return [
        f"req-{n}-é",  # not only ASCII: ids are stored as UTF-8
        f"user-{rng.randrange(25)}",
        rng.choice(["a", "b", "c"]),
        1_000 + rng.randrange(500),
        items,
        attrs,
        "ctl" if shadow else "",
        shadow,
        rng.choice(["", "home"]),
        rnd,
        draft([rng.choice("AB") for _ in items], {"A": "x", "B": "y"})
        if drafts and items and rng.random() < 0.2
        else "",
    ]


def request(r: list[Any]) -> OpenRequest:
    rnd = (r[9][0], r[9][1]) if r[9] else None
    return OpenRequest(
        r[0], r[1], r[2], r[3], tuple(r[4]), (), tuple(r[5]), r[6], tuple(r[7]), r[8], rnd, *r[10:]
    )


def small_chunks(monkeypatch: pytest.MonkeyPatch, rows: int, largest: int | None = None) -> None:
    """Chunks of ``rows`` rows merged up to ``largest`` (``FAN``² times that by default):
    a few requests exercise every merge."""
    monkeypatch.setattr(merges, "SMALL_ROWS", rows)
    monkeypatch.setattr(merges, "CHUNK_ROWS", rows * merges.FAN**2 if largest is None else largest)


def check(table: OpenTable, reference: dict[str, OpenRequest], rng: random.Random) -> None:
    assert len(table) == len(reference)
    assert table.as_dict() == reference
    probe = [*rng.sample(sorted(reference), min(20, len(reference))), "req-missing", "req-é"]
    assert table.contains(probe) == [rid in reference for rid in probe]
    assert table.times(probe) == [
        reference[rid].timestamp_ms if rid in reference else None for rid in probe
    ]
    through = 1_000 + rng.randrange(500)
    due = sorted(
        (r for r in reference.values() if r.timestamp_ms <= through),
        key=lambda r: (r.timestamp_ms, r.request_id),
    )
    got, _ = table.due(through)
    assert requests_of(got, table.book.strings) == due
    assert table.count_due(through) == len(due)
    users = [f"user-{rng.randrange(25)}" for _ in range(3)]
    shown = table.of_users(users)
    names = table.book.strings
    mine = sorted(
        (rid, uid, ms, tuple(names[c] for c in items))
        for uid, ms, rid, items in zip(
            shown.user, shown.ms.tolist(), shown.request, shown.items.lists(), strict=True
        )
    )
    assert mine == sorted(
        (r.request_id, r.user_id, r.timestamp_ms, r.items)
        for r in reference.values()
        if r.user_id in users
    )


def request_id(n: int, rng: random.Random, ids: str, batch: int) -> str:
    """A request id of kind ``ids``: text (not only ASCII), a prefix and a UUID (held
    as 16 bytes), or by batch either of those or UUIDs of another prefix."""
    kind = ["text", "uuid", "other"][batch % 3] if ids == "mixed" else ids
    if kind == "text":
        return f"req-{n}-é"
    return f"{'req' if kind == 'uuid' else 'rq'}-{uuid.UUID(int=rng.getrandbits(128))}"


@pytest.mark.parametrize("ids", ["text", "uuid", "mixed"])
@pytest.mark.parametrize("collide", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_open_table_answers_as_a_dict_of_requests(
    seed: int, collide: bool, ids: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random batches of openings and closings (small enough that chunks merge, are
    rewritten and go); with ``collide`` every id hashes alike, so each lookup rests
    on the stored ids; request ids as text, UUIDs, or chunks of both merging."""
    if collide:
        for module in (columns, chunks, segments):
            monkeypatch.setattr(module, "hashes_of", lambda values, n: np.full(n, 7, np.int64))
    small_chunks(monkeypatch, 4)
    rng = random.Random(seed)
    table, reference = OpenTable(), {}
    made = 0
    for number in range(60):
        batch = [row(made + k, rng) for k in range(rng.randrange(0, 30))]
        for k, r in enumerate(batch):
            r[0] = request_id(made + k, rng, ids, number)
        made += len(batch)
        table.append(batch)
        reference.update((r[0], request(r)) for r in batch)
        gone = [*rng.sample(sorted(reference), len(reference) // 3), "req-never"]
        if rng.random() < 0.5:  # as finalisation does: the due, closed where found
            due, places = table.due(1_000 + rng.randrange(500))
            table.close(places)
            for rid in due.request_id:
                del reference[rid]
            check(table, reference, rng)
        table.remove(gone)
        for rid in gone:
            reference.pop(rid, None)
        check(table, reference, rng)
    assert len(table.chunks) < made // 10  # merged and dropped, not one per batch


def test_an_index_filter_never_misses_a_hash_it_holds() -> None:
    """The bit filter in front of a chunk's binary search: every hash held passes it, and
    most others do not (about 8 bits a row: under one in five pass)."""
    rng = np.random.default_rng(5)
    for n in (0, 1, 7, 1_000, 20_000):
        held = rng.integers(-(2**63), 2**63 - 1, size=n, dtype=np.int64)
        index = chunks.Index.of(held)
        assert index.may_hold(held).all()
        others = rng.integers(-(2**63), 2**63 - 1, size=5_000, dtype=np.int64)
        assert index.may_hold(others).mean() < 0.2


def test_the_codebook_keeps_only_the_codes_in_use_past_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A catalog that churns does not grow the codebook without bound: past
    ``RECODE_AT`` entries it is rebuilt from the codes of the open requests."""
    monkeypatch.setattr(columns, "RECODE_AT", 50)
    table = OpenTable()
    table._recode_at = 50
    rng = random.Random(3)
    reference: dict[str, OpenRequest] = {}
    for n in range(40):  # every batch shows new items; the previous batch closes
        batch = [
            [f"r{n}-{k}", "u", "a", n, [f"i{n}-{k}-{j}" for j in range(3)], [], "", [], "", None]
            for k in range(4)
        ]
        table.append(batch)
        reference.update((r[0], request(r)) for r in batch)
        closing = [rid for rid in reference if not rid.startswith(f"r{n}-")]
        table.remove(closing)
        for rid in closing:
            del reference[rid]
        assert table.as_dict() == reference
        check(table, reference, rng)
    assert len(table.book) < 100  # 40 batches of 12 new items each went through it


def test_codebook_codes_each_string_once() -> None:
    book = Codebook()
    assert book.encode(["x", "y", "x"]).tolist() == [0, 1, 0]
    assert book.encode(["y", "z"]).tolist() == [1, 2]
    assert book.strings == ["x", "y", "z"] and len(book) == 3


def test_the_codebook_agrees_with_a_dict_through_growth() -> None:
    """Batches of strings (repeats within and across batches, non-ASCII, empty, NUL),
    through many doublings of the hash table: each string's code is the order of its
    first appearance, ``find`` gives -1 for strings never added and adds nothing."""
    rng = random.Random(8)
    book = Codebook()
    reference: dict[str, int] = {}
    alphabet = ["a", "b", "é", "\x00", "7", "ü", "-"]
    for _ in range(300):
        batch = [
            "".join(rng.choices(alphabet, k=rng.randrange(0, 6)))
            for _ in range(rng.randrange(0, 80))
        ]
        absent = [s + "!" for s in batch[:5] if s + "!" not in reference]
        assert book.find(absent).tolist() == [-1] * len(absent)
        want = [reference.setdefault(s, len(reference)) for s in batch]
        assert book.encode(batch).tolist() == want
        assert book.find(batch).tolist() == want
    assert book.strings == list(reference) and len(reference) > 3_000
    rebuilt = Codebook(book.strings)
    assert rebuilt.find(list(reference)).tolist() == list(range(len(reference)))


def test_codes_past_sixteen_bits_widen_the_chunks_that_need_them() -> None:
    """Codes are 16 bits while the codebook is small, 32 once it is not; chunks of
    both kinds merge and read back alike."""
    table = OpenTable()
    small = [["r0", "u", "a", 1, ["x", "y"], ["c", "c"], "", [], "", None]]
    wide = [["r1", "u", "a", 2, [f"i{n}" for n in range(70_000)], [], "", [], "", None]]
    last = [["r2", "u", "b", 3, ["i69999", "x"], [], "", [], "", ["topn", 2]]]
    for batch in (small, wide, last):
        table.append(batch)
    assert [c.items.flat.dtype for c in table.chunks] != [np.uint16] * len(table.chunks)
    assert table.as_dict() == {r[0]: request(r) for r in small + wide + last}


def format_2(chunk: chunks.Chunk) -> bytes:
    """A chunk as an earlier release wrote it (segment format 2: no dictionaries, four
    label columns)."""
    base = int(chunk.ts.min())
    fixed = [chunk.ts - base, chunk.labels[:, :4], chunk.randomized]
    return segments._encode(
        [
            2,
            [base, *(part for v in fixed for part in segments._packed(chunks.fewest(v)))],
            [
                segments._ids(chunk.ids),
                segments._ids(chunk.users),
                *(
                    segments._lengths(c)
                    for c in (chunk.items, chunk.attribute_codes(), chunk.shadow)
                ),
            ],
        ]
    )


def test_a_partition_written_by_the_previous_release_restores_its_open_requests() -> None:
    """A partition's changelog whose request segments are in format 2 (as the previous
    release left it) restores to the same open requests as the same changelog in
    this format, and to what was opened: nothing dropped or changed on upgrade."""
    rng = random.Random(11)
    state = PartitionState()
    rows = [row(n, rng, drafts=False) for n in range(500)]
    state.add_requests(rows, 60_000)
    changes = {k: v for k, v in state.flush().items() if v is not None}
    assert any(k.startswith("t:") for k in changes)
    previous = {
        k: format_2(segments.decode_segment(v)) if k.startswith("t:") else v
        for k, v in changes.items()
    }
    assert previous != changes  # the previous release's bytes differ
    reference = {r[0]: request(r) for r in rows}
    for changelog in (previous, changes):
        restored = restore_state(changelog.items(), lambda t: t + 60_000, 3)
        assert restored.requests.as_dict() == reference


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_a_segment_decodes_to_its_chunk(version: int) -> None:
    """A chunk written as a changelog segment (this format, with interleaving drafts, or
    those of earlier releases: 3, four label columns; 2, without dictionaries; 1, fixed
    columns as held in memory) decodes to the same rows."""
    rng = random.Random(version)
    book = Codebook()
    rows = [row(n, rng, drafts=version == 4) for n in range(300)]
    for r in rows:  # epoch milliseconds, spanning more than 16 bits
        r[3] = 1_700_000_000_000 + 1_000 * r[3]
    chunk = chunks.Chunk.of(rows, book)
    codes = [chunk.ids, chunk.users, chunk.items, chunk.attribute_codes(), chunk.shadow]
    if version == 4:
        assert any(r[10] for r in rows)
        raw = segments.encode_segment(chunk)
    elif version == 3:
        full = chunk.labels
        chunk.labels = full[:, :4]
        written = segments._decode(segments.encode_segment(chunk))
        chunk.labels = full
        raw = segments._encode([3, *written[1:]])
    elif version == 2:
        raw = format_2(chunk)
    else:
        fixed = [chunk.ts, chunk.labels[:, :4], chunk.randomized]
        raw = segments._encode(
            [
                1,
                [part for values in fixed for part in segments._packed(values)],
                [segments._lengths(c) for c in codes],
            ]
        )
    decoded = segments.decode_segment(raw)
    everything = np.arange(len(rows))
    assert decoded.ts.dtype == np.int64
    got = decoded.requests(everything, book.strings)
    assert got == chunk.requests(everything, book.strings)
    assert [r.request_id for r in got] == [r[0] for r in rows]


@pytest.mark.parametrize("catalog", [1_000, 70_000])
def test_a_column_of_few_distinct_codes_is_stored_through_a_dictionary(catalog: int) -> None:
    """Attribute codes of a few categories among many codes (16-bit codes, or 32-bit
    past 65,535 strings) take a byte each in the segment; items take two bytes, through
    the dictionary when their codes are 32-bit; both read back exactly."""
    rng = random.Random(catalog)
    book = Codebook([f"item-{n}" for n in range(catalog)])
    rows = []
    for n in range(2_000):
        items = list(dict.fromkeys(f"item-{rng.randrange(catalog)}" for _ in range(10)))
        attributes = [f"cat-{rng.randrange(12)}" for _ in items]
        rows.append([f"r{n}", f"u{n}", "a", n, items, attributes, "", [], "", None])
    chunk = chunks.Chunk.of(rows, book)
    attributes = chunk.attribute_codes()
    values = attributes.flat.size
    assert attributes.flat.dtype.itemsize == (2 if catalog < 2**15 else 4)
    assert chunk.attributes.flat.dtype.itemsize == 1  # in memory too: a byte each
    stored = segments._codes(attributes)
    assert stored[0] == segments.DICTIONARY and len(stored[-1]) == values  # a byte each
    items = segments._codes(chunk.items)  # ~1,000 distinct: through a dictionary if 32-bit
    assert (items[0] == segments.DICTIONARY) == (catalog >= 2**15)
    decoded = segments.decode_segment(segments.encode_segment(chunk))
    assert decoded.attribute_codes().flat.dtype == attributes.flat.dtype
    assert decoded.attributes.flat.dtype.itemsize == 1  # read back as held
    everything = np.arange(len(rows))
    assert decoded.requests(everything, book.strings) == chunk.requests(everything, book.strings)


@pytest.mark.parametrize(
    ("ids", "packed"),
    [
        ([str(uuid.UUID(int=random.Random(n).getrandbits(128))) for n in range(50)], True),
        ([f"req-{uuid.UUID(int=n)}" for n in range(50)], True),  # one prefix
        ([f"réq-{uuid.UUID(int=n)}" for n in range(50)], True),  # not ASCII
        ([f"req-{uuid.UUID(int=n)}" for n in range(49)] + [f"rex-{uuid.UUID(int=1)}"], False),
        ([str(uuid.UUID(int=n)).upper() for n in range(50)], False),  # not canonical
        ([*(str(uuid.UUID(int=n)) for n in range(49)), "not-a-uuid"], False),
        ([str(uuid.UUID(int=n)).replace("-", "x", 1) for n in range(50)], False),
    ],
)
def test_uuid_ids_are_stored_in_16_bytes_and_read_back_exactly(
    ids: list[str], packed: bool
) -> None:
    rng = random.Random(1)
    rows = [row(n, rng) for n in range(len(ids))]
    for r, rid in zip(rows, ids, strict=True):
        r[0] = r[1] = rid
    chunk = chunks.Chunk.of(rows, Codebook())
    raw = segments.encode_segment(chunk)
    everything = np.arange(len(ids))
    decoded = segments.decode_segment(raw)
    assert decoded.ids.texts(everything) == ids == decoded.users.texts(everything)
    for held in (chunk, decoded, chunks.Chunk.concat([chunk.take(everything[::-1]), decoded])):
        # in memory too: 16 bytes an id, read back as the ids
        assert isinstance(held.ids, uuids.UuidIds) == packed
        assert held.ids.texts(everything[:3]) == held.users.texts(everything[:3])
        assert held.ids.texts(everything[:0]) == []
    assert chunk.ids.texts(everything) == ids
    assert chunk.ids.lengths().tolist() == [len(i.encode()) for i in ids]
    assert bytes(chunk.ids.flat) == "".join(ids).encode()
    none = chunk.take(everything[:0])  # no rows: written as bytes, as ever
    assert segments._ids(none.ids) == segments._lengths(chunks._texts([]))
    columns = msgspec.msgpack.decode(raw)[2]
    lengths = [len(columns[0][-1]), len(columns[1][-1])]  # the UUIDs' bytes, or the ids'
    assert lengths == [16 * len(ids) if packed else len("".join(ids))] * 2


def test_merged_and_taken_indexes_equal_indexes_built_afresh() -> None:
    """Chunks are merged and rewritten without sorting their hashes again: the result
    equals the index sorted afresh (keys, rows and filter), repeated hashes included."""
    rng = np.random.default_rng(9)
    for a_size, b_size in ((0, 5), (5, 0), (1, 1), (300, 700), (4_000, 4_000)):
        a = rng.integers(0, 50, size=a_size, dtype=np.int64) * 7919  # many repeats
        b = rng.integers(0, 50, size=b_size, dtype=np.int64) * 7919
        fresh = chunks.Index.of(np.concatenate([a, b]))
        merged = chunks.Index.merged([(a_size, chunks.Index.of(a)), (b_size, chunks.Index.of(b))])
        assert np.array_equal(merged.keys, fresh.keys)
        assert np.array_equal(merged.rows, fresh.rows)
        assert np.array_equal(merged.bits, fresh.bits)
        size = a_size + b_size
        kept = np.flatnonzero(rng.random(size) < 0.4)
        taken = fresh.take(kept, size)
        again = chunks.Index.of(fresh.per_row()[kept])
        assert np.array_equal(taken.keys, again.keys)
        assert np.array_equal(taken.rows, again.rows)
        assert np.array_equal(taken.bits, again.bits)


def test_scans_by_time_pass_over_chunks_only_outside_their_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chunks of disjoint time spans (as arrival order leaves them): ``due``, ``peek``
    and ``count_due`` at every boundary (a chunk's first and last time, and one either
    side) find exactly the requests of their span."""
    small_chunks(monkeypatch, 16, 16)
    rng = random.Random(3)
    table, times = OpenTable(), {}
    for n in range(0, 120, 6):  # batches of 6 consecutive times: chunks of 6 to 16 rows
        batch = [row(n + k, rng) for k in range(6)]
        for k, r in enumerate(batch):
            r[3] = 1_000 + n + k
            times[r[0]] = r[3]
        table.append(batch)
    assert len(table.chunks) > 3
    bounds = sorted(
        {t + d for c in table.chunks for t in (c.first_ms, c.last_ms) for d in (-1, 0, 1)}
    )
    for through in bounds:
        want = {rid for rid, t in times.items() if t <= through}
        assert set(table.due(through)[0].request_id) == want
        assert table.count_due(through) == len(want)
        for after in bounds:
            peeked = {rid for rid, t in times.items() if after < t <= through}
            assert set(table.peek(after, through).request_id) == peeked


def test_a_new_owner_adds_many_chunks_at_once_as_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A load's chunks (some rows already final) go in together: the same open requests
    as adding them one by one, in chunks of at most ``CHUNK_ROWS`` live rows."""
    small_chunks(monkeypatch, 16, 16)
    rng = random.Random(4)
    book = Codebook()
    parts, made = [], 0
    for _ in range(30):
        batch = [row(made + k, rng) for k in range(rng.randrange(1, 12))]
        made += len(batch)
        chunk = chunks.Chunk.of(batch, book)
        chunk.alive &= np.array([rng.random() < 0.7 for _ in batch], dtype=np.bool_)
        chunk.live = int(chunk.alive.sum())
        parts.append(chunk)
    together, one_by_one = OpenTable(book), OpenTable(book)
    together.add_many(parts)
    for chunk in parts:
        one_by_one.add(chunk)
    assert together.as_dict() == one_by_one.as_dict()
    assert len(together) == sum(c.live for c in parts)
    assert all(c.live == c.size <= 16 for c in together.chunks)
    assert len(together.chunks) <= -(-len(together) // 8) + 1  # groups nearly full


def test_chunks_grow_by_sizes_so_a_long_window_keeps_few(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many small batches, none closed: new rows merge binary-counter style up to
    ``SMALL_ROWS``, then ``FAN`` chunks of a size into one, up to ``CHUNK_ROWS``; the
    chunks stay few (a handful per size, the rest full) and the table answers as one
    built at once."""
    small_chunks(monkeypatch, 4)
    rng = random.Random(6)
    table, made = OpenTable(), 0
    while made < 2_000:
        batch = [row(made + k, rng) for k in range(rng.randrange(1, 4))]
        made += len(batch)
        table.append(batch)
    sizes = [c.live for c in table.chunks]
    full = sum(size >= merges.CHUNK_ROWS // 2 for size in sizes)
    assert full >= 2_000 // (merges.CHUNK_ROWS * 2)  # the largest size is reached
    assert len(sizes) - full <= 2 * (merges.FAN - 1) + 4  # a few of each smaller size
    assert max(sizes) < merges.CHUNK_ROWS * 2
    reference = {r.request_id: r for r in table.all()}
    assert len(reference) == made
    ids = list(reference)
    assert table.contains(ids) == [True] * made


def test_a_chunk_holds_its_small_columns_in_their_fewest_bytes() -> None:
    """A large catalog's item codes take four bytes, but a chunk's labels (codes of the
    few strings met before the catalog: variants, contexts) take two, its randomisation
    parameters one, its attribute values share the items' row bounds and an empty
    shadow column holds no bounds; merged, taken and written as a segment, it reads
    back the same requests."""
    book = Codebook(["", "a", "b", "home", "topn", *(f"item-{n}" for n in range(70_000))])
    rng = random.Random(3)
    rows = []
    for n in range(1_000):
        items = [f"item-{rng.randrange(70_000)}" for _ in range(5)]
        attributes = [f"cat-{rng.randrange(4)}" for _ in items]
        rnd = ["topn", 3] if n % 7 == 0 else None
        rows.append([f"r{n}", f"u{n % 90}", "ab"[n % 2], n, items, attributes, "", [], "home", rnd])
    chunk = chunks.Chunk.of(rows, book)
    assert chunk.items.flat.dtype.itemsize == 4
    assert chunk.labels.dtype == np.int8 and chunk.randomized.dtype == np.int8
    assert chunk.attributes.off is chunk.items.off
    assert chunk.shadow.off.strides == (0,)
    arrays = [chunk.ts, chunk.labels, chunk.randomized, chunk.alive, chunk.items.off]
    arrays += [part.flat for part in (chunk.ids, chunk.users, chunk.items, chunk.attributes)]
    arrays += [chunk.ids.off, chunk.users.off, chunk.attribute_values]
    indexes = (chunk.by_id, chunk.by_user)
    arrays += [getattr(i, n) for i in indexes for n in ("keys", "rows", "bits")]
    assert chunk.nbytes == sum(a.nbytes for a in arrays if a is not None)
    everything = np.arange(len(rows))
    expected = [request(r) for r in rows]
    half = np.arange(0, len(rows), 2)
    merged = chunks.Chunk.concat([chunk.take(half), chunk.take(half + 1)])
    order = np.concatenate([half, half + 1])
    assert merged.attributes.off is merged.items.off and merged.labels.dtype == np.int8
    assert merged.requests(everything, book.strings) == [expected[i] for i in order]
    decoded = segments.decode_segment(segments.encode_segment(chunk))
    assert decoded.labels.dtype == np.int8 and decoded.attributes.off is decoded.items.off
    assert decoded.requests(everything, book.strings) == expected
