"""A pool host's leaving: once it has held nothing (no step, start or job task) for
`pool_idle_timeout`, it refuses starts from then on and ends its actor for good, giving its
resources back to Ray so an autoscaler can remove its node. A host that cannot leave stays, and
takes steps again.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import ray

from choreography_ray.logs import get_logger

log = get_logger(__name__)

#: Ends the host's actor (`end_actor`).
Leave = Callable[[], Awaitable[None]]


async def end_actor() -> None:
    """Ends this actor for good: it is not restarted, and its resources go back to Ray."""
    me = ray.get_runtime_context().current_actor
    await asyncio.to_thread(ray.kill, me, no_restart=True)


class Leaving:
    """Whether the host leaves. `holds` are what keeps each job's entries on the host
    (`StepHostCore.holds`): the host holds nothing when it is empty."""

    def __init__(self, holds: Counter[str]) -> None:
        self._holds = holds
        #: A pool's host that was idle long enough: it takes no more steps, and leaves.
        self.leaving = False

    async def when_idle(self, idle_seconds: float, leave: Leave) -> None:
        """Calls `leave` once the host has held nothing for `idle_seconds`, refusing starts
        from then on; checked every quarter of it."""
        idle_since: float | None = None
        while True:
            await asyncio.sleep(max(idle_seconds / 4, 0.05))
            if self._holds:
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= idle_seconds:
                self.leaving = True
                log.info("pool host idle for %g s: leaving", idle_seconds)
                try:
                    await leave()
                except Exception as error:  # it stays, and takes steps again
                    log.warning("a pool host could not leave (it stays): %s", error)
                    self.leaving, idle_since = False, None
