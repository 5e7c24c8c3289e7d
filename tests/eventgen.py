"""Random event sets and a naive, independent evaluator used as the oracle for replay tests."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import reference

T0 = 1_700_000_000_000
GRADES = {"click": 1, "add_to_cart": 2, "purchase": 3}


@dataclass
class EventSet:
    impressions: list[dict[str, Any]] = field(default_factory=list)
    interactions: list[dict[str, Any]] = field(default_factory=list)

    def write(self, directory: Path) -> tuple[Path, Path]:
        imp, inter = directory / "impressions.jsonl", directory / "interactions.jsonl"
        imp.write_text("".join(json.dumps(e) + "\n" for e in self.impressions))
        inter.write_text("".join(json.dumps(e) + "\n" for e in self.interactions))
        return imp, inter


def generate(seed: int, requests: int = 300, users: int = 25, catalog: int = 60) -> EventSet:
    """Impressions for several variants and interactions joined by request id or by user,
    some outside the window, some on items not shown, some duplicated."""
    rng = random.Random(seed)
    out = EventSet()
    for r in range(requests):
        ts = T0 + rng.randrange(0, 4 * 3_600_000)
        items = rng.sample([f"p{i}" for i in range(catalog)], rng.randint(1, 25))
        user = f"u{rng.randrange(users)}"
        imp = {
            "event_id": f"imp-{r}",
            "request_id": f"req-{r}",
            "user_id": user,
            "variant": rng.choice("ABC"),
            "timestamp": ts,
            "items": items,
            "item_attributes": {"category": [f"c{hash(i) % 4}" for i in items]},
        }
        if r % 4 == 1:  # a quarter of the lists interleaved (no draw: the data stay as they were)
            imp["teams"] = ["AB"[(i + r // 4) % 2] for i in range(len(items))]
            imp["interleaving"] = {"A": "ranker-y", "B": "ranker-x"}
        out.impressions.append(imp)
        if rng.random() < 0.05:
            out.impressions.append(dict(imp))  # at-least-once duplicate
        for n in range(rng.choice([0, 0, 1, 2, 3])):
            item = rng.choice(items) if rng.random() < 0.9 else f"p{rng.randrange(catalog)}"
            delay = rng.choice([rng.randrange(-4_000, 20 * 60_000), 40 * 60_000])
            inter = {
                "event_id": f"int-{r}-{n}",
                "user_id": user,
                "item_id": item,
                "type": rng.choice(list(GRADES)),
                "timestamp": ts + delay,
            }
            if rng.random() < 0.6:
                inter["request_id"] = imp["request_id"]
            out.interactions.append(inter)
            if rng.random() < 0.05:
                out.interactions.append(dict(inter))
    rng.shuffle(out.interactions)  # arrival order must not matter
    return out


def naive_evaluate(
    events: EventSet,
    k: int,
    *,
    window_ms: int = 1_800_000,
    skew_ms: int = 5_000,
    min_history: int = 3,
    weights: list[float] | None = None,
) -> dict[str, Any]:
    """The spec, applied literally: per-variant mean nDCG@k and cohort request counts."""
    imps: dict[str, dict[str, Any]] = {}
    for e in events.impressions:  # the first impression of each request counts
        imps.setdefault(e["request_id"], e)
    grades: dict[str, dict[str, int]] = defaultdict(dict)
    relevant: dict[str, list[int]] = defaultdict(list)
    outcomes: dict[str, int] = defaultdict(int)
    seen: set[str] = set()
    for it in events.interactions:
        if it["event_id"] in seen:
            continue
        seen.add(it["event_id"])
        t, item, g = it["timestamp"], it["item_id"], GRADES[it["type"]]
        relevant[it["user_id"]].append(t)

        def ok(imp: dict[str, Any], t: int = t) -> bool:
            return imp["timestamp"] - skew_ms <= t <= imp["timestamp"] + window_ms

        if "request_id" in it:
            imp = imps.get(it["request_id"])
            if imp is None:
                outcomes["no_impression"] += 1
                continue
            if item not in imp["items"]:
                outcomes["not_in_list"] += 1
                continue
            if not ok(imp):
                outcomes["outside_window"] += 1
                continue
            target = imp
        else:
            mine = [i for i in imps.values() if i["user_id"] == it["user_id"]]
            shown = [i for i in mine if item in i["items"]]
            fits = [i for i in shown if ok(i)]
            if not fits:
                outcomes[
                    "outside_window" if shown else "not_in_list" if mine else "no_impression"
                ] += 1
                continue
            target = max(fits, key=lambda i: (i["timestamp"], i["request_id"]))
        outcomes["attributed"] += 1
        prev = grades[target["request_id"]].get(item, 0)
        grades[target["request_id"]][item] = max(prev, g)
    per_variant: dict[str, list[float]] = defaultdict(list)
    cohorts: dict[str, dict[str, int]] = defaultdict(lambda: {"cold_start": 0, "established": 0})
    for rid, imp in imps.items():
        row = [grades[rid].get(i, 0) for i in imp["items"]]
        per_variant[imp["variant"]].append(reference.ndcg(row, k, "exponential", weights))
        earlier = sum(1 for t in relevant[imp["user_id"]] if t < imp["timestamp"])
        cohorts[imp["variant"]]["established" if earlier >= min_history else "cold_start"] += 1
    return {
        "ndcg": {v: sum(x) / len(x) for v, x in per_variant.items()},
        "requests": {v: len(x) for v, x in per_variant.items()},
        "cohorts": dict(cohorts),
        "outcomes": dict(outcomes),
    }
