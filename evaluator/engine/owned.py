"""An owned partition: its engine, and the bookkeeping of its checkpoints (the epoch
they carry, their sequence, the offsets they make durable). Shared by the partition
tasks, which keep one per owned partition, and the checkpoint writes, which carry it."""

from __future__ import annotations

from dataclasses import dataclass, field

from evaluator.core.finalise import Finalised
from evaluator.engine.partition import PartitionEngine


@dataclass(slots=True)
class Owned:
    """An owned partition: its engine and the epoch its checkpoints carry."""

    engine: PartitionEngine
    epoch: int
    seq: int
    """Checkpoints written so far (the store refuses a write that does not follow it)."""
    offsets: dict[str, int] = field(default_factory=dict)
    """Input -> next offset to consume, as of the engine's state in memory."""
    written_marks: tuple[int | None, int | None] = (None, None)
    """(watermark, own watermark) as of the last checkpoint."""
    forwarded_ms: int | None = None
    """Wall clock of the latest event this partition forwarded."""
    durable: dict[str, int] = field(default_factory=dict)
    """Input -> next offset to consume, as of the last checkpoint written (what a new
    owner resumes from, and what is committed to Kafka)."""
    checkpointed_ms: int | None = None
    """Wall clock of the last checkpoint written (None: none yet by this owner)."""
    done: list[Finalised] = field(default_factory=list)
    """Requests finalised since the last checkpoint, written with the next one."""
    consumed: bool = False
    """Records were consumed since the last checkpoint."""
