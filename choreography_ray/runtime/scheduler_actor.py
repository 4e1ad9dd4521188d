"""The scheduler actor `scheduler/{scope}`: a thin Ray shell over `scheduler.core.SchedulerCore`.

It builds the core with the scheduler storage beside the job storage and `RayJobsPort`, the
jobs port on the jobs manager of each manifest's namespace, and forwards its calls. Its holder
of the scope's lock is this activation: the actor's id and a token that sorts by its start, so
a restarted actor (Ray keeps its id) takes its predecessor's lease over at once, and calls
waiting across the restart are not refused `NOT_LOCK_HOLDER` for up to `lock_ttl`.
"""

from __future__ import annotations

import asyncio
import builtins
import time
import uuid
from collections.abc import Collection
from typing import Any

import ray

from choreography_ray.core.cleanup import drops_records
from choreography_ray.errors import JobOperationError, StartJobError, TypeImportError
from choreography_ray.job import Job
from choreography_ray.logs import configure_actor, get_logger
from choreography_ray.model import ResumeAfter
from choreography_ray.options import JobsOptions
from choreography_ray.runtime import actors
from choreography_ray.runtime.shared_storage import open_shared_storage, shared_scheduler_storage
from choreography_ray.scheduler.core import SchedulerCore
from choreography_ray.scheduler.port import DispatchError, JobView
from choreography_ray.scheduler.records import (
    DeadLetter,
    Manifest,
    ManifestRun,
    RequeueResult,
    TriggerResult,
)
from choreography_ray.scheduler.schedules import Schedule
from choreography_ray.scheduler.status import DeadLetterStatus
from choreography_ray.storage import Storage
from choreography_ray.types import import_type

log = get_logger(__name__)

#: Start errors by which the jobs manager refused the job itself: a failed run, not a dispatch
#: to try again. COULD_NOT_PERSIST (storage refused the job) is a dispatch that did not reach.
_REFUSED = frozenset({StartJobError.INVALID_REQUEST, StartJobError.UNKNOWN})


class RayJobsPort:
    """Starts jobs through `jobs-manager/{scope}/{namespace}`; reads their status from storage
    (the job record is the truth, and a finished job has no actor to ask)."""

    def __init__(self, storage: Storage, storage_url: str, options_json: str, ns: str) -> None:
        self.storage = storage
        self._manager_args = (storage_url, options_json, ns)
        options = JobsOptions.model_validate_json(options_json)
        self.allowed_type_prefixes = options.allowed_type_prefixes

    async def start_job(
        self,
        scope: str,
        namespace: str,
        job_type: str,
        request: dict[str, Any],
        job_id: str,
        resume_after: ResumeAfter | None = None,
    ) -> str:
        try:
            manager = await asyncio.to_thread(
                actors.manager_actor, scope, namespace, *self._manager_args
            )
            # Held: the run is settled from the job's stored outcome (see `release_job`).
            started, _ = await manager.start.remote(job_type, request, job_id, resume_after, True)
        except ray.exceptions.RayTaskError as error:
            cause = error.cause
            refused = isinstance(cause, TypeImportError) or (
                isinstance(cause, JobOperationError) and cause.error in _REFUSED
            )
            raise DispatchError(str(cause), reached=refused) from None
        except ray.exceptions.RayError as error:
            raise DispatchError(f"{type(error).__name__}: {error}", reached=False) from None
        # A start error of the first stage leaves a job that runs anyway: its end settles it.
        return str(started)

    async def job_views(self, job_ids: Collection[str]) -> dict[str, JobView]:
        views: dict[str, JobView] = {}
        for job_id in job_ids:
            state = await self.storage.get_job(job_id)
            if state is not None:
                # A job that failed before its plan was stored never resumed.
                resumed = state.resume_after if state.has_plan else None
                views[job_id] = JobView(state.status, state.stop_finalized,
                                        state.progress.stages, resumed)  # fmt: skip
        return views

    async def stop_job(self, scope: str, namespace: str, job_id: str) -> None:
        manager = await asyncio.to_thread(actors.manager_actor, scope, namespace,
                                          *self._manager_args)  # fmt: skip
        await manager.operate.remote(job_id, "stop")

    async def release_job(self, scope: str, namespace: str, job_type: str, job_id: str) -> None:
        # Only a job type that drops records is held (the manager decides so at its start).
        try:
            cls = import_type(job_type, self.allowed_type_prefixes)
        except Exception:
            return  # its manager could not start it either
        if not (isinstance(cls, type) and issubclass(cls, Job) and drops_records(cls)):
            return
        manager = await asyncio.to_thread(actors.manager_actor, scope, namespace,
                                          *self._manager_args)  # fmt: skip
        await manager.release.remote(job_id)

    def checkpoint_stages(self, job_type: str) -> bool:
        try:
            cls = import_type(job_type, self.allowed_type_prefixes)
        except Exception as error:
            log.warning("job type %s cannot be imported here (%s): its runs are not resumed "
                        "from checkpoints", job_type, error)  # fmt: skip
            return False
        return isinstance(cls, type) and issubclass(cls, Job) and cls.checkpoint_stages


