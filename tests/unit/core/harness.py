"""One job activation under test: a job created in memory storage as the manager creates it, a
`JobCore` activated over it with `FakeHosts`, and the ways a test looks at and drives them.

The defaults keep a test deterministic and fast: the watchdog is off (a test calls
`core.watchdog_tick()` itself), progress is saved only with status changes or when the test
calls `save_progress()`, and a step retry is due at once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from choreography_ray.core.job import JobCore
from choreography_ray.core.metrics import NO_METRICS, Metrics
from choreography_ray.core.sharing import DEFAULT_PRIORITY
from choreography_ray.job import Job
from choreography_ray.model import JobState, ResumeAfter, StepState
from choreography_ray.options import JobsOptions
from choreography_ray.status import JobStatus
from choreography_ray.storage import CountedKind
from choreography_ray.storage.memory import MemoryStorage
from choreography_ray.types import type_path
from tests.unit.core import jobs
from tests.unit.core.fakes import FakeHosts

#: Options every activation gets unless the test says otherwise.
DEFAULTS: dict[str, Any] = {
    "job_watchdog_interval": 0,
    "progress_save_interval": 3600,
    "step_retry_backoff": 0,
}


class Harness:
    def __init__(
        self,
        job_id: str,
        storage: MemoryStorage,
        hosts: FakeHosts,
        options: JobsOptions,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self.job_id = job_id
        self.storage = storage
        self.hosts = hosts
        self.options = options
        self.metrics = metrics
        self.core: JobCore | None = None
        #: Every activation built for this job, the current one last.
        self.activations: list[JobCore] = []

    @property
    def c(self) -> JobCore:
        assert self.core is not None
        return self.core

    def build(self) -> JobCore:
        """A new activation of the job, not activated yet (the old one, if any, is gone: its
        tasks end). Calls made to it now are delivered while it activates."""
        if self.core is not None:
            self.core.close()
        core = JobCore(self.job_id, self.storage, self.hosts, self.options, metrics=self.metrics)
        self.core = core
        self.hosts.core = core
        self.activations.append(core)
        return core

    async def activate(self, reconstructed: bool = False) -> JobCore:
        """A new activation of the job, activated."""
        core = self.build()
        await core.activate(reconstructed)
        return core

    def close(self) -> None:
        for core in self.activations:
            core.close()

    @property
    def calls(self) -> Counter[str]:
        return jobs.calls(self.job_id)

    def control(self, hook: str, **behaviour: Any) -> jobs.Control:
        return jobs.control(self.job_id, hook, **behaviour)

    async def stored(self) -> JobState:
        state = await self.storage.get_job(self.job_id)
        assert state is not None, f"job {self.job_id} is not stored"
        return state

    async def status(self) -> JobStatus:
        return (await self.stored()).status

    async def steps(self) -> dict[str, StepState]:
        return dict(self.storage.steps.get(self.job_id, {}))

    async def counted(self, kind: CountedKind) -> list[str]:
        return await self.storage.list_counted(self.job_id, kind)

    async def save_progress(self) -> None:
        """The periodic progress save, now."""
        await self.c._save_progress()

    async def settle(self) -> None:
        assert await settle(), "the activation never settles: a turn or a timer spins"

    async def all_succeed(self) -> tuple[JobStatus, int]:
        """Every running step succeeds: the stored status and successful steps once the
        activation has settled."""
        await self.hosts.finish_all()
        await self.settle()
        stored = await self.stored()
        return stored.status, stored.progress.successful_steps


async def create(
    job_type: type[Job[Any]],
    request: BaseModel,
    *,
    storage: MemoryStorage | None = None,
    hosts: FakeHosts | None = None,
    resume_after: ResumeAfter | None = None,
    held: bool = False,
    metrics: Metrics = NO_METRICS,
    priority: int = DEFAULT_PRIORITY,
    fairness_key: str = "",
    **options: Any,
) -> Harness:
    """A job stored PREPARING_JOB (as `runtime/manager.py` creates it; after a checkpoint with
    `resume_after`; held for its starter with `held`; with its `priority` and `fairness_key`)
    and its activation."""
    storage = MemoryStorage() if storage is None else storage
    hosts = FakeHosts(storage) if hosts is None else hosts
    job_id = uuid.uuid4().hex
    state = JobState(
        id=job_id,
        scope="unit",
        namespace="core",
        type=type_path(job_type),
        request=request.model_dump(mode="json"),
        resume_after=resume_after,
        held=held,
        priority=priority,
        fairness_key=fairness_key,
    ).with_status(JobStatus.PREPARING_JOB)
    await storage.create_job(state)
    harness = Harness(job_id, storage, hosts, JobsOptions(**{**DEFAULTS, **options}), metrics)
    await harness.activate(False)
    return harness


async def settle(rounds: int = 3, limit: int = 20_000) -> bool:
    """Lets the event loop run until nothing is ready to run and no timer is due: every turn
    the last action set off has run (turns blocked on a gate stay blocked). False when the
    loop was still busy after `limit` rounds (something spins)."""
    loop = asyncio.get_running_loop()
    quiet = 0
    for _ in range(limit):
        await asyncio.sleep(0)
        ready = getattr(loop, "_ready", None)
        scheduled = getattr(loop, "_scheduled", [])
        due = any(h.when() <= loop.time() for h in scheduled if not h.cancelled())
        quiet = 0 if (ready or due) else quiet + 1
        if quiet >= rounds:
            return True
    return False


async def eventually(check: Callable[[], object], within: float = 5.0, what: str = "") -> None:
    """Waits (on the event loop) until `check()` is truthy; fails after `within` s."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what or check}")
        await asyncio.sleep(0.01)
