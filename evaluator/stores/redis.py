"""The Redis state store: the only module that imports redis.

Key layout (docs/operations.md): every key of a user's state, their requests and
the window blocks they contribute to carries the hash tag ``{<prefix>:<shard>}``,
shard = user bucket % shards, so each Lua script touches one slot and the same
layout runs on Redis Cluster. Writes go through two Lua scripts, ``ingest`` and
``commit``, which make every state change idempotent and each finalisation a
single atomic claim. Open requests, the interactions naming them and finalised
markers are fields of a few per-shard hashes, not keys of their own: a script
writes a batch's worth with one multi-field command, where a key per request
cost a command (and a key's overhead) each. Coverage sketches (plain, idempotent
``PFADD``/``PFMERGE`` under their own tag) are written and counted by
:mod:`evaluator.stores.redis_sketches`, before each commit's claims.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any, cast

import msgspec
import numpy as np
import numpy.typing as npt
import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError
from redis.retry import Retry

from evaluator.config import ConfigError
from evaluator.engine.checkpoint import Checkpoint, Delta, Outcome
from evaluator.events import ImpressionBatch, InteractionBatch
from evaluator.finalise import Finalised, OpenRequest, UserContext
from evaluator.propensity_estimation import (
    DAY_MS,
    first_kept_day,
)
from evaluator.stores.base import DueRequest, FloatArray, IngestCounts, PartitionProgress
from evaluator.stores.block_cache import BlockCache
from evaluator.stores.commit_payload import block_increments, propensity_increments
from evaluator.stores.redis_blocks import read_blocks
from evaluator.stores.redis_codec import decode_context, decode_request, ingest_payloads, text
from evaluator.stores.redis_sketches import CoverageSketches
from evaluator.windows import AggregateLayout

SCRIPTS = ("ingest", "load", "commit", "progress", "checkpoint")
MARKER_PERIOD_MS = 6 * 3_600_000
"""Finalised markers are kept in one hash per period of the requests' deadlines (each
expires ``finalised_ttl`` after its last write): an interaction naming a request that is
not open looks in each period kept."""
PENDING_EPOCH_MS = 2 * DAY_MS
"""Interactions naming a request wait in one hash per epoch of their own event time;
finalisation reads the request's epoch and the two beside it. A constant, not a
setting: changing it would strand the interactions already waiting."""
STATE_SCAN = 10_000
"""Changelog fields read per HSCAN call when a new owner loads a partition."""
MAX_LUA_VALUES = 7000
"""Redis' Lua unpacks at most ~8000 values at once; a block must stay below that."""


class LayoutMismatchError(ConfigError):
    """Stored state was written with another aggregate layout (k, windows, buckets ...)
    or state format: a configuration error naming ``redis.key_prefix`` (one line at
    start-up)."""


def _script(name: str) -> str:
    """A script's source, after the helpers it shares with the others (``lua/lib.lua``)."""
    lua = resources.files("evaluator.stores").joinpath("lua")
    return lua.joinpath("lib.lua").read_text() + lua.joinpath(f"{name}.lua").read_text()


Client = redis.Redis | RedisCluster
"""A standalone Redis client, or a Redis Cluster client (same commands and key layout)."""


