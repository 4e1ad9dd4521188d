"""A pool host's leaving: once it has held nothing (no step, start or job task) for
`pool_idle_timeout`, or when asked (`leave_if_idle`) while it holds nothing, it refuses starts
from then on and ends its actor for good, giving its resources back to Ray so an autoscaler can
remove its node. A host that cannot leave stays, and takes steps again.

A host whose pool's lane kept failing is replaced instead (`runtime.lanes`): its process ends and
Ray starts the actor again (`restart_actor`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import ray

from choreography_ray.logs import get_logger
from choreography_ray.runtime.lanes import Spawn

log = get_logger(__name__)

#: Seconds a host that agreed to leave when asked waits before it ends: its answer reaches the
#: caller first.
REPLY_SECONDS = 0.5

#: Ends the host's actor (`end_actor`).
Leave = Callable[[], Coroutine[Any, Any, None]]
#: Seconds a new pool host that has held nothing stays at least, whatever its idle timeout.
UNUSED_SECONDS = 10.0


async def end_actor() -> None:
    """Ends this actor for good: it is not restarted, and its resources go back to Ray."""
    me = ray.get_runtime_context().current_actor
    await asyncio.to_thread(ray.kill, me, no_restart=True)


async def restart_actor() -> None:
    """Ends this actor's process so Ray starts the actor again (a new incarnation): the jobs
    watching it start its steps again. When Ray cannot be asked, the process exits: the actor
    is restarted all the same, and its steps never wait on a host that takes none."""
    me = ray.get_runtime_context().current_actor
    try:
        await asyncio.to_thread(ray.kill, me, no_restart=False)
    except Exception:
        log.exception("could not ask Ray to restart this host: exiting")
        os._exit(1)


class Leaving:
    """Whether the host leaves. `holds` are what keeps each job's entries on the host
    (`StepHostCore.holds`): the host holds nothing when it is empty. `end` ends the host."""

    def __init__(self, holds: Counter[str], spawn: Spawn, end: Leave = end_actor) -> None:
        self._holds = holds
        self._spawn = spawn
        self._end = end
        #: A pool's host that was idle long enough: it takes no more steps, and leaves.
        self.leaving = False
        #: Whether the host has held anything yet (`StepHostCore._hold` says so).
        self.used = False

    def if_idle(self) -> bool:
        """When the host holds nothing: refuses starts from now on, ends the host once this
        answer is sent, and returns True. Else returns False, and changes nothing."""
        if self._holds:
            return False
        self.leaving = True
        log.info("pool host holding nothing, asked to leave: leaving")
        self._spawn(self._end_after_reply(), "leave-if-idle", None)
        return True

    async def _end_after_reply(self) -> None:
        await asyncio.sleep(REPLY_SECONDS)
        try:
            await self._end()
        except Exception as error:  # it stays, and takes steps again
            log.warning("a pool host could not leave (it stays): %s", error)
            self.leaving = False

    async def when_idle(self, idle_seconds: float) -> None:
        """Ends the host once it has held nothing for `idle_seconds`, refusing starts from
        then on; checked every quarter of it. A host that has held nothing yet stays at least
        UNUSED_SECONDS: jobs learn of a new pool host from the pools' owner about a second
        after Ray places it."""
        leave = self._end
        idle_since: float | None = time.monotonic() + max(0.0, UNUSED_SECONDS - idle_seconds)
        while True:
            await asyncio.sleep(max(idle_seconds / 4, 0.05))
            if self._holds or self.used:
                # Idle from now: a step held and done between two looks counts as used.
                idle_since = None if self._holds else time.monotonic()
                self.used = False
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
