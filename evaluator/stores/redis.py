"""The Redis state store: the only module that imports redis.

Key layout (docs/operations.md): every key of a user's state, their requests and
the window blocks they contribute to carries the hash tag ``{<prefix>:<shard>}``,
shard = user bucket % shards, so each Lua script touches one slot and the same
layout runs on Redis Cluster. Writes go through two Lua scripts, ``ingest`` and
``commit``, which make every state change idempotent and each finalisation a
single atomic claim.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

import msgspec
import numpy as np
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from evaluator.events import ImpressionBatch, InteractionBatch
from evaluator.finalise import Finalised, OpenRequest, PendingInteraction, UserContext
from evaluator.stores.base import DueRequest, FloatArray, IngestCounts, PartitionProgress
from evaluator.windows import AggregateLayout, expand_shards, shard_of

SEP = "\x1f"
MAX_LUA_VALUES = 7000
"""Redis' Lua unpacks at most ~8000 values at once; a block must stay below that."""


class LayoutMismatchError(Exception):
    """Stored state was written with another aggregate layout (k, windows, buckets ...)."""


def _script(name: str) -> str:
    return resources.files("evaluator.stores").joinpath(f"lua/{name}.lua").read_text()


def connect(
    url: str,
    *,
    username: str = "",
    password: str = "",
    tls: bool = False,
    ca_certs: str = "",
    retries: int = 5,
) -> redis.Redis:
    """A client with bounded, exponentially backed-off retries on connection errors."""
    options: dict[str, Any] = {
        "retry": Retry(ExponentialBackoff(cap=2.0, base=0.05), retries),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
        "health_check_interval": 30,
        "socket_timeout": 10,
        "socket_connect_timeout": 5,
    }
    if username:
        options["username"] = username
    if password:
        options["password"] = password
    if tls and url.startswith("redis://"):
        url = "rediss://" + url[len("redis://") :]
    if ca_certs:
        options["ssl_ca_certs"] = ca_certs
    return redis.Redis.from_url(url, **options)


