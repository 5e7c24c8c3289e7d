"""Each experiment's exposed users, as a set of keyed 64-bit hashes. Pure: no I/O.

The sample-ratio test counts every user once, for the variant of their first
impression in the experiment, for the experiment's whole life (a user counted again
later would overdisperse the test). The partition that owns a user keeps, per
experiment, the 64-bit hash of each user exposed so far, keyed with the partition's
random seed (the markers' ``k:``, so nobody can choose ids that collide): 8 bytes a
user in the process and in the changelog. Two of 10 million users of one
experiment share a hash with a probability of about 1 in 370,000; the second is
then not counted.

In memory a set is sorted runs of hashes, looked up a batch at a time; the users
added since the last checkpoint wait in a Python set. At each flush those become a
run of their own, written as one ``v:<n>`` field (the experiment's name and the
hash bytes), and runs are merged binary-counter style, up to :data:`RUN_ROWS`
entries: the merged run is written as a new field and the fields it replaces are
deleted in the same checkpoint, so a partition holds a logarithmic number of fields
per experiment and each hash is rewritten a logarithmic number of times. An
experiment with an ``end`` drops its fields once the data passes the end by the
join horizon.

A run of more than half :data:`RUN_ROWS` is never merged again. Its hashes move into
the set's *base*: one sorted array with a directory of its top bits
(:func:`evaluator.engine.hashruns.directory`), and the run keeps only its field's
name. An experiment that runs for months (``default`` never ends) holds millions of
users in a partition: searching each of their runs cost 0.9 µs a user at 5 million
(7 runs), searching the base costs about a third of that.

Versions before this one kept one ``e:<experiment US user>`` field per user (for
``ab.exposure_ttl`` of data time): they are read, hashed, written in the next
``v:`` segment and deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from evaluator.core.sketch import hash_strings
from evaluator.engine.hashruns import directory, search
from evaluator.engine.markers import Changelog
from evaluator.engine.records import encode

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

EXPOSURE_FORMAT = 1
"""The version of a ``v:`` field's layout (its first element)."""
RUN_ROWS = 1 << 20
"""Runs stop merging at this size (8 MB of hashes in one field)."""


@dataclass(slots=True)
class Run:
    """Sorted unique hashes, stored as the changelog field :attr:`name`."""

    name: str
    keys: U64

    def holds(self, ordered: U64) -> npt.NDArray[np.bool_]:
        """Whether each of the (sorted) hashes is in the run."""
        at = np.searchsorted(self.keys, ordered)
        np.minimum(at, self.keys.size - 1, out=at)
        return self.keys[at] == ordered  # type: ignore[no-any-return]


