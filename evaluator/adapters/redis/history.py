"""Reading the regression detector's history (``rh:`` arrays, indexed by hour in ``rhi``).

A detector reads weeks of hourly arrays at every refresh, so arrays that can no longer
change are cached: those of hours (a maturity array: days) ending before every
partition's readout time (``rt``), since a partition only finalises requests due
after its readout time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from evaluator.adapters.redis.blocks import text
from evaluator.adapters.redis.connection import Client
from evaluator.core.maturity import is_maturity
from evaluator.core.regression import DAY_MS, HOUR_MS, HistoryKey
from evaluator.core.windows import AggregateLayout
from evaluator.engine.commit_payload import history_prefixes, history_shape
from evaluator.engine.ports import FloatArray


class HistoryReader:
    """Sums of each (hour, variant) history array over the shards, with a cache of the
    final ones."""

    def __init__(self, client: Client, tag: Callable[[int], str]) -> None:
        self.client = client
        self.tag = tag
        self._final: dict[tuple[int, str], FloatArray] = {}
        """(shard, name) -> an array that no partition can still add to."""

    def read(
        self, layout: AggregateLayout, since_ms: int, final_before_ms: int | None
    ) -> dict[HistoryKey, FloatArray]:
        """Arrays of hours from ``since_ms`` on; ``final_before_ms``: every partition's
        readout time, or None when some partition has none (nothing is cached)."""
        prefixes = history_prefixes(layout)
        pipe = self.client.pipeline(transaction=False)
        for shard in range(layout.shards):
            pipe.zrangebyscore(self.tag(shard) + "rhi", since_ms, "+inf")
        listed = [
            [n for n in map(text, names) if n.startswith(prefixes)] for names in pipe.execute()
        ]
        self._final = {
            key: a for key, a in self._final.items() if _hour(key[1]) >= since_ms
        }  # forget what fell out of the history read
        wanted = [
            (shard, name)
            for shard, names in enumerate(listed)
            for name in names
            if (shard, name) not in self._final
        ]
        found = self._get(wanted)
        out: dict[HistoryKey, FloatArray] = {}
        for shard, names in enumerate(listed):
            for name in names:
                array = self._final.get((shard, name))
                if array is None:
                    raw = found.get((shard, name))
                    if raw is None:
                        continue
                    shape = history_shape(layout, _variant(name))
                    array = np.frombuffer(raw, dtype="<f8").reshape(shape).astype(np.float64)
                    span = DAY_MS if is_maturity(_variant(name)) else HOUR_MS
                    if final_before_ms is not None and _hour(name) + span <= final_before_ms:
                        self._final[(shard, name)] = array
                key = (_hour(name), _variant(name))
                out[key] = out[key] + array if key in out else array
        return out

    def _get(self, wanted: Sequence[tuple[int, str]]) -> dict[tuple[int, str], bytes]:
        pipe = self.client.pipeline(transaction=False)
        for shard, name in wanted:
            pipe.get(self.tag(shard) + "rh:" + name)
        return {
            key: raw for key, raw in zip(wanted, pipe.execute(), strict=True) if raw is not None
        }


def _hour(name: str) -> int:
    return int(name.split(":", 2)[1])


def _variant(name: str) -> str:
    return name.split(":", 2)[2]
