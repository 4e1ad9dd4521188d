"""Runs a step's `perform` coroutine slice by slice.

The first slice runs at once, without a task: a step that never waits costs no task at all.
Every slice is timed, so a step that blocks the event loop (a slice longer than the limit) is
found out and recorded as failed when it ends. asyncio lets `KeyboardInterrupt` and `SystemExit`
out of a task into the event loop, which would end the host: under a task the driver raises
`PerformExit` instead, an ordinary exception carrying the original.
"""

from __future__ import annotations

import time
import types
from collections.abc import Coroutine, Generator
from typing import Any


class PerformExit(Exception):
    """The perform raised `KeyboardInterrupt` or `SystemExit` (in `error`) under its task."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


class SliceDriver:
    __slots__ = ("_coro", "longest_slice")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self.longest_slice = 0.0

    def step(self, value: Any = None, error: BaseException | None = None) -> tuple[bool, Any]:
        """Runs one slice: (True, result) when the coroutine returned, else (False, yielded).
        An exception of the coroutine propagates."""
        started = time.perf_counter()
        try:
            yielded = self._coro.send(value) if error is None else self._coro.throw(error)
        except StopIteration as stop:
            return True, stop.value
        finally:
            self.longest_slice = max(self.longest_slice, time.perf_counter() - started)
        return False, yielded

    @types.coroutine
    def finish(self, yielded: Any) -> Generator[Any, Any, Any]:
        """Continues the coroutine under the running task, from what its first slice yielded."""
        while True:
            try:
                value, error = (yield yielded), None
            except BaseException as thrown:  # asyncio throws cancellation in here
                value, error = None, thrown
            try:
                done, out = self.step(value, error)
            except (KeyboardInterrupt, SystemExit) as exit_:
                raise PerformExit(exit_) from exit_
            if done:
                return out
            yielded = out
