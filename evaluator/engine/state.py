"""The in-memory join state of one partition, and its changelog.

Everything a partition's owner needs to join and finalise its users' requests:
open requests, interactions waiting for them, request-less ("loose")
interactions, each user's earliest relevant interactions (the cold-start
history), each user's first exposure per experiment, and markers of what was
finalised or counted late (so a redelivery is a duplicate, not new). Pure: no I/O.

Every change is recorded as a field of the partition's changelog
(``t:<n>``, ``c:<n>``, ``w:``, ``q:``, ``j:<n>``, ``g:<n>``, ``m:``, ``k:``,
``i:<event>``, ``l:<event>``, ``h:<user>``, ``a:<user>``, ``u:<user>``, ``v:<n>``),
with the field's new encoded value or ``None`` for a
deletion. A store keeps those fields as one hash per partition: the hash *is* the
compacted changelog, and
:func:`evaluator.engine.restore.restore_state` rebuilds the state from it exactly.

Open requests live as columns (:class:`~evaluator.engine.columns.OpenTable`) and
are written as segments of columns, not one field each: ``t:<n>`` holds the
requests opened between two checkpoints and still open at the second, and is
deleted once the watermark has passed every deadline in it; ``c:<n>`` fields hold
the codebook they are coded with (:mod:`evaluator.engine.request_log`). A request is final
exactly when the watermark passes its deadline, and every checkpoint follows the
finalisation at its watermark, so a restored row is open exactly while the
checkpointed watermark is before its deadline: finalising a request writes
nothing for its row (one field and one encoding per checkpoint, not per request).
Interactions naming an open request likewise: ``j:<n>`` holds those that came
between two checkpoints and still wait at the second; a row lives exactly as long
as its request is open (the request's finalisation consumes it), and the segment
is deleted once the watermark has passed the deadline of every request in it. An
interaction naming a request that is not open (it may never come) is one
``i:<event>`` field, deleted when its request consumes it or after the marker TTL.
Finalised markers, and the markers of request-less interactions taken, expired or
late, are kept and written by :class:`~evaluator.engine.markers.Markers`, each
experiment's exposed users by :class:`~evaluator.engine.exposures.Exposures`.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from evaluator.core.due import PendingInteraction
from evaluator.core.tokens import Spans
from evaluator.engine import activity, request_log
from evaluator.engine.chunks import Chunk, Row
from evaluator.engine.columns import OpenTable, Places
from evaluator.engine.exposures import Exposures
from evaluator.engine.markers import Markers
from evaluator.engine.records import UserState, encode

_encode = encode

DAY_MS = 86_400_000
"""A user's activity time (the first relevant interaction of their latest active day) moves
once a day: the history's 30-day TTL needs no finer clock, and an active user costs one
changelog write a day."""

Changes = dict[str, bytes | None]
"""Changelog fields written (encoded value) or deleted (None) since the last flush."""


@dataclass(slots=True)
class PartitionState:
    """The join state of one partition, recording every change in :attr:`changes`."""

    history_cap: int = 3
    lookback_days: int = 0
    """Days of each user's activity kept for CUPED (0: none kept)."""
    requests: OpenTable = field(default_factory=OpenTable)
    """The open requests, as columns (final once the watermark passes their
    impression time plus :attr:`delay_ms`)."""
    named: dict[str, list[PendingInteraction]] = field(default_factory=dict)
    """Request id -> interactions naming it (the request may not have arrived yet): a
    list, in the order they came (a restored state's order may differ, which no result
    depends on; a dict per request cost ~200 bytes more)."""
    named_rid: dict[str, str] = field(default_factory=dict)
    """Event id of a waiting named interaction -> its request id."""
    users: dict[str, UserState] = field(default_factory=dict)
    expiry: list[tuple[int, str]] = field(default_factory=list)
    """Heap of (time, event) of interactions naming a request not open when they came
    (``i:``; one that never arrives), dropped once the watermark passes time + the
    marker TTL. An interaction naming an open request has no entry: the request's
    finalisation removes it (so this heap does not hold every interaction of the marker
    TTL)."""
    loose_user: dict[str, str] = field(default_factory=dict)
    """Event id of a held loose interaction -> its user: an event id is applied once
    in the partition, whichever user's it is (as replay applies it once), and its
    ``l:`` field is its alone."""
    loose_expiry: list[tuple[int, str, str]] = field(default_factory=list)
    """Heap of (time, user, event) of loose interactions, dropped past the horizon."""
    changes: Changes = field(default_factory=dict)
    born: set[str] = field(default_factory=set)
    """Changelog fields created since the last flush (absent from the store): deleting
    one drops it from :attr:`changes` instead of sending a deletion, so a request
    opened and finalised between two checkpoints never reaches the store."""
    fresh: set[str] = field(default_factory=set)
    """Requests opened since the last flush and still open: written at the flush."""
    fresh_chunks: list[Chunk] = field(default_factory=list)
    """The chunks they were opened in (as built, before any merge), taken from the
    table at the flush (:meth:`OpenTable.take_built`)."""
    book_written: int = 0
    """Codebook strings the changelog holds (its ``c:`` fields)."""
    book_fields: list[str] = field(default_factory=list)
    next_book: int = 0
    segments: list[tuple[int, str]] = field(default_factory=list)
    """Heap of (largest deadline, field name) of the stored request segments and
    interaction segments (``j:``, by their requests' deadlines): a segment is deleted
    once the watermark has passed every deadline in it."""
    next_segment: int = 0
    waiting: dict[str, tuple[str, PendingInteraction]] = field(default_factory=dict)
    """Interactions naming an open request that came since the last flush, still
    waiting (event id -> request id, interaction): one segment at the flush."""
    next_interaction_segment: int = 0
    fielded: set[str] = field(default_factory=set)
    """Waiting interactions stored as their own ``i:`` field: their request was not
    open when they came, or a version before interaction segments wrote them."""
    legacy: set[str] = field(default_factory=set)
    """Open requests restored from per-request ``r:`` fields (written by versions before
    segments): their field is deleted when they are finalised."""
    delay_ms: int = 0
    """A request's deadline after its impression (set by :meth:`add_requests`)."""
    segment_rows: int = 10_000
    """Rows per segment at most (a few MB): a checkpoint after a large backlog writes
    several fields rather than one huge one."""
    finalised_ms: int | None = None
    """Every request whose deadline is at or before this was finalised (the watermark
    of the latest finalisation; field ``w:``)."""
    judged_delay_ms: int | None = None
    """The delay under which :attr:`finalised_ms` was written (field ``d:``; None: a
    state written before the field, judged with :attr:`delay_ms`). A new owner judges
    a segment's row final by it, so a change of the deadline settings between owners
    (``allowed_lateness``, the attribution window, the skew) loses no open request."""
    scored_ms: int | None = None
    """Open requests shown up to this were scored at their provisional age (``q:``;
    None: state from before the field, see :mod:`evaluator.engine.early`)."""
    counted: set[str] = field(default_factory=set)
    """Users whose activity changed since the last flush (``u:`` fields)."""
    pending: list[tuple[int, str, str]] = field(default_factory=list)
    """Exposures whose covariate waits for the watermark: (day, key, user) (``p:``)."""
    pending_changed: bool = False
    markers: Markers = field(init=False)
    """The finalised markers (they record their changes here)."""
    exposed: Exposures = field(init=False)
    """Each experiment's exposed users (hashed with the markers' seed)."""

    def __post_init__(self) -> None:
        self.markers = Markers(self)
        self.exposed = Exposures(self, lambda: self.markers.seed)

    # --- writes -----------------------------------------------------------------

    def user(self, user_id: str) -> UserState:
        found = self.users.get(user_id)
        if found is None:
            found = self.users[user_id] = UserState()
        return found

    def add_requests(self, rows: list[Row], delay_ms: int, items: Spans | None = None) -> None:
        """Open the requests of changelog rows (none open yet), each final ``delay_ms``
        after its impression (``items``: their items as hashed spans, see
        :meth:`OpenTable.append`)."""
        self.delay_ms = delay_ms
        self.requests.append(rows, items, record=True)
        self.fresh.update(row[0] for row in rows)

    def create(self, name: str, value: bytes) -> None:
        """Write a field that the store does not hold unless deleted since the flush."""
        if name not in self.changes:
            self.born.add(name)
        self.changes[name] = value

    def delete(self, name: str) -> None:
        """Delete a field: a deletion for the store, or nothing if created since the flush."""
        if name in self.born:
            self.born.discard(name)
            del self.changes[name]
        else:
            self.changes[name] = None

    def set(self, name: str, value: bytes | None) -> None:
        """Write or delete a field (one the store may hold)."""
        self.changes[name] = value

    def add_named(self, rid: str, it: PendingInteraction, is_open: bool) -> None:
        """An interaction naming a request, open (``is_open``) or not (yet)."""
        eid = it.event_id
        self.attach(rid, it)
        if is_open:  # its request's finalisation consumes it: a segment row
            self.waiting[eid] = (rid, it)
            return
        heapq.heappush(self.expiry, (it.timestamp_ms, eid))
        self.fielded.add(eid)
        self.create("i:" + eid, _encode((rid, it.item_id, it.timestamp_ms, it.grade)))

    def attach(self, rid: str, it: PendingInteraction) -> None:
        """Hold an interaction naming ``rid`` (none held with its event id)."""
        self.named.setdefault(rid, []).append(it)
        self.named_rid[it.event_id] = rid

    def add_loose(self, user_id: str, it: PendingInteraction) -> None:
        """Hold a request-less interaction (none held with its event id)."""
        self.user(user_id).loose[it.event_id] = it
        self.loose_user[it.event_id] = user_id
        heapq.heappush(self.loose_expiry, (it.timestamp_ms, user_id, it.event_id))
        self.create("l:" + it.event_id, _encode((user_id, it.item_id, it.timestamp_ms, it.grade)))

    def add_histories(self, relevant: Sequence[tuple[str, str, int]]) -> None:
        """Keep each user's earliest ``history_cap`` relevant interactions (none with a cap
        of 0: every user is established), of a batch's (user, event, time) in order: each
        user's changed history is encoded once; their activity is counted."""
        if self.lookback_days:
            activity.count(self.users, self.counted, relevant)
        cap = self.history_cap
        if cap <= 0:
            return
        users, changes = self.users, self.changes
        changed: dict[str, UserState] = {}
        for user_id, event_id, timestamp_ms in relevant:
            user = users.get(user_id)
            if user is None:
                user = users[user_id] = UserState()
            if timestamp_ms // DAY_MS > user.active_ms // DAY_MS:  # kept (and written) once a day
                user.active_ms = timestamp_ms
                changes["a:" + user_id] = _encode(timestamp_ms)
            entry = (timestamp_ms, event_id)
            history = user.history
            if len(history) >= cap and entry >= history[-1]:
                continue  # most of a known user's interactions: later than the kept ones
            if entry in history:
                continue
            history.append(entry)
            history.sort()
            del history[cap:]
            changed[user_id] = user
        for user_id, user in changed.items():
            self._write_history(user_id, user)

    def _write_history(self, user_id: str, user: UserState) -> None:
        self.changes["h:" + user_id] = _encode(user.history) if user.history else None

    def expose(self, experiment: str, users: list[str]) -> list[bool]:
        """Record users exposed to an experiment; True for each first exposure."""
        return self.exposed.first(experiment, users)

    def drop_exposures(self, experiment: str) -> int:
        """Forget an ended experiment's exposed users; returns how many."""
        return self.exposed.drop(experiment)

    def mark_seen(self, event_ids: Sequence[str], times_ms: Sequence[int]) -> None:
        """Loose interactions taken, expired or late: a redelivery is a duplicate for
        the marker TTL (hashed markers, :meth:`Markers.add_seen`)."""
        self.markers.add_seen(event_ids, times_ms)

    def were_seen(self, event_ids: Sequence[str]) -> list[bool]:
        return self.markers.were_seen(event_ids)

    def finish(
        self, rids: list[str], deadlines_ms: list[int], places: Places | None = None
    ) -> None:
        """Close finalised requests: remove each with the interactions that named it,
        and mark it final (its deadline, and the ids of those interactions).
        ``places``: where :meth:`OpenTable.due` found them (None: looked up)."""
        fresh, changes = self.fresh, self.changes
        named, named_rid = self.named, self.named_rid
        legacy, unwritten, fielded = self.legacy, self.waiting, self.fielded
        if places is None:
            self.requests.remove(rids)
        else:
            self.requests.close(places)
        applied: list[tuple[str, int]] = []
        for rid, deadline in zip(rids, deadlines_ms, strict=True):
            if rid in fresh:
                fresh.discard(rid)
            elif legacy and rid in legacy:
                legacy.discard(rid)
                changes["r:" + rid] = None
            waiting = named.pop(rid, None)
            if not waiting:
                continue
            for it in waiting:
                eid = it.event_id
                named_rid.pop(eid, None)
                applied.append((eid, deadline))
                # not yet written, or a row of a segment that goes by its deadlines
                if unwritten.pop(eid, None) is None and eid in fielded:
                    fielded.discard(eid)
                    self.delete("i:" + eid)
        self.markers.add(rids, deadlines_ms, applied)

    def scored_through(self, through_ms: int) -> None:
        """Record that every open request of impression time up to ``through_ms`` was
        scored provisionally (written with the increments it produced)."""
        self.scored_ms = through_ms
        self.changes["q:"] = _encode(through_ms)

    def finalised_through(self, watermark_ms: int) -> None:
        """Record that every request due at ``watermark_ms`` is finalised, and delete the
        stored segments whose requests are all final."""
        if self.finalised_ms is not None and watermark_ms <= self.finalised_ms:
            return
        self.finalised_ms = watermark_ms
        self.changes["w:"] = _encode(watermark_ms)
        if self.judged_delay_ms != self.delay_ms:
            self.judged_delay_ms = self.delay_ms
            self.changes["d:"] = _encode(self.delay_ms)
        heap = self.segments
        while heap and heap[0][0] <= watermark_ms:
            self.changes[heapq.heappop(heap)[1]] = None

    def _drop_if_empty(self, user_id: str, user: UserState) -> None:
        if user.empty():
            del self.users[user_id]

    def expire(self, loose_before_ms: int, markers_before_ms: int) -> None:
        """Drop loose interactions older than ``loose_before_ms`` (they can join nothing
        open; remembered as seen so a redelivery is a duplicate) and markers older than
        ``markers_before_ms``."""
        heap, eids, times, users = self.loose_expiry, [], [], self.users
        while heap and heap[0][0] < loose_before_ms:
            t, uid, eid = heapq.heappop(heap)
            # the interaction this entry was pushed for (the id may have been taken, and
            # held again at another time: its own entry expires it, as a restored one)
            held = self.loose_user.get(eid) == uid and users[uid].loose[eid].timestamp_ms == t
            if held and self._forget_loose(uid, eid):
                eids.append(eid)
                times.append(t)
        self.mark_seen(eids, times)
        named = self.expiry
        while named and named[0][0] < markers_before_ms:
            self._expire_named(heapq.heappop(named)[1])
        self.markers.expire(markers_before_ms)

    def _expire_named(self, key: str) -> None:
        """A named interaction whose request never came."""
        rid = self.named_rid.get(key)
        if rid is not None and rid not in self.requests:
            del self.named_rid[key]
            waiting = [it for it in self.named[rid] if it.event_id != key]
            if waiting:
                self.named[rid] = waiting
            else:
                del self.named[rid]
            self.fielded.discard(key)
            self.delete("i:" + key)

    def take_loose(self, taken: Sequence[tuple[str, PendingInteraction]]) -> None:
        """Request-less interactions (user id, interaction) attributed to a finalised
        request: they join no other (remembered as seen, so a redelivery is a
        duplicate)."""
        gone = [it for uid, it in taken if self._forget_loose(uid, it.event_id)]
        self.mark_seen([it.event_id for it in gone], [it.timestamp_ms for it in gone])

    def _forget_loose(self, user_id: str, event_id: str) -> bool:
        """Drop a loose interaction (False: not held, or held for another user)."""
        if self.loose_user.get(event_id) != user_id:
            return False
        del self.loose_user[event_id]
        user = self.users[user_id]
        del user.loose[event_id]
        self.delete("l:" + event_id)
        self._drop_if_empty(user_id, user)
        return True

    def drop_history_before(self, before_ms: int) -> None:
        """Forget the histories of users with no relevant interaction since
        ``before_ms`` (users with nothing else kept are dropped): the cold-start
        history's TTL. A user active all along keeps their earliest interactions, so
        stays established as in replay."""
        for uid, user in list(self.users.items()):
            if user.history and max(user.history[-1][0], user.active_ms) < before_ms:
                user.history, user.active_ms = [], 0
                self._write_history(uid, user)
                self.changes["a:" + uid] = None
                self._drop_if_empty(uid, user)

    def unwritten(self) -> int:
        """Changelog fields and segment rows waiting for the next flush."""
        pending = self.markers.pending() + self.exposed.pending()
        return len(self.changes) + len(self.fresh) + len(self.waiting) + len(self.counted) + pending

    def flush(self) -> Changes:
        """The changes since the last flush (and forget them); requests opened since then
        and still open are encoded now."""
        out, self.changes = self.changes, {}
        self.fresh_chunks += self.requests.take_built()
        if self.requests.recoded:
            request_log.rewrite(self, out)
        elif self.fresh:
            request_log.write_fresh(self, out)
        self.fresh, self.fresh_chunks = set(), []
        request_log.write_book(self, out)
        activity.write(self, out)
        if self.waiting:
            self._write_waiting(out)
        self.markers.write(out, self.segment_rows)
        if self.exposed.write(out):
            self.markers.write_seed(out)
        self.born = set()
        return out

    def _write_waiting(self, out: Changes) -> None:
        """The interactions naming an open request that came since the last flush: one
        segment (or several of :attr:`segment_rows`), deleted once the watermark has
        passed the deadline of every request they name."""
        rows = [(eid, rid, *it[1:]) for eid, (rid, it) in self.waiting.items()]
        self.waiting = {}
        times = self.requests.times([row[1] for row in rows])  # each still open
        delay = self.delay_ms
        for start in range(0, len(rows), self.segment_rows):
            part = rows[start : start + self.segment_rows]
            name = f"j:{self.next_interaction_segment}"
            self.next_interaction_segment += 1
            out[name] = _encode(part)
            last = max(t for t in times[start : start + self.segment_rows] if t is not None)
            last += delay
            heapq.heappush(self.segments, (last, name))


__all__ = ["Changes", "PartitionState", "UserState"]
