"""The jobs-manager actor `jobs-manager/{scope}/{namespace}`: starts jobs, routes operations to
job actors, reads state from storage, and drains rehydration."""

from __future__ import annotations

import asyncio
import builtins
import logging
import uuid
import warnings
from typing import Any

import ray
from pydantic import ValidationError

from choreography_ray.errors import JobLookupError, JobOperationError, StartJobError
from choreography_ray.job import Job
from choreography_ray.model import JobsManagerKey, JobState, StepState
from choreography_ray.options import JobsOptions
from choreography_ray.runtime.job_actor import JobActor
from choreography_ray.runtime.names import actor_options, job_name
from choreography_ray.runtime.shared_storage import open_shared_storage
from choreography_ray.status import JobStatus
from choreography_ray.storage import CountedKind, step_pages
from choreography_ray.types import import_type

log = logging.getLogger(__name__)


class ManagerCore:
    def __init__(
        self, scope: str, namespace: str, storage_url: str, options_json: str, ray_namespace: str
    ) -> None:
        self.key = JobsManagerKey(scope=scope, namespace=namespace)
        self.options = JobsOptions.model_validate_json(options_json)
        self.storage = open_shared_storage(storage_url, ray_namespace)
        self._job_args = (storage_url, options_json, ray_namespace)
        self._ray_namespace = ray_namespace
        self._key_recorded = False
        self._rehydration: asyncio.Future[builtins.list[str]] | None = None
        self._drain: asyncio.Future[None] | None = None
        self.resuming = 0
        self.peak_resuming = 0
        self.drained: builtins.list[str] = []

    async def _record_key(self) -> None:
        if not self._key_recorded:
            await self.storage.add_manager_key(self.key)
            self._key_recorded = True

    def job_actor(self, job_id: str) -> Any:
        return JobActor.options(  # type: ignore[attr-defined]
            **actor_options(job_name(job_id), self._ray_namespace)
        ).remote(job_id, *self._job_args)

    async def start(self, job_type: str, request: Any) -> tuple[str, StartJobError | None]:
        await self._record_key()
        cls = import_type(job_type, self.options.allowed_type_prefixes)
        if not (isinstance(cls, type) and issubclass(cls, Job)):
            raise JobOperationError(StartJobError.UNKNOWN, f"{job_type} is not a Job")
        try:
            validated = cls.request_type().model_validate(request)
        except ValidationError as error:
            raise JobOperationError(StartJobError.INVALID_REQUEST, str(error)) from None
        job_id = uuid.uuid4().hex
        state = JobState(
            id=job_id,
            scope=self.key.scope,
            namespace=self.key.namespace,
            type=job_type,
            request=validated.model_dump(mode="json"),
        ).with_status(JobStatus.PREPARING_JOB)
        try:
            await self.storage.create_job(state)
        except Exception as error:
            raise JobOperationError(StartJobError.COULD_NOT_PERSIST, str(error)) from error
        start_error: StartJobError | None = await self.job_actor(job_id).start.remote()
        return job_id, start_error

    async def get(self, job_id: str) -> JobState:
        state = await self._owned(job_id)
        completed = await self.storage.list_counted(job_id, CountedKind.COMPLETED)
        stopped = await self.storage.list_counted(job_id, CountedKind.STOPPED)
        return state.model_copy(
            update={
                "completed_steps_counted": tuple(completed),
                "stopped_steps_counted": tuple(stopped),
            }
        )

    async def status(self, job_id: str) -> JobState:
        """The job record without its counted-step lists: what `wait` polls."""
        return await self._owned(job_id)

    async def _owned(self, job_id: str) -> JobState:
        state = await self.storage.get_job(job_id)
        if state is None or state.key != self.key:
            raise JobOperationError(JobLookupError.JOB_NOT_FOUND, f"no job {job_id} in {self.key}")
        return state

    async def list(self, status: JobStatus | None = None) -> builtins.list[JobState]:
        return await self.storage.list_jobs(self.key.scope, self.key.namespace, status)

    async def steps(self, job_id: str) -> builtins.list[StepState]:
        await self._owned(job_id)
        return [step async for page in step_pages(self.storage, job_id) for step in page]

    async def operate(self, job_id: str, operation: str) -> Any:
        """stop, resume, remove or retry_failed_steps, on the job's actor (activated if need be)."""
        await self._owned(job_id)
        return await getattr(self.job_actor(job_id), operation).remote()

    # -- rehydration --------------------------------------------------------------------------

    async def rehydrate(self) -> builtins.list[str]:
        """Loads the interrupted jobs and returns their ids; they resume in the background,
        oldest first, at most `max_concurrent_rehydration` at a time. Overlapping calls share
        one preparation and one drain."""
        await self._record_key()
        if self._rehydration is None or self._rehydration.done():
            if self._drain is not None and not self._drain.done() and self._rehydration:
                return self._rehydration.result()
            self._rehydration = asyncio.ensure_future(self._prepare())
        return await asyncio.shield(self._rehydration)

    async def _prepare(self) -> builtins.list[str]:
        jobs = await self.storage.get_jobs_excluding_finalized_stops(
            self.key.scope, self.key.namespace
        )
        snapshot = [
            j.id
            for j in sorted(jobs, key=lambda j: j.created)
            if j.status in _REHYDRATED and not (j.status is JobStatus.STOPPED and j.stop_finalized)
        ]
        self._drain = asyncio.ensure_future(self._drain_jobs(snapshot))
        return snapshot

    async def _drain_jobs(self, job_ids: builtins.list[str]) -> None:
        limit = asyncio.Semaphore(max(1, self.options.max_concurrent_rehydration))

        async def one(job_id: str) -> None:
            async with limit:
                self.resuming += 1
                self.peak_resuming = max(self.peak_resuming, self.resuming)
                try:
                    # Reloaded before dispatch: a job finished meanwhile is left alone.
                    state = await self.storage.get_job(job_id)
                    if state is not None and state.status in _REHYDRATED:
                        self.drained.append(job_id)
                        await self.job_actor(job_id).recover.remote()
                except Exception as error:
                    log.warning("rehydrating job %s failed: %s", job_id, error)
                finally:
                    self.resuming -= 1

        tasks: builtins.list[asyncio.Future[None]] = []
        for job_id in job_ids:  # oldest first: each waits its turn at the semaphore in order
            tasks.append(asyncio.ensure_future(one(job_id)))
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)


