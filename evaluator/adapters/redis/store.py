"""The Redis state store (the package `evaluator.adapters.redis` is the only importer of redis).

Key layout (docs/operations.md): everything of partition ``p`` carries the hash
tag ``{<prefix>:<p>}``, so each checkpoint is one Lua script on one slot and the
same layout runs on Redis Cluster:

- ``state``: the partition's join state as changelog fields (the hash is the
  compacted changelog, see :mod:`evaluator.engine.state`);
- ``pm``: owner epoch, checkpoint sequence, offsets and event time per input,
  watermark, readout time and open requests;
- ``c``: exactly-once counters; ``b:``, ``bi:``, ``mod:``, ``ver``: the window
  blocks of the partition's users; ``ps:``, ``psd``: propensity counters.

Coverage sketches (built in the process, merged with idempotent ``PFMERGE`` under their own tag)
are written by :mod:`evaluator.adapters.redis.sketches` before each checkpoint.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Sequence
from importlib import resources
from typing import Any, cast

from redis.exceptions import NoScriptError

from evaluator.adapters.redis.block_cache import BlockCache
from evaluator.adapters.redis.blocks import read_blocks, text
from evaluator.adapters.redis.connection import Client, access_errors, connect
from evaluator.adapters.redis.history import HistoryReader
from evaluator.adapters.redis.sketches import CoverageSketches
from evaluator.adapters.redis.writes import CheckpointWriter
from evaluator.config import ConfigError
from evaluator.core.experiments import SEP
from evaluator.core.propensity.estimation import (
    DAY_MS,
    first_kept_day,
)
from evaluator.core.regression import HistoryKey
from evaluator.core.windows import (
    AggregateLayout,
    LayoutRefusedError,
    block_ttl_s,
    expand_shards,
    resume,
    stored_block,
)
from evaluator.engine.checkpoint import Checkpoint, Delta, Marks, Outcome, PartitionWrite
from evaluator.engine.ports import FloatArray

__all__ = ["LayoutMismatchError", "RedisStore", "connect"]

SCRIPTS = ("checkpoint",)
_SWAP = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) "
    "return 1 end return 0"
)
"""Compare-and-set of one key (the stored layout, grown by a new version)."""
STATE_SCAN = 10_000
"""Changelog fields read per HSCAN call when a new owner loads a partition."""


class LayoutMismatchError(ConfigError):
    """Stored state was written with another aggregate layout (k, windows, buckets ...)
    or state format: a configuration error naming ``redis.key_prefix`` (one line at
    start-up)."""


def _script(name: str) -> str:
    """A script's source, after the helpers it shares with the others (``lua/lib.lua``)."""
    lua = resources.files("evaluator.adapters.redis").joinpath("lua")
    return lua.joinpath("lib.lua").read_text() + lua.joinpath(f"{name}.lua").read_text()