class RedisStore:
    """:class:`evaluator.stores.base.StateStore` on Redis (standalone or Cluster layout)."""

    def __init__(
        self,
        client: redis.Redis,
        layout: AggregateLayout,
        *,
        prefix: str = "recsys",
        history_cap: int = 3,
        state_ttl_s: int = 2 * 86_400,
        history_ttl_s: int = 30 * 86_400,
    ) -> None:
        block_values = int(np.prod(layout.block_shape))
        if block_values > MAX_LUA_VALUES:
            raise ValueError(
                f"aggregate block of {block_values} values is too large for Redis Lua; "
                "use more redis.shards or fewer windows.user_buckets"
            )
        self.client = client
        self.layout = layout
        self.prefix = prefix
        self.history_cap = history_cap
        self.state_ttl_s = state_ttl_s
        self.history_ttl_s = history_ttl_s
        self.block_ttl_s = (max(layout.windows_ms) * 2) // 1000 + 3600
        self._ingest = client.register_script(_script("ingest"))
        self._commit = client.register_script(_script("commit"))
        self._progress = client.register_script(_script("progress"))
        self._meta = f"{{{prefix}:meta}}:"

    def tag(self, shard: int) -> str:
        return f"{{{self.prefix}:{shard}}}:"

    def check_layout(self) -> None:
        key = self._meta + "layout"
        fingerprint = self.layout.fingerprint()
        self.client.set(key, fingerprint, nx=True)
        stored = _text(self.client.get(key))
        if stored and stored != fingerprint:
            raise LayoutMismatchError(
                f"Redis prefix {self.prefix!r} holds state with layout {stored}; "
                "this configuration needs another redis.key_prefix"
            )

    def ingest(
        self,
        impressions: ImpressionBatch,
        interactions: InteractionBatch,
        deadlines_ms: Sequence[int],
        loose_late_before_ms: int,
    ) -> IngestCounts:
        per_shard: dict[int, tuple[list[Any], list[Any]]] = defaultdict(lambda: ([], []))
        imp_shards = shard_of([e.user_id for e in impressions.events], self.layout).tolist()
        for event, ts, deadline, shard in zip(
            impressions.events, impressions.timestamp_ms, deadlines_ms, imp_shards, strict=True
        ):
            per_shard[shard][0].append(
                (
                    event.request_id,
                    event.user_id,
                    event.variant,
                    ts,
                    deadline,
                    SEP.join(event.items),
                )
            )
        int_shards = shard_of([e.user_id for e in interactions.events], self.layout).tolist()
        for it, ts, grade, shard in zip(
            interactions.events,
            interactions.timestamp_ms,
            interactions.grade,
            int_shards,
            strict=True,
        ):
            per_shard[shard][1].append(
                (
                    it.event_id,
                    it.user_id,
                    it.request_id or "",
                    ts,
                    grade,
                    f"{it.item_id}{SEP}{ts}{SEP}{grade!r}",
                    f"{it.event_id}{SEP}{it.item_id}{SEP}{grade!r}",
                )
            )
        pipe = self.client.pipeline(transaction=False)
        for shard, (imps, ints) in per_shard.items():
            self._ingest(
                keys=[self.tag(shard) + "dl"],
                args=[
                    self.tag(shard),
                    msgspec.msgpack.encode((imps, ints)),
                    self.state_ttl_s,
                    self.history_cap,
                    self.history_ttl_s,
                    loose_late_before_ms,
                ],
                client=pipe,
            )
        counts = IngestCounts()
        for dup, late in pipe.execute():
            counts.duplicates += int(dup)
            counts.late += int(late)
        return counts

    def due(self, watermark_ms: int, limit: int) -> list[DueRequest]:
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.layout.shards):
            pipe.zrangebyscore(
                self.tag(shard) + "dl", "-inf", watermark_ms, start=0, num=limit, withscores=True
            )
        found: list[tuple[float, int, str]] = []
        for shard, rows in enumerate(pipe.execute()):
            found += [(score, shard, rid.decode()) for rid, score in rows]
        found.sort()
        return [DueRequest(shard, rid) for _, shard, rid in found[:limit]]

    def load(self, due: Sequence[DueRequest]) -> tuple[list[OpenRequest], dict[str, UserContext]]:
        pipe = self.client.pipeline(transaction=False)
        for shard, rid in due:
            pipe.hgetall(f"{self.tag(shard)}r:{rid}")
            pipe.hgetall(f"{self.tag(shard)}ri:{rid}")
        replies = pipe.execute()
        requests: list[OpenRequest] = []
        user_shard: dict[str, int] = {}
        stale = self.client.pipeline(transaction=False)
        for i, (shard, rid) in enumerate(due):
            state, pending = replies[2 * i], replies[2 * i + 1]
            if not state:
                stale.zrem(self.tag(shard) + "dl", rid)
                continue
            request = _decode_request(rid, state, pending)
            requests.append(request)
            user_shard[request.user_id] = shard
        stale.execute()
        return requests, self._contexts(user_shard, requests)

    def _contexts(
        self, user_shard: dict[str, int], requests: list[OpenRequest]
    ) -> dict[str, UserContext]:
        pipe = self.client.pipeline(transaction=False)
        users = list(user_shard)
        for user in users:
            tag = self.tag(user_shard[user])
            pipe.zrange(f"{tag}ui:{user}", 0, -1, withscores=True)
            pipe.zrange(f"{tag}ul:{user}", 0, -1, withscores=True)
            pipe.zrange(f"{tag}uh:{user}", 0, -1, withscores=True)
        replies = pipe.execute()
        known = {r.request_id: r.items for r in requests}
        contexts: dict[str, UserContext] = {}
        missing: list[tuple[str, int]] = []
        for j, user in enumerate(users):
            imps, loose, hist = replies[3 * j : 3 * j + 3]
            ctx = UserContext(
                impression_ms=[int(s) for _, s in imps],
                impression_ids=[m.decode() for m, _ in imps],
                loose=[_decode_loose(m, s) for m, s in loose],
                history_ms=sorted(int(s) for _, s in hist),
            )
            contexts[user] = ctx
            missing += [(rid, user_shard[user]) for rid in ctx.impression_ids if rid not in known]
        if missing:
            pipe = self.client.pipeline(transaction=False)
            for rid, shard in missing:
                pipe.hget(f"{self.tag(shard)}r:{rid}", "i")
            for (rid, _), items in zip(missing, pipe.execute(), strict=True):
                known[rid] = items.decode().split(SEP) if items else []
        for ctx in contexts.values():
            ctx.impression_items = [known[rid] for rid in ctx.impression_ids]
        return contexts

    def commit(self, finalised: Finalised, prune_loose_before_ms: int | None = None) -> int:
        layout = self.layout
        row_width = layout.row_width
        per_shard: dict[int, list[Any]] = defaultdict(list)
        shard_rows: dict[int, list[bytes]] = defaultdict(list)
        starts = {w: layout.bucket_start(w, finalised.deadline_ms) for w in layout.windows_ms}
        for i, request in enumerate(finalised.requests):
            bucket = int(finalised.user_bucket[i])
            shard = bucket % layout.shards
            offset = int(finalised.cohort[i]) * layout.local_buckets + bucket // layout.shards
            blocks = [
                (
                    f"{w}:{int(starts[w][i])}:{request.variant}",
                    int(starts[w][i]),
                    offset * row_width,
                )
                for w in layout.windows_ms
            ]
            per_shard[shard].append((request.request_id, request.user_id, request.variant, blocks))
            shard_rows[shard].append(finalised.rows[i].astype("<f8").tobytes())
        prune = prune_loose_before_ms if prune_loose_before_ms is not None else -(2**62)
        pipe = self.client.pipeline(transaction=False)
        for shard, rows in per_shard.items():
            self._commit(
                keys=[self.tag(shard) + "dl"],
                args=[
                    self.tag(shard),
                    msgspec.msgpack.encode(rows),
                    self.state_ttl_s,
                    self.block_ttl_s,
                    int(np.prod(layout.block_shape)),
                    row_width,
                    prune,
                    b"".join(shard_rows[shard]),
                ],
                client=pipe,
            )
        return sum(int(n) for n in pipe.execute())

    def blocks(self, window_ms: int) -> dict[tuple[int, str], FloatArray]:
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.layout.shards):
            pipe.zrange(self.tag(shard) + "bi", 0, -1)
        names = [
            (shard, m.decode()) for shard, members in enumerate(pipe.execute()) for m in members
        ]
        names = [(s, n) for s, n in names if n.split(":", 1)[0] == str(window_ms)]
        pipe = self.client.pipeline(transaction=False)
        for shard, name in names:
            pipe.get(f"{self.tag(shard)}b:{name}")
        grouped: dict[tuple[int, str], dict[int, FloatArray]] = defaultdict(dict)
        for (shard, name), raw in zip(names, pipe.execute(), strict=True):
            if raw is None:
                continue
            _, start, variant = name.split(":", 2)
            block = np.frombuffer(raw, dtype="<f8").reshape(self.layout.block_shape)
            grouped[(int(start), variant)][shard] = block.astype(np.float64)
        return {key: expand_shards(parts, self.layout) for key, parts in grouped.items()}

    def record_progress(self, progress: Mapping[str, PartitionProgress]) -> None:
        args: list[Any] = []
        for key, value in progress.items():
            args += [key, value.max_event_ms, value.updated_ms]
        if args:
            self._progress(keys=[self._meta + "progress"], args=args)

    def progress(self) -> dict[str, PartitionProgress]:
        raw = self.client.hgetall(self._meta + "progress")
        out: dict[str, PartitionProgress] = {}
        for key, value in raw.items():
            max_ms, updated = _text(value).split(":")
            out[_text(key)] = PartitionProgress(int(max_ms), int(updated))
        return out

    def counters(self) -> dict[str, int]:
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.layout.shards):
            pipe.hgetall(self.tag(shard) + "c")
        totals: dict[str, int] = defaultdict(int)
        for reply in pipe.execute():
            for key, value in reply.items():
                totals[key.decode()] += int(value)
        return dict(totals)

    def ping(self) -> bool:
        return bool(self.client.ping())

    def close(self) -> None:
        self.client.close()


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


def _decode_request(
    rid: str, state: dict[bytes, bytes], pending: dict[bytes, bytes]
) -> OpenRequest:
    interactions = []
    for event_id, value in pending.items():
        item, ts, grade = value.decode().split(SEP)
        interactions.append(PendingInteraction(event_id.decode(), item, int(ts), float(grade)))
    interactions.sort()
    return OpenRequest(
        rid,
        state[b"u"].decode(),
        state[b"v"].decode(),
        int(state[b"t"]),
        state[b"i"].decode().split(SEP),
        interactions,
    )


def _decode_loose(member: bytes, score: float) -> PendingInteraction:
    event_id, item, grade = member.decode().split(SEP)
    return PendingInteraction(event_id, item, int(score), float(grade))
