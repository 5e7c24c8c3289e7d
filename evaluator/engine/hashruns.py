"""Many 64-bit hashes with a deadline each, looked up a batch at a time: the finalised
markers' in-memory form (:mod:`evaluator.engine.markers`). Pure: no I/O.

A partition holds its markers for ``engine.finalised_ttl`` (6 h) of data time:
millions of hashes (5.4 million requests, and as many applied interactions, at 250
requests per second). A lookup must cost the same whatever that number, since every
impression and many interactions look theirs up. Hashes come in small sorted runs
and go through three levels:

- **small runs**, merged binary-counter style up to :data:`SMALL_ROWS` entries (a
  few hundred KB: searched in cache);
- **the middle run**, into which the small runs are merged (a linear merge) once they
  hold :data:`SMALL_ROWS` between them;
- **the base run**, into which the middle one is merged once it holds an eighth of
  the base (and at least :data:`BASE_ROWS`): each hash is copied about eight times
  in all, and expired entries are dropped at each merge.

The middle and base runs carry a directory of their hashes' top bits (about eight
entries a bucket): a lookup reads the directory and then binary-searches its bucket
in a few rounds over the whole batch, a few cache lines a hash. Searching sorted
runs of hundreds of thousands of entries each, as an earlier version did, cost 5-7
µs a hash with ten million markers held (forty runs), more than the rest of the
engine's work on an event. About 17 bytes a marker: 8 for the hash, 8 for the
deadline, under one for the directory, and expired markers wait for the next merge
(or for their whole run to expire).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

SMALL_ROWS = 1 << 16
"""Entries of the small runs together before they are merged into the middle run."""
BASE_ROWS = 1 << 18
"""The middle run joins the base run once it holds this many entries, or an eighth of
the base if more."""
BUCKET_BITS = 3
"""About 2**BUCKET_BITS entries per directory bucket."""
NONE_MS = -(2**63)
"""The deadline found for a hash that is not held."""


@dataclass(slots=True)
class Run:
    """Sorted unique hashes with the largest deadline of each."""

    keys: U64
    deadlines: I64
    last: int
    """The largest deadline: the run expires whole after it."""

    @classmethod
    def of(cls, keys: U64, deadlines: I64, before_ms: int) -> Run | None:
        """The entries at or after ``before_ms``, sorted (None when none is)."""
        order = np.argsort(keys, kind="stable")
        return cls.sorted(keys[order], deadlines[order], before_ms)

    @classmethod
    def sorted(cls, keys: U64, deadlines: I64, before_ms: int) -> Run | None:
        """:meth:`of` for hashes already in order (repeats allowed)."""
        keep = deadlines >= before_ms
        if not keep.all():
            keys, deadlines = keys[keep], deadlines[keep]
        if not keys.size:
            return None
        repeated = keys[1:] == keys[:-1]
        if repeated.any():  # a hash held twice (finalised again): its largest deadline
            first = np.flatnonzero(np.concatenate([[True], ~repeated]))
            keys, deadlines = keys[first], np.maximum.reduceat(deadlines, first)
        return cls(keys, deadlines, int(deadlines.max()))

    def merged(self, other: Run, before_ms: int) -> Run | None:
        """This run and ``other`` as one, in linear time (``other`` inserted)."""
        at = np.searchsorted(self.keys, other.keys)
        return Run.sorted(
            np.insert(self.keys, at, other.keys),
            np.insert(self.deadlines, at, other.deadlines),
            before_ms,
        )

    def find(self, keys: U64, found: I64) -> None:
        """Raise ``found`` to the deadline of each of ``keys`` held."""
        at = np.searchsorted(self.keys, keys)
        np.minimum(at, self.keys.size - 1, out=at)
        hit = self.keys[at] == keys
        np.maximum(found, np.where(hit, self.deadlines[at], NONE_MS), out=found)

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.deadlines.nbytes)


@dataclass(slots=True)
class Indexed:
    """A large run and a directory of its hashes' top :attr:`bits` bits: bucket ``b``'s
    entries are ``starts[b]:starts[b + 1]``."""

    run: Run
    bits: int
    starts: I64

    @classmethod
    def of(cls, run: Run) -> Indexed:
        return cls(run, *directory(run.keys))

    def find(self, keys: U64, found: I64) -> None:
        """Raise ``found`` to the deadline of each of ``keys`` held."""
        at, hit = search(self.run.keys, self.bits, self.starts, keys)
        np.maximum(found, np.where(hit, self.run.deadlines[at], NONE_MS), out=found)

    @property
    def nbytes(self) -> int:
        return self.run.nbytes + int(self.starts.nbytes)


def directory(held: U64) -> tuple[int, I64]:
    """A directory of sorted hashes' top bits (about 2**BUCKET_BITS entries a bucket):
    the number of bits, and where each bucket starts (one more entry: the end)."""
    bits = max(0, held.size.bit_length() - 1 - BUCKET_BITS)
    if not bits:
        return 0, np.array([0, held.size], dtype=np.int64)
    counts = np.bincount(_buckets(held, bits), minlength=1 << bits)
    starts = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    return bits, starts


def search(held: U64, bits: int, starts: I64, keys: U64) -> tuple[I64, npt.NDArray[np.bool_]]:
    """Each key's position in ``held`` (sorted, not empty, with its :func:`directory`)
    and whether it is there: a binary search in each key's bucket, a round at a time
    over the keys still searching."""
    bucket = _buckets(keys, bits)
    lo, hi = starts[bucket], starts[bucket + 1]
    todo = np.flatnonzero(lo < hi)
    while todo.size:
        a, b = lo[todo], hi[todo]
        mid = (a + b) >> 1
        right = held[mid] < keys[todo]
        lo[todo] = np.where(right, mid + 1, a)
        hi[todo] = np.where(right, b, mid)
        todo = todo[lo[todo] < hi[todo]]
    at = np.minimum(lo, held.size - 1)
    return at, held[at] == keys


def _buckets(keys: U64, bits: int) -> I64:
    if not bits:
        return np.zeros(keys.size, dtype=np.int64)
    return (keys >> np.uint64(64 - bits)).astype(np.int64)


@dataclass(slots=True)
class HashRuns:
    """Hashes with deadlines in three levels (see the module docstring)."""

    runs: list[Run] = field(default_factory=list)
    """The small runs, largest first."""
    middle: Indexed | None = None
    base: Indexed | None = None

    def add(self, keys: U64, deadlines: I64, before_ms: int) -> None:
        """Hold the hashes (a hash held already keeps the larger deadline); entries
        before ``before_ms`` are dropped."""
        run = Run.of(keys, deadlines, before_ms)
        if run is None:
            return
        runs = self.runs
        runs.append(run)
        while len(runs) >= 2 and runs[-2].keys.size <= runs[-1].keys.size:
            merged = runs[-2].merged(runs[-1], before_ms)
            runs[-2:] = [merged] if merged is not None else []
        if sum(r.keys.size for r in runs) >= SMALL_ROWS:
            self._settle(before_ms)

    def _settle(self, before_ms: int) -> None:
        """Merge the small runs into the middle run, and that into the base when it has
        grown to an eighth of it."""
        small: Run | None = None
        for run in self.runs:  # small ones first: the middle run is copied once
            small = run if small is None else small.merged(run, before_ms)
        self.runs = []
        middle = self.middle.run if self.middle is not None else None
        if small is not None:
            middle = small if middle is None else middle.merged(small, before_ms)
        base = self.base.run if self.base is not None else None
        if middle is not None and middle.keys.size >= max(
            BASE_ROWS, 0 if base is None else base.keys.size >> 3
        ):
            base = middle if base is None else base.merged(middle, before_ms)
            self.base = None if base is None else Indexed.of(base)
            middle = None
        self.middle = None if middle is None else Indexed.of(middle)

    def find(self, keys: U64) -> I64:
        """Each hash's largest deadline held (:data:`NONE_MS`: none)."""
        found = np.full(keys.size, NONE_MS, dtype=np.int64)
        if not keys.size:
            return found
        for level in (self.base, self.middle):
            if level is not None:
                level.find(keys, found)
        for run in self.runs:
            run.find(keys, found)
        return found

    def expire(self, before_ms: int) -> None:
        """Drop every run whose entries have all expired (the others keep theirs until
        they are merged)."""
        self.runs = [run for run in self.runs if run.last >= before_ms]
        if self.middle is not None and self.middle.run.last < before_ms:
            self.middle = None
        if self.base is not None and self.base.run.last < before_ms:
            self.base = None

    def _all(self) -> list[Run]:
        return [level.run for level in (self.base, self.middle) if level is not None] + self.runs

    def live(self, before_ms: int) -> dict[int, int]:
        """Hash -> deadline of the entries at or after ``before_ms``."""
        out: dict[int, int] = {}
        for run in self._all():
            for key, deadline in zip(run.keys.tolist(), run.deadlines.tolist(), strict=True):
                if deadline >= before_ms and deadline > out.get(key, NONE_MS):
                    out[key] = deadline
        return out

    def __len__(self) -> int:
        return sum(run.keys.size for run in self._all())

    @property
    def nbytes(self) -> int:
        levels = [level.nbytes for level in (self.base, self.middle) if level is not None]
        return sum(levels) + sum(run.nbytes for run in self.runs)


__all__ = ["NONE_MS", "HashRuns", "Run", "directory", "search"]
