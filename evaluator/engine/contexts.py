"""What finalisation needs of the due requests and their users, from a partition's join
state: the interactions naming the requests, the users' cold-start histories and, for
users with request-less ("loose") interactions, their open impressions and those
interactions. Pure.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from evaluator.core.due import Named, PendingInteraction
from evaluator.core.finalise import (
    History,
    LooseInteractions,
    LooseJoin,
)
from evaluator.core.join import UserImpressions, user_order
from evaluator.engine.state import PartitionState


def due_contexts(
    state: PartitionState, user_ids: list[str]
) -> tuple[LooseJoin | None, History, list[tuple[str, PendingInteraction]]]:
    """The due requests' users as finalisation sees them: for those with loose
    interactions, their open impressions and those interactions (columns for the
    user-based join, and each interaction's user id); for all, their cold-start
    histories."""
    codes = {uid: code for code, uid in enumerate(dict.fromkeys(user_ids))}
    history_user: list[int] = []
    history_ms: list[int] = []
    for code, user in enumerate(map(state.users.get, codes)):
        if user is not None and user.history:
            history_user += [code] * len(user.history)
            history_ms += [t for t, _ in user.history]
    history = History(
        codes, np.array(history_user, dtype=np.int64), np.array(history_ms, dtype=np.int64)
    )
    loose, loose_of = loose_join(state, codes)
    return loose, history, loose_of


Spans = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]
"""Per user code, the first and last loose-interaction time that matters."""


def loose_join(
    state: PartitionState, codes: dict[str, int], spans: Spans | None = None
) -> tuple[LooseJoin | None, list[tuple[str, PendingInteraction]]]:
    """For the users of ``codes`` (user id -> code) with loose interactions: their open
    impressions and those interactions, as the user-based join takes them, and each
    interaction's user id (None: no such user). ``spans``: per user code, the interaction
    times that matter (the others are left out, and a user without any too)."""
    loose: list[PendingInteraction] = []
    loose_user: list[int] = []
    loose_of: list[tuple[str, PendingInteraction]] = []
    users = state.users
    for uid in [uid for uid in codes if (u := users.get(uid)) is not None and u.loose]:
        waiting = sorted(users[uid].loose.values())  # the user has open requests
        if spans is not None:
            lo, hi = int(spans[0][codes[uid]]), int(spans[1][codes[uid]])
            waiting = [it for it in waiting if lo <= it.timestamp_ms <= hi]
        loose += waiting
        loose_user += [codes[uid]] * len(waiting)
        loose_of += [(uid, it) for it in waiting]
    if not loose:
        return None, loose_of
    shown = state.requests.of_users(list(dict.fromkeys(uid for uid, _ in loose_of)))
    users_of = np.fromiter(
        map(codes.__getitem__, shown.user), dtype=np.int64, count=len(shown.user)
    )
    order = user_order(users_of, shown.ms, shown.request)
    ids = [shown.request[i] for i in order.tolist()]
    impressions = UserImpressions(users_of[order], shown.ms[order], shown.items.take(order))
    interactions = LooseInteractions(
        np.array(loose_user, dtype=np.int64),
        state.requests.book.find([str(it.item_id) for it in loose]).astype(np.int64),
        np.fromiter((it.timestamp_ms for it in loose), dtype=np.int64, count=len(loose)),
        np.fromiter((it.grade for it in loose), dtype=np.float64, count=len(loose)),
    )
    return LooseJoin(impressions, ids, interactions), loose_of


def named_columns(state: PartitionState, rids: list[str]) -> Named:
    """The interactions naming the given requests, as columns (row: the request's index
    in ``rids``; items as codes). They are being closed: the interactions are not part
    of their changelog value."""
    named = state.named
    rows: list[int] = []
    pending: list[PendingInteraction] = []
    for row, rid in enumerate(rids):
        its = named.get(rid)
        if its:
            rows += [row] * len(its)
            pending += its
    if not pending:
        return Named.none()
    codes = state.requests.book.find([str(it.item_id) for it in pending])
    return Named(
        np.array(rows, dtype=np.int64),
        [it.event_id for it in pending],
        codes.astype(np.int64),
        np.fromiter((it.timestamp_ms for it in pending), dtype=np.int64, count=len(pending)),
        np.fromiter((it.grade for it in pending), dtype=np.float64, count=len(pending)),
    )
