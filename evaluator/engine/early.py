"""The provisional pass: open requests scored at a fixed age, before they are final.

Once the watermark has passed a request's impression time plus the layout's
``provisional_ms`` it is scored once with the interactions that arrived within its
first ``provisional_age_ms`` (:mod:`evaluator.core.provisional`), and left open.

The pass runs a batch at a time, not at every poll (a pass per poll and partition
cost about a fifth of the live process's CPU): only when a provisional slot is
complete by the watermark (the readout uses the slots up to there, so none it uses is
missing requests), or when requests not scored yet are about to be finalised. It
covers the impressions after the last one it scored (``q:``, checkpointed with the
increments), so after a reload no request is scored twice or skipped. Scoring later
changes nothing: interactions count by their own time (within the age), as replay
counts them. Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from evaluator.core.due import Due
from evaluator.core.finalise import FinaliseConfig, join_due
from evaluator.core.provisional import as_provisional, score_rows
from evaluator.core.regression import HistoryKey, RegressionRules, history_increments
from evaluator.core.scoring import score_sparse
from evaluator.core.windows import AggregateLayout
from evaluator.engine.contexts import Spans, loose_join, named_columns
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
    after = scored_through(state, at)
    if state.scored_ms is None:  # state of a version before ``q:``: its mark, kept
        state.scored_through(after)
    through = watermark_ms - at
    if not due(after, through, watermark_ms - config.deadline(0), layout):
        return {}
    young = state.requests.peek(after, through)
    state.scored_through(through)
    if not len(young):
        return {}
    young.named = named_columns(state, young.request_id)
    codes = {uid: code for code, uid in enumerate(dict.fromkeys(young.user_id))}
    spans = _spans(young, codes, config, layout.provisional_age_ms)
    joined, _ = loose_join(state, codes, spans)
    attributed, _ = join_due(young, joined, config.rules, Counter())
    seen = attributed.within(young.ms, layout.provisional_age_ms)
    scores = score_sparse(len(young), *seen[:3], config.scoring, metrics=("ndcg",))
    rules = RegressionRules(ks=layout.ks, slot_ms=layout.history_slot_ms)
    keys = young.ms + layout.provisional_key_ms
    rows = score_rows(scores, layout.ks)
    return as_provisional(history_increments(rules, keys, young.variant, rows))


def _spans(young: Due, codes: dict[str, int], config: FinaliseConfig, age_ms: int) -> Spans:
    """Per user (code of ``codes``), the times of the loose interactions that can count
    for one of their young requests: not before the first one's impression (less the
    clock skew an interaction may precede it by: an earlier one can only join an older
    request), not after the last one's age (:meth:`Attributed.within` drops those).
    Each is attributed on its own, so leaving the others out changes no young request's
    score."""
    users = np.fromiter(map(codes.__getitem__, young.user_id), dtype=np.int64, count=len(young))
    lo = np.full(len(codes), np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(len(codes), np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(lo, users, young.ms)
    np.maximum.at(hi, users, young.ms)
    return lo - config.rules.max_clock_skew_ms, hi + age_ms


def scored_through(state: PartitionState, at_ms: int) -> int:
    """The impression time through which open requests were scored (as versions
    before ``q:`` kept it: the last finalised watermark's)."""
    if state.scored_ms is not None:
        return state.scored_ms
    return state.finalised_ms - at_ms if state.finalised_ms is not None else -(2**62)


def due(after_ms: int, through_ms: int, final_ms: int, layout: AggregateLayout) -> bool:
    """Whether the pass must run now: requests scored through ``after_ms``, the
    watermark allows ``through_ms``, and requests of impression time up to ``final_ms``
    are being finalised. It must when some of those are not scored yet, or when the
    provisional slot of ``through_ms`` is past the slot of the first unscored request
    (the readout then uses every slot before it: all its requests must be in)."""
    if through_ms <= after_ms:
        return False
    if final_ms > after_ms:
        return True
    slot, key = layout.history_slot_ms, layout.provisional_key_ms
    return (after_ms + 1 + key) // slot < (through_ms + key) // slot