@ray.remote
class SchedulerActor:
    """Created by `actors.scheduler_actor`."""

    def __init__(self, scope: str, storage_url: str, options_json: str, ns: str) -> None:
        configure_actor()
        self.storage_url = storage_url
        self.options_json = options_json
        options = JobsOptions.model_validate_json(options_json)
        storage = open_shared_storage(storage_url, ns)
        jobs = RayJobsPort(storage, storage_url, options_json, ns)
        actor_id = ray.get_runtime_context().get_actor_id()
        # A token that sorts by this activation's start: a restarted actor (same id) takes
        # its predecessor's lease over at once (`lease_for`).
        holder = f"{actor_id}/{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        self.core = SchedulerCore(
            scope, shared_scheduler_storage(storage), jobs, options.scheduler, holder=holder
        )
        self.core.tasks.spawn("start", self.core.start())

    async def schedule(
        self, name: str, job_type: str, request: dict[str, Any], schedule: Schedule,
        settings: dict[str, Any],
    ) -> Manifest:  # fmt: skip
        return await self.core.schedule(name, job_type, request, schedule, **settings)

    async def manifests(self) -> builtins.list[Manifest]:
        return await self.core.manifests()

    async def manifest(self, name: str) -> Manifest:
        return await self.core.manifest(name)

    async def runs(self, name: str | None, limit: int) -> builtins.list[ManifestRun]:
        return await self.core.runs(name, limit)

    async def trigger(self, name: str, ask_afresh: bool) -> TriggerResult:
        return await self.core.trigger(name, ask_afresh)

    async def dead_letters(
        self, name: str | None, status: DeadLetterStatus | None
    ) -> builtins.list[DeadLetter]:
        return await self.core.dead_letters(name, status)

    async def requeue(self, dead_letter_id: str, ask_afresh: bool) -> str:
        return await self.core.requeue(dead_letter_id, ask_afresh)

    async def acknowledge(self, dead_letter_id: str, note: str) -> None:
        await self.core.acknowledge(dead_letter_id, note)

    async def requeue_all(self, name: str | None, ask_afresh: bool) -> builtins.list[str]:
        return await self.core.requeue_all(name, ask_afresh)

    async def acknowledge_all(self, name: str | None, note: str) -> int:
        return await self.core.acknowledge_all(name, note=note)

    async def requeue_execution(self, run_id: str, ask_afresh: bool) -> RequeueResult:
        return await self.core.requeue_execution(run_id, ask_afresh)

    async def resume_execution(self, run_id: str) -> str:
        return await self.core.resume_execution(run_id)

    async def set_replay_decisions_on_retry(self, names: Collection[str], value: bool) -> str:
        return await self.core.set_replay_decisions_on_retry(names, value)

    async def config(self) -> dict[str, str]:
        """The storage URL and options (JSON) this scheduler was created with."""
        return {"storage": self.storage_url, "options": self.options_json}

    async def stats(self) -> dict[str, Any]:
        """Whether it holds the lock, its holder id, cycles run, runs started, dispatches
        requeued, and background tasks that failed (name: last error)."""
        return self.core.stats()

    async def close(self) -> None:
        """Stops the loops and releases the lock (tests; a cluster's shutdown does not)."""
        await self.core.close()