class RedisStore:
    """:class:`evaluator.engine.ports.StateStore` on Redis (standalone or Cluster layout)."""

    def __init__(
        self,
        client: Client,
        layout: AggregateLayout,
        *,
        prefix: str = "recsys",
        propensity_history_ms: int = 7 * DAY_MS,
    ) -> None:
        self.client = client
        self.layout = layout
        self.prefix = prefix
        self.propensity_history_ms = propensity_history_ms
        self.block_ttl_s = block_ttl_s(max(layout.windows_ms))
        """Longest block lifetime; each window's blocks live 2 x window + 1 h."""
        self._sources = {name: _script(name) for name in SCRIPTS}
        self._sha = {
            name: hashlib.sha1(src.encode()).hexdigest() for name, src in self._sources.items()
        }
        with access_errors():
            self._load_scripts()
        self._meta = f"{{{prefix}:meta}}:"
        self._blocks = BlockCache(layout)
        self._history = HistoryReader(client, self.tag)
        self._sketches = CoverageSketches(client, layout, prefix, self.block_ttl_s, self._execute)
        self._writer = CheckpointWriter(
            client,
            self.tag,
            self._call,
            self._execute,
            sketches=self._sketches,
            propensity_history_ms=propensity_history_ms,
        )

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
        with access_errors():
            self._check_layout()

    def _check_layout(self) -> None:
        """Adopt the stored layout, grown by this version's new columns (written back
        only if nobody changed it meanwhile), or refuse state it cannot read."""
        key = self._meta + "layout"
        while True:
            stored = text(self.client.get(key))
            try:
                layout = resume(self.layout, stored)
            except LayoutRefusedError as e:
                raise LayoutMismatchError(
                    f"Redis prefix {self.prefix!r} holds state written when {e}: restore "
                    "that setting, or use another redis.key_prefix (a new prefix starts "
                    "empty; docs/operations.md, Upgrades)"
                ) from None
            fingerprint = layout.fingerprint()
            if stored == fingerprint or self._swap(key, stored, fingerprint):
                break
        if layout != self.layout or layout.column_names != self.layout.column_names:
            self.layout = layout
            self._blocks = BlockCache(layout)
            self._sketches.layout = layout
        self._refuse_shared_state()

    def _swap(self, key: str, expected: str, value: str) -> bool:
        """Set ``key`` to ``value`` if it still holds ``expected`` ("" = absent)."""
        if not expected:
            return bool(self.client.set(key, value, nx=True))
        return bool(self.client.eval(_SWAP, 1, key, expected, value))

    def _refuse_shared_state(self) -> None:
        """Open requests of the shared-state layout (before partition-owned engines: a
        deadline index per shard) are invisible to this version: refuse to start rather
        than lose them."""
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.layout.shards):
            pipe.exists(self.tag(shard) + "dl")
        if any(pipe.execute()):
            raise LayoutMismatchError(
                f"Redis prefix {self.prefix!r} holds open requests of the shared-state "
                "layout (an earlier version): let that version finalise them, or use "
                "another redis.key_prefix"
            )

    def claim(self, partition: int) -> Checkpoint:
        meta = self.tag(partition) + "pm"
        epoch = int(self.client.hincrby(meta, "epoch", 1))
        raw = {text(k): text(v) for k, v in self.client.hgetall(meta).items()}
        fields: dict[bytes, bytes] = {}  # HSCAN may return a field twice: once each here
        cursor = 0
        state = self.tag(partition) + "state"
        while True:
            cursor, chunk = cast(
                "tuple[int, dict[bytes, bytes]]", self.client.hscan(state, cursor, count=STATE_SCAN)
            )
            fields.update(chunk)
            if not int(cursor):
                break
        return Checkpoint(
            epoch,
            int(raw.get("seq", 0)),
            [(text(k), v) for k, v in fields.items()],
            {k[2:]: int(v) for k, v in raw.items() if k.startswith("o:")},
            {k[2:]: int(v) for k, v in raw.items() if k.startswith("t:")},
            int(raw["wm"]) if raw.get("wm") else None,
        )

    def checkpoint(self, partition: int, epoch: int, seq: int, delta: Delta) -> Outcome:
        return self.checkpoint_many([PartitionWrite(partition, epoch, seq, delta)])[0]

    def checkpoint_many(self, writes: Sequence[PartitionWrite]) -> list[Outcome]:
        """Two exchanges for a poll's checkpoints, whatever their number
        (:class:`~evaluator.adapters.redis.writes.CheckpointWriter`)."""
        return self._writer.write(writes, self.layout)

    def _partition_meta(self) -> list[dict[str, str]]:
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.layout.shards):
            pipe.hgetall(self.tag(shard) + "pm")
        return [{text(k): text(v) for k, v in r.items()} for r in pipe.execute()]

    def marks(self) -> dict[int, Marks]:
        out = {}
        for p, m in enumerate(self._partition_meta()):
            own, fw = m.get("ow"), m.get("fw")
            out[p] = Marks(int(own) if own else None, int(fw) if fw else None)
        return out

    def _experiment_keys(self, experiment: str) -> list[list[str]]:
        """Per shard, the ``experiment US variant`` keys it holds for the experiment."""
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.layout.shards):
            pipe.smembers(self.tag(shard) + "xv")
        prefix = experiment + SEP
        return [
            sorted(k for k in map(text, found) if k.startswith(prefix)) for found in pipe.execute()
        ]

    def experiment_blocks(self, experiment: str) -> dict[str, FloatArray]:
        keys = self._experiment_keys(experiment)
        pipe = self.client.pipeline(transaction=False)
        for shard, mine in enumerate(keys):
            for key in mine:
                pipe.get(self.tag(shard) + "x:" + key)
        raw = iter(pipe.execute())
        grouped: dict[str, dict[int, FloatArray]] = {}
        cut = len(experiment) + 1
        for shard, mine in enumerate(keys):
            for key in mine:
                found = next(raw)
                if found:
                    block = stored_block(found, self.layout)
                    grouped.setdefault(key[cut:], {})[shard] = block
        return {v: expand_shards(parts, self.layout) for v, parts in grouped.items()}

    def exposures(self, experiment: str) -> dict[str, int]:
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.layout.shards):
            pipe.hgetall(self.tag(shard) + "xu")
        out: dict[str, int] = {}
        prefix = experiment + SEP
        for found in pipe.execute():
            for k, v in found.items():
                name = text(k)
                if name.startswith(prefix):
                    out[name[len(prefix) :]] = out.get(name[len(prefix) :], 0) + int(v)
        return out

    def frontier(self) -> int | None:
        marks = [int(m["rt"]) for m in self._partition_meta() if m.get("rt")]
        return max(marks) if marks else None

    def open_requests(self, watermark_ms: int) -> tuple[int, int]:
        return self.open_count(), 0

    def history(self, since_ms: int) -> dict[HistoryKey, FloatArray]:
        marks = [m.get("rt") for m in self._partition_meta()]
        final = min(int(m) for m in marks if m) if all(marks) else None
        return self._history.read(self.layout, since_ms, final)

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
        (:func:`evaluator.adapters.redis.blocks.read_blocks`)."""
        return read_blocks(
            self.client, self._blocks, self.tag, window_ms, since_ms=since_ms, until_ms=until_ms
        )

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
