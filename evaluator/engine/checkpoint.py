"""What a partition's owner writes to, and reads back from, the store (plain records)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from evaluator.core.finalise import Finalised
from evaluator.core.regression import HistoryKey
from evaluator.engine.state import Changes


@dataclass(slots=True)
class Checkpoint:
    """A partition as stored: the owner's epoch, the changelog fields of its join state,
    and how far it had consumed each input."""

    epoch: int
    seq: int = 0
    """Checkpoints written since the partition's state began: the next write must
    follow it, so a store that lost writes (a Redis restart) is noticed."""
    fields: list[tuple[str, bytes]] = field(default_factory=list)
    offsets: dict[str, int] = field(default_factory=dict)
    """Input (``impressions``, ``interactions`` ...) -> next offset to consume."""
    times: dict[str, int] = field(default_factory=dict)
    """Input -> largest event time consumed from it."""
    watermark_ms: int | None = None


@dataclass(slots=True)
class Delta:
    """One batch's effect on a partition, written atomically with its offsets."""

    changes: Changes
    counters: dict[str, int]
    offsets: dict[str, int]
    times: dict[str, int]
    watermark_ms: int | None
    open_requests: int
    readout_ms: int | None
    """Event time the readout may show this partition at: its watermark, but never past
    its data (an idle partition's watermark follows the wall clock)."""
    finalised: list[Finalised] = field(default_factory=list)
    own_ms: int | None = None
    """The partition's own watermark (see ``PartitionEngine.own_ms``)."""
    forwarded_ms: int | None = None
    """Wall clock of the latest event this partition forwarded, if any."""
    exposures: dict[str, int] = field(default_factory=dict)
    """Users first exposed in this batch, per ``experiment US variant``."""
    covariates: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    """Of those, (user, CUPED covariate) for the users who have one."""
    provisional: dict[HistoryKey, npt.NDArray[np.float64]] = field(default_factory=dict)
    """Regression history increments of open requests scored early (provisional)."""


class Outcome(enum.Enum):
    """What became of a checkpoint."""

    WRITTEN = "written"
    FENCED = "fenced"
    """A newer owner has claimed the partition: nothing was written."""
    STALE = "stale"
    """The store's copy is not the one this owner last wrote (it lost writes, or lost
    this owner's claim): nothing was written; reload the partition."""


@dataclass(frozen=True, slots=True)
class PartitionWrite:
    """One partition's checkpoint as handed to the store: who writes it (the owner's
    epoch), where it follows (the owner's ``seq``-th write) and what it holds."""

    partition: int
    epoch: int
    seq: int
    delta: Delta


@dataclass(frozen=True, slots=True)
class Marks:
    """What a partition tells the others: its own watermark and when it last forwarded."""

    own_ms: int | None
    forwarded_ms: int | None
