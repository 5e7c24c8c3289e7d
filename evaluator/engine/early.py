"""The provisional pass: open requests scored at a fixed age, before they are final.

When the watermark passes a request's impression time plus the layout's
``provisional_ms`` it is scored once with the interactions that arrived within its
first ``provisional_age_ms`` (:mod:`evaluator.core.provisional`), and left open. The
pass covers the impressions between the last finalised watermark and this one, so
after a reload (the watermark is checkpointed with the increments) no request is
scored twice or skipped. Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter

from evaluator.core.finalise import FinaliseConfig, join_due
from evaluator.core.provisional import as_provisional, score_rows
from evaluator.core.regression import HistoryKey, RegressionRules, history_increments
from evaluator.core.scoring import score_sparse
from evaluator.engine.contexts import loose_join, named_columns
from evaluator.engine.ports import FloatArray
from evaluator.engine.state import PartitionState


def provisional_pass(
    state: PartitionState, config: FinaliseConfig, watermark_ms: int
) -> dict[HistoryKey, FloatArray]:
    """The history increments of the open requests whose provisional time the
    watermark passed since the last finalisation (none when the layout has none)."""
    layout = config.layout
    at = layout.provisional_ms
    if not at or not layout.history_keep_ms:
        return {}
    after = state.finalised_ms - at if state.finalised_ms is not None else -(2**62)
    young = state.requests.peek(after, watermark_ms - at)
    if not len(young):
        return {}
    young.named = named_columns(state, young.request_id)
    codes = {uid: code for code, uid in enumerate(dict.fromkeys(young.user_id))}
    joined, _ = loose_join(state, codes)
    attributed, _ = join_due(young, joined, config.rules, Counter())
    seen = attributed.within(young.ms, layout.provisional_age_ms)
    scores = score_sparse(len(young), *seen[:3], config.scoring, metrics=("ndcg",))
    rules = RegressionRules(ks=layout.ks, slot_ms=layout.history_slot_ms)
    keys = young.ms + layout.provisional_key_ms
    rows = score_rows(scores, layout.ks)
    return as_provisional(history_increments(rules, keys, young.variant, rows))
