"""Turns and watched tasks: how an activation keeps one operation at a time and loses no task.

An Orleans grain is turn-based: one request at a time, awaits included. `Turns` gives a job
activation the same: every operation that changes its state runs inside `turn(name)`, and turns
run one after another in the order they asked (an asyncio lock is first come, first served).
A turn never enters another turn: the operations call plain methods, and only entry points take
a turn. Read-only queries run beside turns.

`Supervisor` names every background task of its owner; one that fails is logged with its name
and the owner's, and handed to its error handler, so nothing dies silently.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from choreography_ray.core.retries import Backoff
from choreography_ray.logs import get_logger

log = get_logger(__name__)


class Turns:
    def __init__(self, after: Callable[[], None] | None = None) -> None:
        self._lock = asyncio.Lock()
        #: The name of the turn running now (None between turns): what a log line can name.
        self.current: str | None = None
        #: Called as each turn ends, still inside it (the activation records its metrics).
        self._after = after
        #: Turns asked for and not begun yet, by name.
        self.waiting: Counter[str] = Counter()

    @asynccontextmanager
    async def turn(self, name: str) -> AsyncIterator[None]:
        self.waiting[name] += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting[name] -= 1
            if not self.waiting[name]:
                del self.waiting[name]
        try:
            self.current = name
            yield
        finally:
            self.current = None
            try:
                if self._after is not None:
                    self._after()
            finally:
                self._lock.release()


class Supervisor:
    """The background tasks of one owner (a job activation, a host, the recovery actor)."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.tasks: set[asyncio.Task[Any]] = set()
        #: Failed tasks by name, with their last error: what tests and operators can read.
        self.failures: dict[str, str] = {}

    def spawn(
        self,
        name: str,
        coro: Coroutine[Any, Any, Any],
        on_error: Callable[[BaseException], None] | None = None,
    ) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.owner}: {name}")
        self.tasks.add(task)
        task.add_done_callback(lambda t: self._done(name, t, on_error))
        return task

    def _done(
        self,
        name: str,
        task: asyncio.Task[Any],
        on_error: Callable[[BaseException], None] | None,
    ) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            return
        self.failures[name] = f"{type(error).__name__}: {error}"
        log.error("%s: task %r failed", self.owner, name, exc_info=error)
        if on_error is not None:
            on_error(error)

    def repeat(
        self,
        name: str,
        wait: Callable[[], Awaitable[object]],
        body: Callable[[], Awaitable[object]],
        backoff: Backoff,
    ) -> asyncio.Task[Any]:
        """Runs `body` after each `wait`, for as long as the owner lives. A body that fails is
        logged with its name and run again after the backoff (reset by a success)."""

        async def loop() -> None:
            failures = 0
            while True:
                if failures == 0:
                    await wait()
                try:
                    await body()
                except Exception as error:
                    failures += 1
                    self.failures[name] = f"{type(error).__name__}: {error}"
                    delay = backoff.delay(failures)
                    log.error(
                        "%s: %s failed (%d in a row); again in %.1f s",
                        self.owner,
                        name,
                        failures,
                        delay,
                        exc_info=error,
                    )
                    await asyncio.sleep(delay)
                else:
                    failures = 0

        return self.spawn(name, loop())

    def names(self) -> list[str]:
        """The names of the tasks running now, sorted (for tests and diagnosis)."""
        prefix = f"{self.owner}: "
        return sorted(task.get_name().removeprefix(prefix) for task in self.tasks)

    def cancel_all(self) -> None:
        for task in list(self.tasks):
            task.cancel()
