"""Run a function in a forked child process and collect its (picklable) result later.

Replay uses it to put the machine's second core to work: the child inherits the
parent's memory at fork time, so its inputs cost nothing to pass, and only the
result crosses a pipe. Where ``fork`` is unavailable the function runs inline.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Forked(Generic[T]):
    """A computation started now; :meth:`result` waits for it (or re-raises its error)."""

    def __init__(self, fn: Callable[[], T], parallel: bool = True) -> None:
        self._value: tuple[bool, T | str] | None = None
        self._proc: multiprocessing.process.BaseProcess | None = None
        if not parallel or "fork" not in multiprocessing.get_all_start_methods():
            self._value = (True, fn())
            return
        ctx = multiprocessing.get_context("fork")
        self._recv, send = ctx.Pipe(duplex=False)

        def child() -> None:
            try:
                payload: tuple[bool, object] = (True, fn())
            except BaseException as exc:  # reported to the parent, which re-raises
                payload = (False, f"{type(exc).__name__}: {exc}")
            send.send_bytes(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
            send.close()
            os._exit(0)  # skip interpreter teardown of the inherited heap

        self._proc = ctx.Process(target=child, daemon=True)
        self._proc.start()
        send.close()

    def result(self) -> T:
        if self._value is None:
            assert self._proc is not None
            try:
                data = self._recv.recv_bytes()
            except EOFError:
                self._proc.join()
                raise RuntimeError(
                    f"worker process died (exit code {self._proc.exitcode})"
                ) from None
            self._proc.join()
            self._value = pickle.loads(data)
        ok, value = self._value
        if not ok:
            raise RuntimeError(f"worker process failed: {value}")
        return value  # type: ignore[return-value]
