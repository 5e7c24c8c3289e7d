"""The Redis state store: the only module that imports redis.

Key layout (docs/operations.md): every key of a user's state, their requests and
the window blocks they contribute to carries the hash tag ``{<prefix>:<shard>}``,
shard = user bucket % shards, so each Lua script touches one slot and the same
layout runs on Redis Cluster. Writes go through two Lua scripts, ``ingest`` and
``commit``, which make every state change idempotent and each finalisation a
single atomic claim. Open requests, the interactions naming them and finalised
markers are fields of a few per-shard hashes, not keys of their own: a script
writes a batch's worth with one multi-field command, where a key per request
cost a command (and a key's overhead) each.
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
from evaluator.events import ImpressionBatch, InteractionBatch
from evaluator.finalise import Finalised, OpenRequest, UserContext
from evaluator.propensity_estimation import (
    DAY_MS,
    first_kept_day,
)
from evaluator.stores.base import DueRequest, FloatArray, IngestCounts, PartitionProgress
from evaluator.stores.block_cache import NO_LOWER_BOUND, BlockCache
from evaluator.stores.commit_payload import (
    block_increments,
    coverage_updates,
    propensity_increments,
)
from evaluator.stores.redis_codec import (
    decode_context,
    decode_request,
    encode_request,
    loose_member,
    pending_record,
)
from evaluator.windows import AggregateLayout, shard_of

SCRIPTS = ("ingest", "load", "commit", "progress")
PFADD_CHUNK = 10_000
"""Items per PFADD command."""
EMPTY_DENSE_HLL = b"HYLL" + bytes(4) + bytes(8) + bytes(12_288)
"""An empty HyperLogLog in Redis' dense encoding: magic, encoding 0 (dense), 3 unused
bytes, a valid cached cardinality of 0, and 16,384 six-bit registers at zero."""
DENSE_FROM = 1_000
"""A sketch getting at least this many items in one commit is created dense. Redis
starts every sketch sparse and converts it past ~3,000 bytes, and adding to the sparse
encoding costs about 5x more per item (measured: 1.05 against 0.21 µs); a sketch this
large would be converted soon anyway, so nothing is spent on small ones."""
MARKER_PERIOD_MS = 6 * 3_600_000
"""Finalised markers are kept in one hash per period of the requests' deadlines (each
expires ``finalised_ttl`` after its last write): an interaction naming a request that is
not open looks in each period kept."""
PENDING_EPOCH_MS = 2 * DAY_MS
"""Interactions naming a request wait in one hash per epoch of their own event time;
finalisation reads the request's epoch and the two beside it. A constant, not a
setting: changing it would strand the interactions already waiting."""
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
        block_values = int(np.prod(layout.block_shape))
        if block_values > MAX_LUA_VALUES:
            raise ValueError(
                f"aggregate block of {block_values} values is too large for Redis Lua; "
                "use more redis.shards or fewer windows.user_buckets"
            )
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
        stored = _text(self.client.get(key))
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
        oldest = [(shard, _text(r[0])) for shard, r in enumerate(pipe.execute()) if r]
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
        per_shard: dict[int, tuple[list[Any], list[Any]]] = defaultdict(lambda: ([], []))
        imp_shards = shard_of([e.user_id for e in impressions.events], self.layout).tolist()
        for event, ts, deadline, shard in zip(
            impressions.events, impressions.timestamp_ms, deadlines_ms, imp_shards, strict=True
        ):
            value = encode_request(event, ts, self.attribute)
            per_shard[shard][0].append((event.request_id, event.user_id, ts, deadline, value))
        int_shards = shard_of([e.user_id for e in interactions.events], self.layout).tolist()
        for it, ts, grade, shard in zip(
            interactions.events,
            interactions.timestamp_ms,
            interactions.grade,
            int_shards,
            strict=True,
        ):
            stored = (
                pending_record(it.event_id, it.item_id, ts, grade)
                if it.request_id
                else loose_member(it.event_id, it.item_id, grade)
            )
            per_shard[shard][1].append(
                (it.event_id, it.user_id, it.request_id or "", ts, grade, stored)
            )
        return {shard: msgspec.msgpack.encode(pair) for shard, pair in per_shard.items()}

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
            DueRequest(shard, _text(rid))
            for shard, rids in enumerate(pipe.execute())
            for rid in rids
        ]
        return found[:limit]

    def open_requests(self, watermark_ms: int) -> tuple[int, int]:
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.layout.shards):
            pipe.zcard(self.tag(shard) + "dl")
            pipe.zcount(self.tag(shard) + "dl", "-inf", watermark_ms)
        replies = [int(n) for n in pipe.execute()]
        return sum(replies[0::2]), sum(replies[1::2])

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
                requests.append(decode_request(_text(rid), value, pending))
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
                    gone = {_text(t) for t in taken}
                    rows = pending[shard]
                    keep = rows[[finalised.requests[i].request_id not in gone for i in rows]]
                    if keep.size:
                        retry[shard] = keep
            pending = retry
        self._add_items(finalised)
        return applied

    def _cov_key(self, window: int, start: int, variant: str, k: int) -> str:
        return f"{{{self.prefix}:cov}}:{window}:{start}:{variant}:{k}"

    def _add_items(self, finalised: Finalised) -> None:
        """Coverage sketches (HyperLogLog): one pipelined PFADD per sketch, then the merges
        of :func:`coverage_updates`. Plain commands: PFADD and PFMERGE are idempotent (and
        so is creating a large sketch dense, SET NX), so a retry after a partial failure
        is harmless and no script is needed."""
        gathered, merges = coverage_updates(finalised, self.layout, self._cov_key)
        if not gathered and not merges:
            return
        ttl = self.block_ttl_s
        pipe = self.client.pipeline(transaction=False)
        for key, items in gathered.items():
            members = list(items)
            if len(members) >= DENSE_FROM:
                pipe.set(key, EMPTY_DENSE_HLL, nx=True, ex=ttl)
            for i in range(0, len(members), PFADD_CHUNK):
                pipe.execute_command("PFADD", key, *members[i : i + PFADD_CHUNK])
            pipe.expire(key, ttl)
        for i in range(0, len(merges), 2):
            _same_slot(pipe, "PFMERGE", merges[i : i + 2])
            pipe.expire(merges[i], ttl)
        self._execute(pipe)

    def distinct_items(
        self, window_ms: int, bucket_starts: Sequence[int], variants: Sequence[str]
    ) -> tuple[dict[tuple[str, int], float], float]:
        pipe = self.client.pipeline(transaction=False)
        wanted = [(v, k) for v in variants for k in self.layout.ks]
        for variant, k in wanted:
            _same_slot(
                pipe, "PFCOUNT", [self._cov_key(window_ms, b, variant, k) for b in bucket_starts]
            )
        _same_slot(pipe, "PFCOUNT", self._catalog_keys(bucket_starts[-1] if bucket_starts else 0))
        replies = [float(n) for n in pipe.execute()]
        return dict(zip(wanted, replies[:-1], strict=True)), replies[-1]

    def distinct_unions(
        self, window_ms: int, bucket_starts: Sequence[int], groups: Sequence[tuple[str, str, int]]
    ) -> list[float]:
        if not bucket_starts:
            return [0.0] * len(groups)
        pipe = self.client.pipeline(transaction=False)
        for a, b, k in groups:
            keys = [self._cov_key(window_ms, s, v, k) for s in bucket_starts for v in (a, b)]
            _same_slot(pipe, "PFCOUNT", keys)
        return [float(n) for n in pipe.execute()]

    def _catalog_keys(self, until_ms: int) -> list[str]:
        """Sketches of every shown item over the longest window ending at ``until_ms``."""
        window = max(self.layout.windows_ms)
        width = self.layout.bucket_width(window)
        last = until_ms - until_ms % width
        first = last - window
        return [self._cov_key(window, b, "*", 0) for b in range(first, last + 1, width)]

    def blocks(
        self, window_ms: int, since_ms: int | None = None, until_ms: int | None = None
    ) -> dict[tuple[int, str], FloatArray]:
        """Blocks of a window in a range; unchanged blocks come from a local cache.

        Every commit records the blocks it touched under a per-shard version
        (``mod:<window>``). The first read (or one reaching further back) lists the
        window's index; later reads fetch only blocks written since the previous
        read. The result is always current, and reading is cheap once warm.
        """
        cache = self._blocks
        lo = NO_LOWER_BOUND if since_ms is None else since_ms
        hi = 2**62 if until_ms is None else until_ms
        full = cache.needs_listing(window_ms, lo)
        shards = range(self.layout.shards)
        pipe = self.client.pipeline(transaction=False)
        for shard in shards:
            tag = self.tag(shard)
            if full:
                pipe.zrangebyscore(f"{tag}bi:{window_ms}", lo, "+inf")
            seen = cache.version(window_ms, shard)
            pipe.zrangebyscore(f"{tag}mod:{window_ms}", f"({seen}", "+inf", withscores=True)
        replies = iter(pipe.execute())
        wanted: list[tuple[int, list[str]]] = []
        for shard in shards:
            listed = [_text(n) for n in next(replies)] if full else None
            changed = [(_text(n), int(v)) for n, v in next(replies)]
            names = cache.refresh(window_ms, shard, lo, listed, changed)
            if names:
                wanted.append((shard, names))
        cache.listed(window_ms, lo)
        pipe = self.client.pipeline(transaction=False)
        for shard, names in wanted:  # one MGET per shard: a single slot each
            _same_slot(pipe, "MGET", [f"{self.tag(shard)}b:{name}" for name in names])
        for (shard, names), raws in zip(wanted, pipe.execute(), strict=True):
            cache.put(window_ms, shard, names, raws)
        return cache.assemble(window_ms, lo, hi)

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

    def propensity_counts(self) -> dict[str, int]:
        shards = range(self.layout.shards)
        pipe = self.client.pipeline(transaction=False)
        for shard in shards:
            pipe.zrange(self.tag(shard) + "psd", 0, -1)
        days = [[int(_text(d)) for d in found] for found in pipe.execute()]
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
            total.update({_text(k): int(v) for k, v in reply.items()})
        return dict(total)

    def propensity_curve(self, bucket_ms: int, proposal: tuple[float, ...]) -> tuple[float, ...]:
        key = f"{self._meta}curve:{bucket_ms}"
        pipe = self.client.pipeline(transaction=False)
        pipe.set(key, ",".join(map(repr, proposal)), nx=True, ex=self.block_ttl_s)
        pipe.get(key)
        stored = _text(pipe.execute()[1])
        return tuple(float(v) for v in stored.split(",")) if stored else proposal

    def ping(self) -> bool:
        return bool(self.client.ping())

    def close(self) -> None:
        self.client.close()


def _same_slot(pipe: Any, command: str, keys: Sequence[str]) -> None:
    """Queue a multi-key command whose keys share one hash tag. redis-py's Cluster
    pipelines refuse the ``mget``/``pfcount`` helpers for several keys, but the raw
    command is routed to the keys' slot like any other."""
    pipe.execute_command(command, *keys)


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value
