"""The watchdog: a periodic task in each running job actor, and the resume-hook backoff.

Every `job_watchdog_interval` (and soon after the job activates as RUNNING) the job counts its
steps by status in storage with one query and settles what its in-memory counters missed: see
`JobCore.watchdog_tick`. A zero, negative or infinite interval turns it off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from choreography_ray.runtime import leases
from choreography_ray.runtime.job_base import JobBase
from choreography_ray.runtime.messages import Outcome
from choreography_ray.runtime.retries import FAILED_STATUSES
from choreography_ray.runtime.stages import UNFINISHED
from choreography_ray.status import JobStatus, StepStatus
from choreography_ray.storage import StatusCounts, step_pages

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


class WatchdogTick(JobBase):
    """The watchdog part of a job activation (see `JobCore`)."""

    async def watchdog_tick(self) -> None:
        self.ticks += 1
        state = self.state
        if state is None or state.status is not JobStatus.RUNNING:
            return
        if self.hook_owed:
            if not self.hook_backoff.should_try():
                return
            await self._run_resume_hook()
            if self.hook_owed:
                return
        if self.halted:
            return
        counts = await self.storage.count_by_status(self.job_id)
        if self._every_step_done(counts):
            # Every step of the stage is done in storage: recount from storage and move on.
            self.stages.recount(counts)
            await self._on_stage_done(state.stage)
            return
        await self._settle_lost_reports(counts)
        self._retry_failed_starts()
        if self.options.lease_seconds is not None:
            self._requeue(
                await leases.expired(
                    self.storage, self.job, self.job_id, state.stage, self.active, self.options
                )
            )
        if self.awaiting_admission is not None:
            await self._begin_stage(self.awaiting_admission)
        self.hosts.refresh()
        self._kick()

    def _every_step_done(self, counts: StatusCounts) -> bool:
        """Nothing runs or waits here, and storage holds no unfinished step of the stage."""
        assert self.state is not None
        stage = self.state.stage
        unfinished = (n for (s, st), n in counts.items() if s == stage and st in UNFINISHED)
        return self._idle() and not any(unfinished)

    async def _settle_lost_reports(self, counts: dict[tuple[int, StepStatus], int]) -> None:
        """Active steps whose outcome storage holds but whose report never arrived."""
        assert self.state is not None
        stage = self.state.stage
        stored_running = counts.get((stage, StepStatus.RUNNING), 0)
        candidates = {sid: entry for sid, entry in self.active.items() if entry[1]}
        if (
            stored_running
            >= len(candidates) - self._starts_in_flight * self.options.step_batch_size
        ):
            return
        running = {
            s.step_id
            async for page in step_pages(
                self.storage, self.job_id, statuses=UNFINISHED, stage=stage
            )
            for s in page
        }
        for step_id, (start, _host) in candidates.items():
            if step_id in running or step_id not in self.active:
                continue
            stored = await self.storage.get_step(self.job_id, step_id)
            if stored is None:
                self.accept(Outcome(step_id, start.attempt, StepStatus.COMPLETED_SUCCESSFULLY))
            elif stored.status in FAILED_STATUSES and stored.attempt == start.attempt:
                messages = (
                    stored.status_changes[-1].exception_messages if stored.status_changes else ()
                )
                self.accept(
                    Outcome(
                        step_id, start.attempt, stored.status, messages[0] if messages else None
                    )
                )