def connect(
    url: str,
    *,
    username: str = "",
    password: str = "",
    tls: bool = False,
    ca_certs: str = "",
    retries: int = 5,
    cluster: bool = False,
) -> Client:
    """A client with bounded, exponentially backed-off retries on connection errors.

    ``cluster``: ``url`` names one node of a Redis Cluster; the client discovers the
    others and routes each command (and each script, by its hash-tagged key) to the
    node serving its slot."""
    retry = Retry(ExponentialBackoff(cap=2.0, base=0.05), retries)
    options: dict[str, Any] = {
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
    if cluster:
        return RedisCluster.from_url(url, retry=retry, **options)
    retry_on = [redis.ConnectionError, redis.TimeoutError]
    return redis.Redis.from_url(url, retry=retry, retry_on_error=retry_on, **options)


class RedisStore:
    """:class:`evaluator.stores.base.StateStore` on Redis (standalone or Cluster layout)."""

    def __init__(
        self,
        client: Client,
        layout: AggregateLayout,
        *,
        prefix: str = "recsys",
        history_cap: int = 3,
        state_ttl_s: int = 2 * 86_400,
        finalised_ttl_s: int = 2 * 86_400,
        propensity_history_ms: int = 7 * DAY_MS,
        history_ttl_s: int = 30 * 86_400,
        attribute: str = "category",
        join_window_ms: int = -1,
        clock_skew_ms: int = 0,
    ) -> None:
        self.client = client
        self.layout = layout
        self.attribute = attribute
        self.prefix = prefix
        self.history_cap = history_cap
        self.state_ttl_s = state_ttl_s
        self.finalised_ttl_s = finalised_ttl_s
        self.propensity_history_ms = propensity_history_ms
        self.history_ttl_s = history_ttl_s
        """Also the length of the cold-start history epochs (``h:<epoch>``)."""
        self.join = (join_window_ms, clock_skew_ms)
        """The join rules' attribution window and clock skew: loading then returns only
        the request-less interactions that could join the loaded requests, and the open
        requests that could compete for them (-1: all of them)."""
        self.block_ttl_s = (max(layout.windows_ms) * 2) // 1000 + 3600
        """Longest block lifetime; each window's blocks live 2 x window + 1 h."""
        self._sources = {name: _script(name) for name in SCRIPTS}
        self._sha = {
            name: hashlib.sha1(src.encode()).hexdigest() for name, src in self._sources.items()
        }
        self._progress = client.register_script(self._sources["progress"])
        self._load_scripts()
        self._meta = f"{{{prefix}:meta}}:"
        self._blocks = BlockCache(layout)
        self._sketches = CoverageSketches(client, layout, prefix, self.block_ttl_s, self._execute)

    def tag(self, shard: int) -> str:
        return f"{{{self.prefix}:{shard}}}:"

    def _load_scripts(self) -> None:
        """Load the Lua scripts (on every primary of a Cluster), so pipelines can call
        them by SHA: Cluster pipelines cannot load scripts themselves."""
        for src in self._sources.values():
            self.client.script_load(src)

    def _call(self, pipe: Any, name: str, key: str, args: Sequence[Any]) -> None:
        """Queue a script call on a pipeline (one key: it routes the call to its slot;
        a raw command, since Cluster pipelines refuse the ``evalsha`` helper)."""
        pipe.execute_command(
            "EVALSHA", self._sha[name], 1, key, *args
        )  # Cluster pipelines block .evalsha()

    def _execute(self, pipe: Any) -> list[Any]:
        """Run a pipeline. After a Redis restart or failover the scripts may be gone: they
        are loaded again and the error re-raised, so the caller retries the (idempotent)
        batch."""
        try:
            return cast("list[Any]", pipe.execute())
        except NoScriptError:
            self._load_scripts()
            raise

    def check_layout(self) -> None:
        key = self._meta + "layout"
        fingerprint = self.layout.fingerprint()
        self.client.set(key, fingerprint, nx=True)
        stored = text(self.client.get(key))
        if stored and stored != fingerprint:
            raise LayoutMismatchError(
                f"Redis prefix {self.prefix!r} holds state with layout {stored}; "
                "this configuration needs another redis.key_prefix"
            )
        self._refuse_per_request_keys()

    def _refuse_per_request_keys(self) -> None:
        """Open requests written by versions that kept one key per request (``r:``)
        are invisible to this one: refuse to start rather than lose or recount them.
        One open request per shard tells the formats apart."""
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.layout.shards):
            pipe.zrange(self.tag(shard) + "dl", 0, 0)
        oldest = [(shard, text(r[0])) for shard, r in enumerate(pipe.execute()) if r]
        pipe = self.client.pipeline(transaction=False)
        for shard, rid in oldest:
            pipe.exists(f"{self.tag(shard)}r:{rid}")
        if any(pipe.execute()):
            raise LayoutMismatchError(
                f"Redis prefix {self.prefix!r} holds open requests stored one key per "
                "request (an earlier version): let that version finalise them, or use "
                "another redis.key_prefix"
            )

    def ingest(
        self,
        impressions: ImpressionBatch,
        interactions: InteractionBatch,
        deadlines_ms: Sequence[int],
        loose_late_before_ms: int,
    ) -> IngestCounts:
        prepared = self.prepare_ingest(impressions, interactions, deadlines_ms)
        return self.apply_ingest(prepared, loose_late_before_ms)

    def prepare_ingest(
        self,
        impressions: ImpressionBatch,
        interactions: InteractionBatch,
        deadlines_ms: Sequence[int],
    ) -> object:
        """Per shard, the ingest script's msgpack argument."""
        return ingest_payloads(impressions, interactions, deadlines_ms, self.layout, self.attribute)

    def apply_ingest(self, prepared: object, loose_late_before_ms: int) -> IngestCounts:
        packed = cast("dict[int, bytes]", prepared)
        pipe = self.client.pipeline(transaction=False)
        for shard, payload in packed.items():
            self._call(
                pipe,
                "ingest",
                self.tag(shard) + "dl",
                [
                    self.tag(shard),
                    payload,
                    self.state_ttl_s,
                    self.history_cap,
                    self.history_ttl_s,
                    loose_late_before_ms,
                    self.finalised_ttl_s,
                    PENDING_EPOCH_MS,
                    MARKER_PERIOD_MS,
                ],
            )
        counts = IngestCounts()
        for dup, late in self._execute(pipe):
            counts.duplicates += int(dup)
            counts.late += int(late)
        return counts

    def due(self, watermark_ms: int, limit: int) -> list[DueRequest]:
        per_shard = max(64, limit // self.layout.shards)
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.layout.shards):
            pipe.zrangebyscore(self.tag(shard) + "dl", "-inf", watermark_ms, start=0, num=per_shard)
        found = [
            DueRequest(shard, text(rid))
            for shard, rids in enumerate(pipe.execute())
            for rid in rids
        ]
        return found[:limit]

    def open_requests(self, watermark_ms: int) -> tuple[int, int]:
        """Open requests as of each partition's last checkpoint, and how many are due:
        none, since a partition finalises what its event time makes due in the same
        checkpoint."""
        return self.open_count(), 0

    def load(self, due: Sequence[DueRequest]) -> tuple[list[OpenRequest], dict[str, UserContext]]:
        by_shard: dict[int, list[str]] = defaultdict(list)
        for shard, rid in due:
            by_shard[shard].append(rid)
        pipe = self.client.pipeline(transaction=False)
        for shard, rids in by_shard.items():
            self._call(
                pipe,
                "load",
                self.tag(shard) + "dl",
                [self.tag(shard), self.history_ttl_s, PENDING_EPOCH_MS, *self.join, *rids],
            )
        requests: list[OpenRequest] = []
        contexts: list[tuple[bytes, bytes, Any]] = []
        for found, users in self._execute(pipe):
            for rid, value, pending in found:
                requests.append(decode_request(text(rid), value, pending))
            contexts += zip(users[0::3], users[1::3], users[2::3], strict=True)
        items = {r.request_id: r.items for r in requests}
        return requests, {
            uid.decode(): decode_context(hist, extra, items) for uid, hist, extra in contexts
        }

    def commit(self, finalised: Finalised, prune_loose_before_ms: int | None = None) -> int:
        layout = self.layout
        prune = prune_loose_before_ms if prune_loose_before_ms is not None else -(2**62)
        shards = finalised.user_bucket % layout.shards
        pending = {int(s): np.flatnonzero(shards == s) for s in np.unique(shards)}
        # Sketches first: they are sets, so items of requests that another instance
        # claims, or that a retry after a failure finalises again, are harmless; after
        # the claims a failure would lose them (the requests are no longer due).
        self._sketches.add(finalised)
        applied = 0
        while pending:
            pipe = self.client.pipeline(transaction=False)
            order = list(pending)
            for shard in order:
                meta, blocks, increments = block_increments(finalised, pending[shard], self.layout)
                counts = propensity_increments(finalised, pending[shard])
                self._call(
                    pipe,
                    "commit",
                    self.tag(shard) + "dl",
                    [
                        self.tag(shard),
                        msgspec.msgpack.encode((meta, blocks, counts)),
                        self.state_ttl_s,
                        self.finalised_ttl_s,
                        int(np.prod(layout.block_shape)),
                        prune,
                        increments,
                        self.propensity_history_ms,
                        PENDING_EPOCH_MS,
                        MARKER_PERIOD_MS,
                    ],
                )
            retry: dict[int, npt.NDArray[np.intp]] = {}
            for shard, (count, taken, late) in zip(order, self._execute(pipe), strict=True):
                applied += int(count)
                finalised.late += int(late)
                if taken:
                    gone = {text(t) for t in taken}
                    rows = pending[shard]
                    keep = rows[[finalised.requests[i].request_id not in gone for i in rows]]
                    if keep.size:
                        retry[shard] = keep
            pending = retry
        return applied

    def claim(self, partition: int) -> Checkpoint:
        meta = self.tag(partition) + "pm"
        epoch = int(self.client.hincrby(meta, "epoch", 1))
        raw = {text(k): text(v) for k, v in self.client.hgetall(meta).items()}
        fields: list[tuple[str, bytes]] = []
        cursor = 0
        state = self.tag(partition) + "state"
        while True:
            cursor, chunk = cast(
                "tuple[int, dict[bytes, bytes]]", self.client.hscan(state, cursor, count=STATE_SCAN)
            )
            fields += [(text(k), v) for k, v in chunk.items()]
            if not int(cursor):
                break
        return Checkpoint(
            epoch,
            int(raw.get("seq", 0)),
            fields,
            {k[2:]: int(v) for k, v in raw.items() if k.startswith("o:")},
            {k[2:]: int(v) for k, v in raw.items() if k.startswith("t:")},
            int(raw["wm"]) if raw.get("wm") else None,
        )

    def checkpoint(self, partition: int, epoch: int, seq: int, delta: Delta) -> Outcome:
        tag = self.tag(partition)
        for done in delta.finalised:  # sets: a retry or a fenced write adds nothing twice
            self._sketches.add(done)
        blocks: list[Any] = []
        increments: list[bytes] = []
        propensity: list[Any] = []
        variants: set[str] = set()
        for done in delta.finalised:
            rows = np.arange(len(done.requests))
            _, found, incs = block_increments(done, rows, self.layout)
            blocks += found
            increments.append(incs)
            propensity += propensity_increments(done, rows)
            variants.update(r.variant for r in done.requests)
        written = [x for k, v in delta.changes.items() if v is not None for x in (k, v)]
        deleted = [k for k, v in delta.changes.items() if v is None]
        meta: list[Any] = []
        for name, offset in delta.offsets.items():
            meta += [f"o:{name}", offset]
        for name, t in delta.times.items():
            meta += [f"t:{name}", t]
        if delta.watermark_ms is not None:
            meta += ["wm", delta.watermark_ms]
        if delta.readout_ms is not None:
            meta += ["rt", delta.readout_ms]
        meta += ["open", delta.open_requests]
        counters = [x for k, v in delta.counters.items() if v for x in (k, v)]
        payload: tuple[Any, ...] = (
            [],
            deleted,
            meta,
            counters,
            blocks,
            propensity,
            sorted(variants),
        )
        pipe = self.client.pipeline(transaction=False)
        self._call(
            pipe,
            "checkpoint",
            tag + "pm",
            [
                tag,
                epoch,
                msgspec.msgpack.encode(payload),
                int(np.prod(self.layout.block_shape)),
                b"".join(increments),
                self.propensity_history_ms,
                seq,
                *written,
            ],
        )
        reply = int(self._execute(pipe)[0])
        return Outcome.WRITTEN if reply == 1 else Outcome.FENCED if reply == 0 else Outcome.STALE

    def _partition_meta(self) -> list[dict[str, str]]:
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.layout.shards):
            pipe.hgetall(self.tag(shard) + "pm")
        return [{text(k): text(v) for k, v in r.items()} for r in pipe.execute()]

    def frontier(self) -> int | None:
        marks = [int(m["rt"]) for m in self._partition_meta() if m.get("rt")]
        return max(marks) if marks else None

    def open_count(self) -> int:
        """Open requests over every partition, as of each one's last checkpoint."""
        return sum(int(m.get("open", 0)) for m in self._partition_meta())

    def distinct_items(
        self, window_ms: int, bucket_starts: Sequence[int], variants: Sequence[str]
    ) -> tuple[dict[tuple[str, int], float], float]:
        return self._sketches.distinct_items(window_ms, bucket_starts, variants)

    def distinct_unions(
        self, window_ms: int, bucket_starts: Sequence[int], groups: Sequence[tuple[str, str, int]]
    ) -> list[float]:
        return self._sketches.distinct_unions(window_ms, bucket_starts, groups)

    def blocks(
        self, window_ms: int, since_ms: int | None = None, until_ms: int | None = None
    ) -> dict[tuple[int, str], FloatArray]:
        """Blocks of a window in a range; unchanged blocks come from a local cache
        (:func:`evaluator.stores.redis_blocks.read_blocks`)."""
        return read_blocks(
            self.client, self._blocks, self.tag, window_ms, since_ms=since_ms, until_ms=until_ms
        )

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
            max_ms, updated = text(value).split(":")
            out[text(key)] = PartitionProgress(int(max_ms), int(updated))
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

    def propensity_counts(self) -> dict[str, int]:
        shards = range(self.layout.shards)
        pipe = self.client.pipeline(transaction=False)
        for shard in shards:
            pipe.zrange(self.tag(shard) + "psd", 0, -1)
        days = [[int(text(d)) for d in found] for found in pipe.execute()]
        if not any(days):
            return {}
        oldest = first_kept_day(max(max(d) for d in days if d), self.propensity_history_ms)
        pipe = self.client.pipeline(transaction=False)
        for shard, mine in zip(shards, days, strict=True):
            for day in mine:
                if day >= oldest:
                    pipe.hgetall(f"{self.tag(shard)}ps:{day}")
        total: Counter[str] = Counter()
        for reply in pipe.execute():
            total.update({text(k): int(v) for k, v in reply.items()})
        return dict(total)

    def propensity_curve(self, bucket_ms: int, proposal: tuple[float, ...]) -> tuple[float, ...]:
        key = f"{self._meta}curve:{bucket_ms}"
        pipe = self.client.pipeline(transaction=False)
        pipe.set(key, ",".join(map(repr, proposal)), nx=True, ex=self.block_ttl_s)
        pipe.get(key)
        stored = text(pipe.execute()[1])
        return tuple(float(v) for v in stored.split(",")) if stored else proposal

    def ping(self) -> bool:
        return bool(self.client.ping())

    def close(self) -> None:
        self.client.close()
