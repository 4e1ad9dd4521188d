"""The job actor `job/{job_id}`: a thin Ray shell over `core.job.JobCore`.

It builds the core with its storage and the Ray hosts, feeds it the calls it gets, and exits
once its job is terminal, stopped for good or removed (its record stays, but for a removal).
"""

from __future__ import annotations

import asyncio
import logging
import time
import warnings

import ray

from choreography_ray.core.job import JobCore
from choreography_ray.errors import StartJobError
from choreography_ray.model import JobState
from choreography_ray.options import JobsOptions
from choreography_ray.runtime.hosts import RayHosts
from choreography_ray.runtime.messages import OutcomeWire, outcomes_from_wire
from choreography_ray.runtime.metrics import EXPORT_MARGIN, export_seconds, metrics_for
from choreography_ray.runtime.shared_storage import open_shared_storage

log = logging.getLogger(__name__)

#: Seconds between an exit being asked for and the actor exiting: the call that finished the job
#: answers first, and an operation that reopens the job (retry-failed, resume) cancels the exit.
EXIT_GRACE = 1.0


@ray.remote
class JobActor:
    def __init__(self, job_id: str, storage_url: str, options_json: str, namespace: str) -> None:
        options = JobsOptions.model_validate_json(options_json)
        storage = open_shared_storage(storage_url, namespace)
        hosts = RayHosts(storage_url, options, namespace)
        self.hosts = hosts
        self.core = JobCore(
            job_id, storage, hosts, options, on_exit=self._exit_soon, metrics=metrics_for(options)
        )
        with warnings.catch_warnings():  # Ray 2.60 reads its own deprecated `actor_id` here
            warnings.simplefilter("ignore")
            reconstructed = ray.get_runtime_context().was_current_actor_reconstructed
        self.core.tasks.spawn("activate", self.core.activate(reconstructed))

    def _exit_soon(self) -> None:
        asyncio.get_running_loop().call_later(
            EXIT_GRACE, lambda: self.core.tasks.spawn("exit", self._exit())
        )

    def _unexported(self) -> float:
        """Seconds until this process has exported the last counts it recorded (Ray exports a
        process's metrics once per interval; a kill before that loses them); 0 when it has."""
        recorded = self.core.tally.recorded_at
        if recorded is None:
            return 0.0
        return max(0.0, recorded + export_seconds() + EXPORT_MARGIN - time.monotonic())

    async def _exit(self) -> None:
        for _ in range(3):  # a count recorded while it waits (a late report) is waited for too
            wait = self._unexported()
            if wait <= 0:
                break
            await asyncio.sleep(wait)
        async with self.core.turns.turn("exit"):
            if self.core.exit_requested:
                try:
                    await self.hosts.release_job(self.core.job_id)
                except Exception:
                    log.exception(
                        "job %s: releasing its dedicated step actors failed", self.core.job_id
                    )
                self.core.close()
                ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    async def start(self) -> StartJobError | None:
        return await self.core.start()

    async def report_outcomes(self, outcomes: list[OutcomeWire]) -> None:
        await self.core.report_outcomes(outcomes_from_wire(outcomes))

    async def stop(self) -> None:
        await self.core.stop()

    async def resume(self) -> None:
        await self.core.resume(explicit=True)

    async def recover(self) -> None:
        await self.core.recover()

    async def remove(self) -> None:
        await self.core.remove()

    async def retry_failed_steps(self) -> int:
        return await self.core.retry_failed_steps()

    async def state(self) -> JobState:
        return await self.core.ready()

    async def watchdog_ticks(self) -> int:
        return self.core.ticks

    async def tick(self) -> None:
        """Runs one watchdog tick now (tests, and the recovery reconciliation)."""
        await self.core.watchdog_tick()

    async def active_steps(self) -> int:
        return len(self.core.window.active)

    async def task_failures(self) -> dict[str, str]:
        """The background tasks that failed, by name, with their last error."""
        return dict(self.core.tasks.failures)
