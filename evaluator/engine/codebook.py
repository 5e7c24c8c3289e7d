"""A partition's codebook: its open requests' item ids, attribute values and labels as
``int32`` codes, each string kept once. Pure."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import numpy.typing as npt

from evaluator.core.sketch import U64, hash_strings
from evaluator.core.tokens import Spans, hash_spans, string_spans

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]

NONE = -1
"""The code of an absent string (no randomisation; not in the book)."""
ITEM_SEED = int.from_bytes(os.urandom(8), "little")
"""The key of the strings' hashes in this process (:func:`evaluator.core.tokens.hash_spans`):
the live decoder hashes impressions' items with it, and every codebook looks them up
by it. Drawn at random: hashes are not predictable from outside."""


def _keys(values: Sequence[str]) -> I64:
    """The hashes of strings; each distinct one hashed once when most repeat (labels:
    a few variants and contexts over a whole batch)."""
    distinct = dict.fromkeys(values)
    if 2 * len(distinct) >= len(values):
        return hash_spans(string_spans(values), ITEM_SEED)
    keys = hash_spans(string_spans(list(distinct)), ITEM_SEED)
    index = {value: n for n, value in enumerate(distinct)}
    return keys[np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=len(values))]


class Codebook:
    """Strings as ``int32`` codes: one entry per distinct item id, attribute value or
    label of the partition's open requests, each string kept once.

    Looked up a batch at a time through an open-addressing table of the strings'
    64-bit hashes keyed by :data:`ITEM_SEED` (:func:`~evaluator.core.tokens.hash_spans`
    of their UTF-8 bytes), probed with numpy: a dict probe per string compares it with
    the stored key, a memory access that misses the cache on a large catalog (~300 ns
    a string inside the engine); the table's probes are independent array reads, and
    the live decoder hashes a poll's items without making strings of them
    (:meth:`encode_spans`). Two distinct strings of one partition's codebook share a
    hash with a probability of about 1 in 150 million for 500,000 strings (they would
    then share a code); strings of at most 8 bytes and equal length never do.
    """

    __slots__ = ("_hashed", "_hashes", "_keys", "_mask", "_slots", "strings")

    def __init__(self, strings: Iterable[str] = ()) -> None:
        self.strings: list[str] = []
        self._hashes = np.zeros(0, dtype=np.uint64)
        self._hashed = 0
        self._mask = 1023
        self._keys = np.zeros(self._mask + 1, dtype=np.int64)
        self._slots = np.full(self._mask + 1, NONE, dtype=np.int32)
        """The code held at each slot of the table (-1: empty)."""
        self.encode(list(strings))

    def hashes(self) -> U64:
        """:func:`~evaluator.core.sketch.hash_strings` of every string, code-indexed
        (each string hashed once; the array returned stays valid as strings are added)."""
        n = len(self.strings)
        if self._hashed < n:
            if self._hashes.size < n:  # grown by half again: amortised copies
                grown = np.zeros(max(n, self._hashes.size * 3 // 2), dtype=np.uint64)
                grown[: self._hashed] = self._hashes[: self._hashed]
                self._hashes = grown
            self._hashes[self._hashed : n] = hash_strings(self.strings[self._hashed : n])
            self._hashed = n
        return self._hashes[:n]

    def _find(self, keys: I64) -> I32:
        """The code of each hash (-1: none): linear probing, all keys a round at once."""
        out = np.full(keys.size, NONE, dtype=np.int32)
        mask, table, slots = self._mask, self._keys, self._slots
        slot = keys & mask
        todo = np.arange(keys.size)
        while todo.size:
            at = slot[todo]
            code = slots[at]
            used = code != NONE
            hit = used & (table[at] == keys[todo])
            out[todo[hit]] = code[hit]
            more = used & ~hit
            todo = todo[more]
            slot[todo] = (at[more] + 1) & mask
        return out

    def find(self, values: Sequence[str]) -> I32:
        """The code of each string, -1 where it has none (nothing is added)."""
        return self._find(_keys(values))

    def code(self, value: str) -> int:
        return int(self.encode([value])[0])

    def encode(self, values: Sequence[str]) -> I32:
        """The codes of ``values`` (new ones are added, in order of first appearance)."""
        return self._encode(_keys(values), lambda new: [values[i] for i in new.tolist()])

    def encode_spans(self, spans: Spans) -> I32:
        """The codes of strings as hashed spans (with ``ITEM_SEED``; new ones are added,
        in order of first appearance): only the new ones become Python strings."""
        assert spans.key is not None
        return self._encode(spans.key, spans.texts)

    def _encode(self, keys: I64, texts: Callable[[I64], list[str]]) -> I32:
        """The codes of the strings of ``keys``; ``texts`` gives the strings at the
        given indexes (asked for the new ones only)."""
        codes = self._find(keys)
        missing = np.flatnonzero(codes == NONE)
        if missing.size:
            _, first, inverse = np.unique(keys[missing], return_index=True, return_inverse=True)
            order = np.argsort(first)  # each new string once, in order of first appearance
            new = missing[first[order]]
            start = len(self.strings)
            self.strings += texts(new)
            code = np.empty(first.size, dtype=np.int32)  # of each distinct new hash
            code[order] = np.arange(start, start + first.size, dtype=np.int32)
            self._insert(keys[new], code[order])
            codes[missing] = code[inverse.reshape(-1)]
        return codes

    def _insert(self, keys: I64, codes: I32) -> None:
        """Add hashes not held yet (distinct), growing the table past half full."""
        if 2 * (len(self.strings)) > self._mask + 1:
            size = self._mask + 1
            while 2 * len(self.strings) > size:
                size *= 2
            held = np.flatnonzero(self._slots != NONE)
            old_keys, old_codes = self._keys[held], self._slots[held]
            self._mask = size - 1
            self._keys = np.zeros(size, dtype=np.int64)
            self._slots = np.full(size, NONE, dtype=np.int32)
            keys, codes = np.concatenate([old_keys, keys]), np.concatenate([old_codes, codes])
        mask = self._mask
        slot = keys & mask
        while keys.size:  # each round places, per free slot, the first key probing it
            free = self._slots[slot] == NONE
            _, first = np.unique(slot[free], return_index=True)
            placed = np.flatnonzero(free)[first]
            self._keys[slot[placed]] = keys[placed]
            self._slots[slot[placed]] = codes[placed]
            rest = np.ones(keys.size, dtype=np.bool_)
            rest[placed] = False
            keys, codes, slot = keys[rest], codes[rest], (slot[rest] + 1) & mask

    def __len__(self) -> int:
        return len(self.strings)


__all__ = ["ITEM_SEED", "NONE", "Codebook"]
