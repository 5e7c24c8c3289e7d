"""Finalisation beside ingestion: on a thread, or in a child process.

Finalisation reads only the store: the watermark comes from the partition
progress that ingestion records, and every due request is claimed atomically.
So it needs no order with the batches, and their offsets may be committed before
it runs (a request left open by a crash is finalised by whoever runs next).

``evaluator run`` on Redis finalises in a child process: finalisation (loading,
scoring, commit payloads) is about half of the Python work per event, and in a
process of its own it no longer shares the consumer's GIL. With the embedded
store (one process's memory) it runs on a thread. Both keep ingestion at most
``lead`` batches ahead of the last finished round, which bounds the open
requests a slow finalisation can leave behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Protocol

from evaluator.config import Settings
from evaluator.pipeline import Pipeline

log = logging.getLogger("evaluator.finalise")

IDLE_ROUND_S = 0.2
"""With nothing ingested, a round still runs this often (idle partitions move the watermark)."""
RETRY_S = 0.5
MAX_RESTART_S = 30.0


class Finaliser(Protocol):
    """What the applier needs from finalisation."""

    def ingested(self) -> None:
        """One more batch is durable in the store: worth a round."""

    def wait_turn(self, stop: threading.Event) -> None:
        """Block while ingestion is more than ``lead`` batches ahead of finalisation."""

    def close(self) -> None:
        """One last round (what the last batches made due), then stop."""


class _Pace:
    """Batches ingested against batches finalisation has caught up with."""

    def __init__(self, lead: int) -> None:
        self.lead = lead
        self.cond = threading.Condition()
        self.submitted = 0
        self.caught_up = 0
        """Batches ingested before the start of the last round that finished."""

    def ingested(self) -> int:
        with self.cond:
            self.submitted += 1
            self.cond.notify_all()
            return self.submitted

    def caught(self, target: int) -> None:
        with self.cond:
            self.caught_up = max(self.caught_up, target)
            self.cond.notify_all()

    def wait_turn(self, stop: threading.Event) -> None:
        with self.cond:
            while self.submitted - self.caught_up > self.lead and not stop.is_set():
                self.cond.wait(IDLE_ROUND_S)


def _round(pipeline: Pipeline) -> bool:
    """Finalise what is due; False (logged, counted) if the store failed."""
    try:
        pipeline.finalise_due()
        return True
    except Exception as exc:  # retried by the caller; nothing is committed half-way
        pipeline.count_store_error()
        log.error("finalisation failed, will retry: %s", exc)
        return False


class FinaliserThread:
    """Finalisation on a thread of this process (the embedded store's choice)."""

    def __init__(self, pipeline: Pipeline, stop: threading.Event, lead: int = 4) -> None:
        self.pipeline, self.stop = pipeline, stop
        self.pace = _Pace(lead)
        self.closing = False
        self.thread = threading.Thread(target=self._loop, name="finalise", daemon=True)
        self.thread.start()

    def ingested(self) -> None:
        self.pace.ingested()

    def wait_turn(self, stop: threading.Event) -> None:
        self.pace.wait_turn(stop)

    def _loop(self) -> None:
        pace = self.pace
        while True:
            with pace.cond:
                if pace.caught_up == pace.submitted and not self.closing:
                    pace.cond.wait(IDLE_ROUND_S)
                target, last = pace.submitted, self.closing
            if not _round(self.pipeline) and not last:
                self.stop.wait(RETRY_S)
                continue
            pace.caught(target)
            if last:
                return

    def close(self) -> None:
        with self.pace.cond:
            self.closing = True
            self.pace.cond.notify_all()
        self.thread.join()


Stats = tuple[int, int, dict[str, int], int]
"""What a round adds to the process counters: finalised, late, outcomes, store errors."""


class FinaliserProcess:
    """Finalisation in a child process with its own store connection.

    The parent sends the count of ingested batches down a pipe; the child answers
    after each round with the count it caught up with and what the round added to
    the counters, which a reader thread merges into the parent's ``/metrics``. The
    child dies with the parent (``PR_SET_PDEATHSIG``, and the pipe's end of file),
    and is started again if it dies on its own.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        build: Callable[[Settings], Pipeline],
        lead: int = 4,
    ) -> None:
        self.pipeline, self.build = pipeline, build
        self.pace = _Pace(lead)
        self.closing = False
        self.conn, self.proc = self._start()
        self.reader = threading.Thread(target=self._read, name="finalise-reader", daemon=True)
        self.reader.start()

    def _start(self) -> tuple[Connection, Any]:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=child_main,
            args=(self.pipeline.settings, child, os.getpid(), self.build),
            name="evaluator-finalise",
            daemon=True,
        )
        proc.start()
        child.close()
        return parent, proc

    def ingested(self) -> None:
        submitted = self.pace.ingested()
        with contextlib.suppress(OSError):  # the child is gone; the reader restarts it
            self.conn.send(("ingested", submitted))

    def wait_turn(self, stop: threading.Event) -> None:
        self.pace.wait_turn(stop)

    def _read(self) -> None:
        delay = RETRY_S
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                if self.closing:
                    return
                self.proc.join()
                log.error(
                    "the finalisation process exited (code %s); starting it again in %.1fs",
                    self.proc.exitcode,
                    delay,
                )
                self.pace.caught(self.pace.submitted)  # never block ingestion on a dead child
                time.sleep(delay)
                delay = min(delay * 2, MAX_RESTART_S)
                self.conn, self.proc = self._start()
                continue
            delay = RETRY_S
            kind, target, stats = message
            self.pipeline.count_finalised(*stats)
            self.pace.caught(target)
            if kind == "bye":
                return

    def close(self) -> None:
        self.closing = True
        with contextlib.suppress(OSError):
            self.conn.send(("close", 0))
        self.reader.join()
        self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to kill this process when its parent dies (SIGKILL leaves no time to
    tell it), then make sure the parent did not die before the request was made."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the pipe's EOF still stops it
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        os._exit(0)


def child_main(
    settings: Settings,
    conn: Connection,
    parent_pid: int,
    build: Callable[[Settings], Pipeline],
) -> None:
    """The child process: a round after each ingested batch (or idle tick), then report."""
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from evaluator.logs import setup_logging

    setup_logging()
    pipeline = build(settings)
    submitted = done = 0
    closing = False
    before = _snapshot(pipeline)
    while True:
        try:  # wait for news (or the idle tick), then take everything queued
            ready = conn.poll(IDLE_ROUND_S if submitted == done and not closing else 0)
            while ready:
                kind, count = conn.recv()
                closing = closing or kind == "close"
                submitted = max(submitted, count)
                ready = conn.poll(0)
        except (EOFError, OSError):
            return  # the parent is gone
        target = submitted
        ok = _round(pipeline)
        done = target if ok else done
        after = _snapshot(pipeline)
        conn.send(("bye" if closing else "caught", done, _delta(before, after)))
        before = after
        if closing:
            return
        if not ok:
            time.sleep(RETRY_S)


Snapshot = tuple[int, int, Counter[str], int]


def _snapshot(pipeline: Pipeline) -> Snapshot:
    s = pipeline.stats
    return s.finalised, s.late, Counter(s.outcomes), s.store_errors


def _delta(before: Snapshot, after: Snapshot) -> Stats:
    return (
        after[0] - before[0],
        after[1] - before[1],
        dict(after[2] - before[2]),
        after[3] - before[3],
    )
