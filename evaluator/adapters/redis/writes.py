"""A poll's checkpoints written to Redis: the coverage sketches, then one checkpoint
script call per partition with the totals of the arrays it adds to
(:mod:`evaluator.adapters.redis.totals`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from evaluator.adapters.redis.connection import Client
from evaluator.adapters.redis.payload import CheckpointArgs, checkpoint_args
from evaluator.adapters.redis.sketches import CoverageSketches
from evaluator.adapters.redis.totals import FloatArray, Totals
from evaluator.core.windows import AggregateLayout
from evaluator.engine.checkpoint import Outcome, PartitionWrite

Call = Callable[[Any, str, str, Sequence[Any]], None]
"""Queue a script call on a pipeline: (pipeline, script name, key, arguments)."""


class CheckpointWriter:
    """Writes checkpoints for a :class:`~evaluator.adapters.redis.store.RedisStore`."""

    def __init__(
        self,
        client: Client,
        tag: Callable[[int], str],
        call: Call,
        execute: Callable[[Any], list[Any]],
        *,
        sketches: CoverageSketches,
        propensity_history_ms: int,
    ) -> None:
        self.client, self.tag, self._call, self._execute = client, tag, call, execute
        self.sketches = sketches
        self.propensity_history_ms = propensity_history_ms
        self.totals = Totals()

    def write(self, writes: Sequence[PartitionWrite], layout: AggregateLayout) -> list[Outcome]:
        """Two exchanges for a poll's checkpoints, whatever their number (three when
        some owner must read the totals it does not hold): the coverage sketches of
        all of them (a sketch that several partitions touched is merged once) with
        each partition's receipt, then one script call per partition."""
        if not writes:
            return []
        seen: set[int] = set()
        for n, w in enumerate(writes):  # a partition's second write adds to its first's
            if w.partition in seen:
                return self.write(writes[:n], layout) + self.write(writes[n:], layout)
            seen.add(w.partition)
        # sketches: a retry or a fenced write adds nothing twice; their receipt must
        # still be there when the checkpoint runs (not lost with them to a restart)
        receipts = [(self.tag(w.partition) + "pm", "sk", f"{w.epoch}:{w.seq}") for w in writes]
        touched = self.sketches.add(
            [(w.delta.finalised, receipt) for w, receipt in zip(writes, receipts, strict=True)]
        )
        args = [checkpoint_args(w.delta, layout) for w in writes]
        try:
            read = self._read(writes, args)
            pipe = self.client.pipeline(transaction=False)
            sums = [
                self._queue(
                    pipe, w, a, read=read, receipt=receipt[2] if mine else "", layout=layout
                )
                for w, a, receipt, mine in zip(writes, args, receipts, touched, strict=True)
            ]
            replies = [int(reply) for reply in self._execute(pipe)]
        except BaseException:
            for w in writes:  # each may or may not have landed
                self.totals.forget(w.partition)
            raise
        for w, a, new, reply in zip(writes, args, sums, replies, strict=True):
            if reply == 1:
                self.totals.keep(w.partition, w.epoch, new, a.targets, layout.history_keep_ms)
            else:
                self.totals.forget(w.partition)
        return [
            Outcome.WRITTEN if r == 1 else Outcome.FENCED if r == 0 else Outcome.STALE
            for r in replies
        ]

    def _read(
        self, writes: Sequence[PartitionWrite], args: Sequence[CheckpointArgs]
    ) -> dict[str, bytes | None]:
        """The stored values (by full key) of the arrays the writes add to whose totals
        their owners do not hold: one exchange, none when all are held."""
        keys = [
            self.tag(w.partition) + key
            for w, a in zip(writes, args, strict=True)
            for key in self.totals.unknown(w.partition, w.epoch, a.targets)
        ]
        if not keys:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        return dict(zip(keys, self._execute(pipe), strict=True))

    def _queue(
        self,
        pipe: Any,
        write: PartitionWrite,
        args: CheckpointArgs,
        *,
        read: dict[str, bytes | None],
        receipt: str,
        layout: AggregateLayout,
    ) -> dict[str, FloatArray]:
        """Queue the write's script call with its arrays' totals; returns them by key."""
        tag = self.tag(write.partition)
        stored = {key[len(tag) :]: v for key, v in read.items() if key.startswith(tag)}
        cut = (len(args.increments), len(args.increments) + len(args.cumulative))
        sums, new = self.totals.sums(
            write.partition,
            write.epoch,
            args.targets,
            args.increments + args.cumulative + args.history,
            read=stored,
            layout=layout,
        )
        self._call(
            pipe,
            "checkpoint",
            tag + "pm",
            [
                tag,
                write.epoch,
                args.payload,
                int(np.prod(layout.block_shape)),
                sums[: cut[0]],
                self.propensity_history_ms,
                write.seq,
                args.lengths,
                sums[cut[0] : cut[1]],
                receipt,
                args.names,
                args.values,
                0,  # unused (was the rows per block)
                sums[cut[1] :],
                0,  # unused (each history array's doubles are in the payload)
                layout.history_keep_ms,
            ],
        )
        return new


__all__ = ["CheckpointWriter"]
