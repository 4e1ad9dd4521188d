"""A `SchedulerCore` on the memory storage with a fake jobs port and a clock the test moves.

`Harness.run_for(seconds)` steps the clock by the dispatch interval and runs the dispatcher at
every step and the manifest manager's cycle every `manifest_cycle`, as the loops would, without
waiting in real time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from choreography_ray.model import ResumeAfter
from choreography_ray.scheduler.core import SchedulerCore
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.port import DispatchError, JobView
from choreography_ray.status import JobStatus
from choreography_ray.storage.scheduler.memory import MemorySchedulerStorage
from tests.unit.scheduler.factory import T0

JOB = "pkg.jobs:Reindex"
#: Seconds a scenario may take before it fails.
SCENARIO_TIMEOUT = 20.0
SUCCEEDS = JobView(JobStatus.COMPLETED_SUCCESSFULLY)


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), SCENARIO_TIMEOUT))


class Clock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class Started:
    job_id: str
    manifest_request: dict[str, Any]
    at: datetime
    resume_after: ResumeAfter | None = None


@dataclass
class FakeJobs:
    """Jobs that end at once as `ends_as`; the next `unreachable` starts never reach a
    manager, the next `lost_answers` start their job but their answer is lost (a timeout), and
    `refuse` makes the manager refuse every job. The managers of the namespaces in `stuck`
    never answer a start; those in `slow` start the job, then never answer. A start of an id
    that exists is refused as the manager does (`JOB_ALREADY_EXISTS`, not reached)."""

    clock: Clock
    ends_as: JobView = SUCCEEDS
    unreachable: int = 0
    lost_answers: int = 0
    refuse: bool = False
    stuck: set[str] = field(default_factory=set)
    slow: set[str] = field(default_factory=set)
    jobs: dict[str, JobView] = field(default_factory=dict)
    started: list[Started] = field(default_factory=list)
    attempts: list[datetime] = field(default_factory=list)
    #: Per job type: how its jobs end, over `ends_as`.
    ends_by_type: dict[str, JobView] = field(default_factory=dict)
    types: list[str] = field(default_factory=list)
    #: Job types that opt into checkpoints (`checkpoint_stages`).
    checkpointing: set[str] = field(default_factory=set)
    #: Called with each started job's id, as the job's steps would run: before it returns.
    on_start: Callable[[str], Coroutine[Any, Any, None]] | None = None
    #: Jobs stopped (a run past its timeout), in order.
    stopped: list[str] = field(default_factory=list)
    #: Jobs released once their run settled, in order.
    released: list[str] = field(default_factory=list)
    #: Releases raise this (a jobs manager that cannot be reached).
    release_error: Exception | None = None

    async def start_job(
        self,
        scope: str,
        namespace: str,
        job_type: str,
        request: dict[str, Any],
        job_id: str,
        resume_after: ResumeAfter | None = None,
    ) -> str:
        self.attempts.append(self.clock())
        if namespace in self.stuck:
            await asyncio.Event().wait()
        if job_id in self.jobs:
            raise DispatchError(f"job {job_id} exists already", reached=False)
        if self.unreachable:
            self.unreachable -= 1
            raise DispatchError("the jobs manager did not answer", reached=False)
        if self.refuse:
            raise DispatchError("not a Job", reached=True)
        ends = self.ends_by_type.get(job_type, self.ends_as)
        if resume_after is not None and job_type in self.checkpointing:
            # As the job does: its stages up to the checkpoint's are counted as succeeded.
            done = {"is_started": True, "failed_steps": 0, "unreachable_steps": 0}
            skipped = [s.model_copy(update={**done, "successful_steps": s.total_steps})
                       if s.stage <= resume_after.stage else s for s in ends.stages]  # fmt: skip
            ends = replace(ends, stages=tuple(skipped), resumed_after=resume_after)
        self.jobs[job_id] = ends
        self.started.append(Started(job_id, request, self.clock(), resume_after))
        self.types.append(job_type)
        if self.on_start is not None:
            await self.on_start(job_id)
        if namespace in self.slow:
            await asyncio.Event().wait()
        if self.lost_answers:
            self.lost_answers -= 1
            raise TimeoutError("the jobs manager's answer was lost")
        return job_id

    async def job_views(self, job_ids: Collection[str]) -> dict[str, JobView]:
        return {j: self.jobs[j] for j in job_ids if j in self.jobs}

    async def stop_job(self, scope: str, namespace: str, job_id: str) -> None:
        """As the manager does: the job is stopped, and (no step holding it) its stop final."""
        self.stopped.append(job_id)
        stages = self.jobs[job_id].stages if job_id in self.jobs else ()
        self.jobs[job_id] = JobView(JobStatus.STOPPED, stop_finalized=True, stages=stages)

    async def release_job(self, scope: str, namespace: str, job_type: str, job_id: str) -> None:
        if self.release_error is not None:
            raise self.release_error
        self.released.append(job_id)

    def checkpoint_stages(self, job_type: str) -> bool:
        return job_type in self.checkpointing


class Harness:
    def __init__(self, **options: Any) -> None:
        values = {"manifest_cycle": 1, "dispatch_interval": 0.5, **options}
        self.options = SchedulerOptions(**values)
        self.clock = Clock()
        self.storage = MemorySchedulerStorage(self.clock)
        self.jobs = FakeJobs(self.clock)
        self.core = self.new_core("holder-1")
        self._elapsed = 0.0

    def new_core(self, holder: str) -> SchedulerCore:
        return SchedulerCore("s", self.storage, self.jobs, self.options, holder=holder)

    async def start(self) -> SchedulerCore:
        await self.core.start(loops=False)
        return self.core

    async def run_for(self, seconds: float) -> None:
        step = self.options.dispatch_interval.total_seconds()
        cycle = self.options.manifest_cycle.total_seconds()
        for _ in range(round(seconds / step)):
            if self._elapsed % cycle < 1e-9 or cycle - self._elapsed % cycle < 1e-9:
                # The lease is renewed as the lock's loop would (its expiry is on this clock).
                await self.core.lock.keep()
                await self.core.run_cycle()
            await self.core.dispatch_due()
            self.clock.advance(step)
            self._elapsed += step

    def starts(self) -> list[float]:
        """Seconds after T0 at which jobs were started."""
        return [(s.at - T0).total_seconds() for s in self.jobs.started]