@dataclass(slots=True)
class UserSet:
    """One experiment's exposed users (see the module docstring)."""

    runs: list[Run] = field(default_factory=list)
    """The runs that may still be merged, searched one by one."""
    pending: set[int] = field(default_factory=set)
    """Hashes added since the last flush."""
    frozen: list[str] = field(default_factory=list)
    """The field names of the runs too large to merge again: their hashes are in
    :attr:`base`."""
    base: U64 = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    bits: int = 0
    starts: I64 = field(default_factory=lambda: np.zeros(2, dtype=np.int64))
    """The base's directory (:func:`~evaluator.engine.hashruns.directory`)."""

    def holds(self, keys: U64) -> npt.NDArray[np.bool_]:
        """Whether each hash is in the set."""
        out = np.zeros(keys.size, dtype=np.bool_)
        if (self.runs or self.base.size) and keys.size:
            order = np.argsort(keys)
            ordered = keys[order]
            found = np.zeros(keys.size, dtype=np.bool_)
            if self.base.size:
                found |= search(self.base, self.bits, self.starts, ordered)[1]
            for run in self.runs:
                found |= run.holds(ordered)
            out[order] = found
        if self.pending:
            pending = self.pending
            out |= np.fromiter(
                (k in pending for k in keys.tolist()), dtype=np.bool_, count=keys.size
            )
        return out

    def freeze(self) -> None:
        """Move the runs too large to merge again into the base (a linear merge: the
        runs hold distinct users), keeping their field names."""
        big = [run for run in self.runs if run.keys.size > RUN_ROWS // 2]
        if not big:
            return
        self.runs = [run for run in self.runs if run.keys.size <= RUN_ROWS // 2]
        for run in big:
            self.base = np.insert(self.base, np.searchsorted(self.base, run.keys), run.keys)
            self.frozen.append(run.name)
        self.bits, self.starts = directory(self.base)

    def names(self) -> list[str]:
        """The set's changelog fields."""
        return self.frozen + [run.name for run in self.runs]

    def __len__(self) -> int:
        return int(self.base.size) + sum(run.keys.size for run in self.runs) + len(self.pending)

    def hashes(self) -> set[int]:
        out = set(self.pending)
        out.update(self.base.tolist())
        for run in self.runs:
            out.update(run.keys.tolist())
        return out

    @property
    def nbytes(self) -> int:
        runs = sum(run.keys.nbytes for run in self.runs)
        return runs + int(self.base.nbytes + self.starts.nbytes)


@dataclass(slots=True, eq=False)
class Exposures:
    """The exposed users of every experiment of one partition."""

    log: Changelog = field(repr=False)
    seed: Callable[[], int] = field(repr=False)
    """The partition's hash seed (the markers')."""
    sets: dict[str, UserSet] = field(default_factory=dict)
    next_segment: int = 0
    legacy: list[tuple[str, str]] = field(default_factory=list)
    """``(experiment, user)`` of older versions' ``e:`` fields, hashed once loaded."""

    def first(self, experiment: str, users: Sequence[str]) -> list[bool]:
        """Record the users exposed to an experiment; True for each one seen for the
        first time (its first occurrence in ``users``, and nowhere before)."""
        if not users:
            return []
        keys = hash_strings(users, self.seed())
        users_set = self.sets.setdefault(experiment, UserSet())
        new = ~users_set.holds(keys)
        out = [False] * len(users)
        pending = users_set.pending
        for n in np.flatnonzero(new).tolist():
            key = int(keys[n])
            if key not in pending:  # not an earlier user of this batch
                pending.add(key)
                out[n] = True
        return out

    def drop(self, experiment: str) -> int:
        """Forget an ended experiment's users (its fields are deleted); how many."""
        gone = self.sets.pop(experiment, None)
        if gone is None:
            return 0
        for name in gone.names():
            self.log.set(name, None)
        return len(gone)

    def pending(self) -> int:
        return sum(len(s.pending) for s in self.sets.values())

    def write(self, out: dict[str, bytes | None]) -> bool:
        """Each experiment's users added since the last flush as a run (one field),
        merged with the runs before it while they are no larger; whether any was."""
        wrote = False
        for experiment, users in self.sets.items():
            if not users.pending:
                continue
            keys = np.array(sorted(users.pending), dtype=np.uint64)
            users.pending = set()
            wrote = True
            runs = users.runs
            runs.append(self._run(experiment, keys, out))
            while len(runs) >= 2 and runs[-2].keys.size <= runs[-1].keys.size:
                a, b = runs[-2], runs[-1]
                if a.keys.size + b.keys.size > RUN_ROWS:
                    break
                merged = np.union1d(a.keys, b.keys)
                runs[-2:] = [self._run(experiment, merged, out)]
                for gone in (a, b):  # created in this flush: never reaches the store
                    if out.get(gone.name) is not None:
                        del out[gone.name]
                    else:
                        out[gone.name] = None
            users.freeze()
        return wrote

    def _run(self, experiment: str, keys: U64, out: dict[str, bytes | None]) -> Run:
        name = f"v:{self.next_segment}"
        self.next_segment += 1
        out[name] = encode([EXPOSURE_FORMAT, experiment, keys.astype("<u8").tobytes()])
        return Run(name, keys)

    def load(self, name: str, value: list[Any]) -> None:
        """A stored ``v:`` field (its decoded msgpack list)."""
        version, experiment, raw = value
        if version != EXPOSURE_FORMAT:
            raise ValueError(f"exposure segment of format {version}, not {EXPOSURE_FORMAT}")
        keys = np.frombuffer(raw, dtype="<u8").astype(np.uint64)
        self.sets.setdefault(experiment, UserSet()).runs.append(Run(name, keys))
        self.next_segment = max(self.next_segment, int(name[2:]) + 1)

    def loaded(self) -> None:
        """After every field is read (the seed known): runs by size, largest first (as
        merging keeps them), and older versions' users hashed into the next segment
        (their ``e:`` fields deleted)."""
        for users in self.sets.values():
            users.runs.sort(key=lambda run: (-run.keys.size, run.name))
            users.freeze()
        by_experiment: dict[str, list[str]] = {}
        for experiment, user in self.legacy:
            by_experiment.setdefault(experiment, []).append(user)
            self.log.set(f"e:{experiment}\x1f{user}", None)
        self.legacy = []
        for experiment, ids in by_experiment.items():
            self.first(experiment, ids)

    def live(self) -> dict[str, set[int]]:
        """Each experiment's hashes: what a state rebuilt from the changelog equals."""
        return {name: users.hashes() for name, users in self.sets.items() if len(users)}

    def __len__(self) -> int:
        return sum(len(s) for s in self.sets.values())

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.sets.values())


__all__ = ["EXPOSURE_FORMAT", "Exposures", "UserSet"]
