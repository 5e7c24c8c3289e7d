"""Decoding a polled batch for one partition's engine, and routing what belongs elsewhere.

Pure: it returns the valid events of the partition's own users, the invalid
messages (for counting and dead-lettering) and the events of users that live in
another partition (for forwarding through the repartition topic, tagged by
kind). Events read from the repartition topic were routed by the evaluator itself
and are never forwarded again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from evaluator.core.decode import decode_impressions, decode_interactions, latest_accepted_ms
from evaluator.core.decode_spans import decode_impression_spans
from evaluator.core.events import ImpressionBatch, InteractionBatch, InvalidEvent, InvalidReason
from evaluator.core.relevance import RelevanceProfile
from evaluator.engine.batches import TAGS, PartitionBatch, Rejected
from evaluator.engine.codebook import ITEM_SEED
from evaluator.engine.partitioner import PartitionOf

KIND_TAG = {kind: tag for tag, kind in TAGS.items()}


@dataclass(frozen=True, slots=True)
class Forwarded:
    """An event for another partition: its number, key (user id) and tagged payload."""

    partition: int
    key: bytes
    payload: bytes
    origin: str
    """Where it was read (``impressions:3``), and at which offset: for its dead letter
    if the repartition topic refuses it."""
    offset: int


@dataclass(slots=True)
class Routed:
    """One batch, decoded for one partition."""

    impressions: ImpressionBatch = field(default_factory=ImpressionBatch)
    interactions: InteractionBatch = field(default_factory=InteractionBatch)
    rejected: list[Rejected] = field(default_factory=list)
    forwarded: list[Forwarded] = field(default_factory=list)

    def latest_ms(self) -> int | None:
        times = self.impressions.timestamp_ms + self.interactions.timestamp_ms
        return max(times) if times else None


@dataclass(frozen=True, slots=True)
class Decoder:
    """Everything decoding and routing needs, as plain values."""

    partition_of: PartitionOf
    profile: RelevanceProfile
    max_list_length: int = 1000
    max_future_ms: int = 60_000
    """Events stamped later than the clock's now + this are invalid (0: no limit)."""
    item_seed: int | None = ITEM_SEED
    """Impressions' items are decoded as spans hashed with this key (the codebooks'):
    no Python string per item; None: as strings."""

    def route(
        self, batch: PartitionBatch, first: int, partition: int, now_ms: int | None = None
    ) -> Routed:
        """Decode ``batch.payloads[first:]`` for ``partition`` at clock ``now_ms`` (None:
        no future-timestamp check)."""
        out = Routed()
        latest = latest_accepted_ms(now_ms, self.max_future_ms)
        payloads = batch.payloads[first:]
        if batch.kind == "repartition":
            groups: dict[str, list[tuple[int, bytes]]] = {}
            for i, raw in enumerate(payloads):
                tagged = TAGS.get(raw[:1])
                if tagged is not None:
                    groups.setdefault(tagged, []).append((first + i, raw[1:]))
                else:  # not written by the evaluator: counted and dead-lettered, not dropped
                    untagged = InvalidEvent(first + i, InvalidReason.UNDECODABLE, "no kind tag")
                    at = batch.offset(first + i)
                    out.rejected.append(Rejected("impressions", batch.partition, at, raw, untagged))
        else:
            groups = {batch.kind: [(first + i, raw) for i, raw in enumerate(payloads)]}
        for kind, items in groups.items():
            raws = [raw for _, raw in items]
            if kind == "impressions":
                if self.item_seed is None:
                    imps, bad = decode_impressions(raws, self.max_list_length, latest_ms=latest)
                else:
                    imps, bad = decode_impression_spans(
                        raws, self.item_seed, self.max_list_length, latest_ms=latest
                    )
                users = [e.user_id for e in imps.events]
            else:
                ints, bad = decode_interactions(raws, self.profile, latest_ms=latest)
                users = [e.user_id for e in ints.events]
            out.rejected += _rejected(batch, kind, items, bad)
            keep = list(range(len(users)))
            if batch.kind != "repartition" and self.partition_of.checks:
                keep = self._forward(out, (kind, partition), users, (raws, bad), (batch, items))
            if kind == "impressions":
                out.impressions = _take_impressions(imps, keep)
            else:
                out.interactions = _take_interactions(ints, keep)
        return out

    def _forward(
        self,
        out: Routed,
        route: tuple[str, int],
        users: list[str],
        decoded: tuple[list[bytes], list[InvalidEvent]],
        read: tuple[PartitionBatch, list[tuple[int, bytes]]],
    ) -> list[int]:
        """Queue the events of other partitions' users; returns the indexes kept.
        ``route``: their kind and this partition's number; ``decoded``: the raw payloads
        and the invalid ones among them; ``read``: the batch and (index, payload) pairs."""
        kind, partition = route
        raws, bad = decoded
        owners = self.partition_of(users)
        if owners.count(partition) == len(owners):  # producers keyed by user: all mine
            return list(range(len(users)))
        invalid = {b.index for b in bad}
        valid = [i for i in range(len(raws)) if i not in invalid]
        tag = KIND_TAG[kind]  # type: ignore[index]
        batch, items = read
        keep = []
        for j, (uid, p) in enumerate(zip(users, owners, strict=True)):
            if p == partition:
                keep.append(j)
            else:
                at = batch.offset(items[valid[j]][0])
                raw = raws[valid[j]]
                out.forwarded.append(Forwarded(p, uid.encode(), tag + raw, batch.partition, at))
        return keep


def refused_letters(refused: list[Forwarded]) -> list[Rejected]:
    """Dead letters for forwards the repartition topic refused as too large: valid
    events, but sent again they would fail forever."""
    out = []
    for f in refused:
        why = InvalidEvent(-1, InvalidReason.TOO_LARGE_TO_FORWARD, f"{len(f.payload)} bytes")
        out.append(Rejected(TAGS[f.payload[:1]], f.origin, f.offset, f.payload[1:], why))
    return out


def _rejected(
    batch: PartitionBatch, kind: str, items: list[tuple[int, bytes]], bad: list[InvalidEvent]
) -> list[Rejected]:
    out = []
    for invalid in bad:
        at, payload = items[invalid.index]  # from the repartition topic: without its tag
        origin = batch.kind if batch.kind != "repartition" else kind
        out.append(
            Rejected(origin, batch.partition, batch.offset(at), payload, invalid)  # type: ignore[arg-type]
        )
    return out


def _take_impressions(batch: ImpressionBatch, keep: Sequence[int]) -> ImpressionBatch:
    return batch.take(keep)


def _take_interactions(batch: InteractionBatch, keep: Sequence[int]) -> InteractionBatch:
    if len(keep) == len(batch.events):
        return batch
    return InteractionBatch(
        [batch.events[j] for j in keep],
        [batch.timestamp_ms[j] for j in keep],
        [batch.grade[j] for j in keep],
    )
