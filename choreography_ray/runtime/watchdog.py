"""The watchdog: a periodic task in each running job actor, and the resume-hook backoff.

Every `job_watchdog_interval` (and soon after the job activates as RUNNING) the job counts its
steps by status in storage with one query and settles what its in-memory counters missed: see
`JobCore.watchdog_tick`. A zero, negative or infinite interval turns it off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

#: Ticks skipped between retries of a failed `on_before_resuming_job_steps`, by failure count.
HOOK_SKIPS = (0, 1, 3, 7, 15)


class HookBackoff:
    """After the resume hook failed, retry it on the next tick, then skip 1, 3, 7, then 15."""

    def __init__(self) -> None:
        self.failures = 0
        self._skip = 0

    def failed(self) -> None:
        self.failures += 1
        self._skip = HOOK_SKIPS[min(self.failures - 1, len(HOOK_SKIPS) - 1)]

    def should_try(self) -> bool:
        """Called once per tick."""
        if self._skip > 0:
            self._skip -= 1
            return False
        return True

    def succeeded(self) -> None:
        self.failures = 0
        self._skip = 0


async def run_watchdog(
    interval: float, tick: Callable[[], Awaitable[None]], first_delay: float | None = None
) -> None:
    await asyncio.sleep(min(interval, 1.0) if first_delay is None else first_delay)
    while True:
        try:
            await tick()
        except Exception:
            log.exception("watchdog tick failed")
        await asyncio.sleep(interval)