_REHYDRATED = frozenset(
    {
        JobStatus.RUNNING,
        JobStatus.PREPARING_JOB,
        JobStatus.PREPARING_STEPS,
        JobStatus.STARTING_STEPS,
        JobStatus.STOPPED,
        JobStatus.REMOVING,
    }
)


@ray.remote
class JobsManagerActor:
    def __init__(
        self, scope: str, namespace: str, storage_url: str, options_json: str, ray_namespace: str
    ) -> None:
        self.core = ManagerCore(scope, namespace, storage_url, options_json, ray_namespace)
        with warnings.catch_warnings():  # Ray 2.60 reads its own deprecated `actor_id` here
            warnings.simplefilter("ignore")
            restarted = ray.get_runtime_context().was_current_actor_reconstructed
        if restarted:
            # A manager killed mid-drain comes back and drains again from storage.
            self._restart_drain = asyncio.ensure_future(self.core.rehydrate())

    async def start(self, job_type: str, request: Any) -> tuple[str, StartJobError | None]:
        return await self.core.start(job_type, request)

    async def get(self, job_id: str) -> JobState:
        return await self.core.get(job_id)

    async def status(self, job_id: str) -> JobState:
        return await self.core.status(job_id)

    async def list(self, status: JobStatus | None = None) -> builtins.list[JobState]:
        return await self.core.list(status)

    async def steps(self, job_id: str) -> builtins.list[StepState]:
        return await self.core.steps(job_id)

    async def operate(self, job_id: str, operation: str) -> Any:
        return await self.core.operate(job_id, operation)

    async def rehydrate(self) -> builtins.list[str]:
        return await self.core.rehydrate()

    async def drain_stats(self) -> dict[str, Any]:
        """The rehydration drain as observed: order of dispatch and peak concurrency."""
        done = self.core._drain is None or self.core._drain.done()
        return {"drained": self.core.drained, "peak": self.core.peak_resuming, "done": done}
