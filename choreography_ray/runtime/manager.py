"""The jobs-manager actor `jobs-manager/{scope}/{namespace}`: starts jobs, routes operations to
job actors, reads state from storage, and drains rehydration.

An operation whose answer the stored job decides is answered here, without a job actor: a
stop of a job that is not running, a resume of a completed job or of one being removed, and a
RetryFailedSteps the job type or the stored status refuses. The answers are the job
activation's own (`core.stopping.refuse_stop`, `core.resuming.resume_action`,
`core.resuming.check_retry_failed`), so they cannot drift apart. Only an operation that has
work to do activates the job; an actor created to refuse would stay (a detached process).

Every activation of a job actor goes through this manager, inside `claims.using(job_id)`, so
the cleanup pass (`core.cleanup`, a named periodic task every `cleanup_interval`) never removes
a job an operation here is using, and an operation waits for a removal in progress.
"""

from __future__ import annotations

import asyncio
import builtins
import time
import uuid
import warnings
from typing import Any

import ray
from pydantic import BaseModel, ValidationError
from pydantic_core import to_json

from choreography_ray.core.cleanup import Claims, Cleanup, CleanupPolicy, drops_records
from choreography_ray.core.metrics import (
    GAUGED_STATUSES,
    Counter,
    Histogram,
    Labels,
    WriteOperation,
    jobs_gauge,
)
from choreography_ray.core.resuming import Resume, check_retry_failed, resume_action
from choreography_ray.core.retries import STANDARD
from choreography_ray.core.sharing import check_priority
from choreography_ray.core.spares import SPARE_SECONDS, Spares
from choreography_ray.core.stopping import refuse_stop, settled
from choreography_ray.core.turns import Supervisor
from choreography_ray.errors import JobLookupError, JobOperationError, StartJobError
from choreography_ray.failures import FailureCluster
from choreography_ray.job import Job
from choreography_ray.logs import configure_actor, get_logger, ids
from choreography_ray.model import JobsManagerKey, JobState, ResumeAfter, StepOutput, StepState
from choreography_ray.options import JobsOptions
from choreography_ray.runtime import actors
from choreography_ray.runtime.membership import actor_exists
from choreography_ray.runtime.metrics import MetricsBatch, metrics_for, replay
from choreography_ray.runtime.names import job_name, manager_name
from choreography_ray.runtime.shared_storage import open_shared_storage
from choreography_ray.status import REHYDRATED_JOB, JobStatus
from choreography_ray.storage import CountedKind, JobFilter, step_pages
from choreography_ray.types import import_type

log = get_logger(__name__)

#: The operations `operate` routes to a job actor.
OPERATIONS = frozenset({"stop", "resume", "remove", "retry_failed_steps"})
#: Seconds between two settings of the `choreography_jobs` gauge from storage.
JOBS_GAUGE_SECONDS = 5.0
#: Seconds into a start at which the next spare job actor is made, when the start has answered.
REFILL_SECONDS = 0.05
#: Seconds between two reads of a large job's record (its start still preparing at
#: REFILL_SECONDS) until it is seen settled: the next spare may wait for that.
LARGE_JOB_READ_SECONDS = 5.0
#: Seconds a new spare job actor has to start and warm up (`JobCore.warm`); one that misses
#: it is not taken (it exits on its own after `SPARE_SECONDS`).
WARM_SECONDS = 60.0


class ManagerCore:
    def __init__(
        self, scope: str, namespace: str, storage_url: str, options_json: str, ray_namespace: str
    ) -> None:
        self.key = JobsManagerKey(scope=scope, namespace=namespace)
        self.storage_url = storage_url
        self.options_json = options_json
        self.options = JobsOptions.model_validate_json(options_json)
        self.storage = open_shared_storage(storage_url, ray_namespace)
        self.metrics = metrics_for(self.options)
        #: Job types the jobs gauge has reported: each keeps its series, at 0 once emptied.
        self._gauged_types: set[str] = set()
        self.tasks = Supervisor(manager_name(scope, namespace))
        self._job_args = (storage_url, options_json, ray_namespace)
        self._key_recorded = False
        self._rehydration: asyncio.Task[builtins.list[str]] | None = None
        self._drain: asyncio.Task[None] | None = None
        self.resuming = 0
        self.peak_resuming = 0
        #: The jobs the last drain dispatched, in order (`drain_stats`): each drain starts it
        #: afresh, so it never holds more than one pass's jobs.
        self.drained: builtins.list[str] = []
        #: Jobs this activation created and is starting: not interrupted, so never rehydrated
        #: (a rehydration would fail them for their missing plan before their start ran).
        self._starting: set[str] = set()
        self._ray_namespace = ray_namespace
        self.spares = Spares(self.options.spare_job_actors, SPARE_SECONDS / 2)
        self.claims = Claims()
        self.cleanup = Cleanup(
            self.storage,
            self.key,
            CleanupPolicy.of(self.options),
            self.claims,
            self._is_active,
            allowed_type_prefixes=self.options.allowed_type_prefixes,
        )

    async def _is_active(self, job_id: str) -> bool:
        """Whether the job's actor is alive (or restarting): a lookup in Ray's GCS."""
        return await asyncio.to_thread(actor_exists, job_name(job_id), self._ray_namespace)

    async def _record_key(self) -> None:
        if not self._key_recorded:
            await self.storage.add_manager_key(self.key)
            self._key_recorded = True

    async def job_actor(self, job_id: str) -> Any:
        """The job's actor, created (activated) if need be; the lookup runs off the loop."""
        return await asyncio.to_thread(actors.job_actor, job_id, *self._job_args)

    async def start(
        self,
        job_type: str,
        request: Any,
        job_id: str | None = None,
        resume_after: ResumeAfter | None = None,
        held: bool = False,
        priority: int | None = None,
    ) -> tuple[str, StartJobError | None]:
        """Starts a job; `job_id` (a fresh id) is the caller's choice when given: the
        scheduler links a run to its job before the job's steps can ask for it. A job type
        with `checkpoint_stages` starts after `resume_after`'s stage (the scheduler's retry
        of a failed run); another ignores it. `held`: the caller reads the job's outcome from
        storage and calls `release` once it has, so a job type that does not keep its
        finished records (`keep_after_completed` off) keeps them until then. `priority`
        (None: the type's) and the type's fairness key are stored with the job."""
        # Before anything is stored: a request is stored whole in the job's record.
        size = len(to_json(request, serialize_unknown=True))
        if size > self.options.max_request_bytes:
            limit = self.options.max_request_bytes
            raise JobOperationError(
                StartJobError.INVALID_REQUEST,
                f"the request is {size:,} bytes; the limit is max_request_bytes = {limit:,}",
            )
        await self._record_key()
        cls = import_type(job_type, self.options.allowed_type_prefixes)
        if not (isinstance(cls, type) and issubclass(cls, Job)):
            raise JobOperationError(StartJobError.UNKNOWN, f"{job_type} is not a Job")
        try:
            validated = cls.request_type().model_validate(request)
        except ValidationError as error:
            raise JobOperationError(StartJobError.INVALID_REQUEST, str(error)) from None
        priority, fairness_key = self._share(cls, job_type, validated, priority)
        self.spares.started(job_type)
        spare = None if job_id else self.spares.take(time.monotonic())
        job_id = job_id or (spare.job_id if spare else uuid.uuid4().hex)
        state = JobState(
            id=job_id,
            scope=self.key.scope,
            namespace=self.key.namespace,
            type=job_type,
            request=validated.model_dump(mode="json"),
            resume_after=resume_after if cls.checkpoint_stages else None,
            held=held and drops_records(cls),
            priority=priority,
            fairness_key=fairness_key,
        ).with_status(JobStatus.PREPARING_JOB)
        self._starting.add(job_id)
        try:
            async with self.claims.using(job_id):
                began = time.perf_counter()
                try:
                    await self.storage.create_job(state)
                except Exception as error:
                    raise JobOperationError(StartJobError.COULD_NOT_PERSIST, str(error)) from error
                self.metrics.observe(
                    Histogram.STORAGE_WRITE_SECONDS,
                    time.perf_counter() - began,
                    self._labels(job_type),
                    WriteOperation.CREATE_JOB,
                )
                actor = spare.handle if spare else await self.job_actor(job_id)
                asyncio.get_running_loop().call_later(
                    REFILL_SECONDS, self._refill_after, job_id, spare is not None
                )
                start_error: StartJobError | None = await actor.start.remote()
        finally:
            self._starting.discard(job_id)
        return job_id, start_error

    def _share(
        self, cls: type[Job[Any]], job_type: str, request: BaseModel, priority: int | None
    ) -> tuple[int, str]:
        """The job's priority (`priority`, else its type's) and fairness key (its type's
        `fairness_key`, asked of a job made as its actor makes it; else the namespace). A
        priority not from 1 to 5 (the start's or the type's), or a `fairness_key` that raises
        or returns no str, refuses the start (`INVALID_REQUEST`) before anything is stored or
        an id taken."""
        try:
            default = check_priority(cls.priority)
        except ValueError as error:
            message = f"{job_type}.priority: {error}"
            raise JobOperationError(StartJobError.INVALID_REQUEST, message) from None
        try:
            checked = default if priority is None else check_priority(priority)
        except ValueError as error:
            raise JobOperationError(StartJobError.INVALID_REQUEST, str(error)) from None
        try:
            job = cls()
            job.scope, job.namespace, job.options = self.key.scope, self.key.namespace, self.options
            key = job.fairness_key(request)
        except Exception as error:
            raise JobOperationError(
                StartJobError.INVALID_REQUEST, f"{job_type}.fairness_key raised {error!r}"
            ) from None
        if key is None:
            return checked, self.key.namespace
        if not isinstance(key, str):
            raise JobOperationError(
                StartJobError.INVALID_REQUEST,
                f"{job_type}.fairness_key returned {key!r}, not a str or None",
            )
        return checked, key

    def _refill_after(self, job_id: str, took_spare: bool) -> None:
        """REFILL_SECONDS into a start: the spare it took is replaced now (a small job's start
        has answered; the new process does not meet it, nor its caller's next call, a `wait`),
        or, for a large plan, once its job is seen settled (`Spares.large_start`)."""
        now = time.monotonic()
        waits = job_id in self._starting and self.spares.large_start(job_id, now, took_spare)
        if job_id in self.spares.large:
            self.tasks.spawn(f"large job {job_id}", self._watch_large(job_id))
        if not waits:
            self._refill_spares()

    async def _watch_large(self, job_id: str) -> None:
        """Reads a large job's record every LARGE_JOB_READ_SECONDS until it is seen settled
        (or gone), by this or by a caller's read (`_owned`); a failed read is tried again."""
        while job_id in self.spares.large:
            await asyncio.sleep(LARGE_JOB_READ_SECONDS)
            try:
                state = await self.storage.get_job(job_id)
            except Exception as error:
                log.warning("job %s: reading its record failed (%s); read again in %g s",
                            job_id, error, LARGE_JOB_READ_SECONDS)  # fmt: skip
                continue
            if state is None or settled(state):
                self._settled(job_id)

    def _settled(self, job_id: str) -> None:
        """A large job seen settled: the next spare is made now if it waited for the job."""
        if self.spares.settled(job_id, time.monotonic()):
            self._refill_spares()

    def _refill_spares(self) -> None:
        """Creates the spare job actors missing, in a named task (one at a time)."""
        if self.spares.missing() <= 0 or self.spares.creating:
            return

        async def refill() -> None:
            while self.spares.missing() > 0:
                job_id = uuid.uuid4().hex
                self.spares.creating += 1
                try:
                    handle = await asyncio.to_thread(
                        actors.job_actor, job_id, *self._job_args, spare=True
                    )
                    async with asyncio.timeout(WARM_SECONDS):
                        await handle.warm.remote(self.spares.recent_types())
                finally:
                    self.spares.creating -= 1
                self.spares.add(job_id, time.monotonic(), handle)

        self.tasks.spawn("spare job actors", refill())

    async def get(self, job_id: str) -> JobState:
        return await self._counted(await self._owned(job_id))

    async def _counted(self, state: JobState) -> JobState:
        job_id = state.id
        completed = await self.storage.list_counted(job_id, CountedKind.COMPLETED)
        stopped = await self.storage.list_counted(job_id, CountedKind.STOPPED)
        return state.model_copy(
            update={
                "completed_steps_counted": tuple(completed),
                "stopped_steps_counted": tuple(stopped),
            }
        )

    async def status(self, job_id: str) -> JobState:
        """What `wait` polls: the job record, with its counted-step lists once it is settled
        (`get`'s answer, in the same call)."""
        state = await self._owned(job_id)
        return await self._counted(state) if settled(state) else state

    async def _owned(self, job_id: str) -> JobState:
        state = await self.storage.get_job(job_id)
        if state is None or state.key != self.key:
            raise JobOperationError(JobLookupError.JOB_NOT_FOUND, f"no job {job_id} in {self.key}")
        if settled(state):
            self._settled(job_id)
        return state

    async def list(self, status: JobStatus | None = None) -> builtins.list[JobState]:
        return await self.storage.list_jobs(self.key.scope, self.key.namespace, status)

    async def steps(self, job_id: str) -> builtins.list[StepState]:
        await self._owned(job_id)
        return [step async for page in step_pages(self.storage, job_id) for step in page]

    async def failures(self, job_id: str) -> builtins.list[FailureCluster]:
        await self._owned(job_id)
        return await self.storage.failure_clusters(job_id)

    async def outputs(
        self, job_id: str, stage: int | None, after: str | None, limit: int
    ) -> builtins.list[StepOutput]:
        await self._owned(job_id)
        found = await self.storage.list_outputs(job_id, stage=stage, after=after, limit=limit)
        return [stored.parsed() for stored in found]

    async def operate(self, job_id: str, operation: str, *args: Any) -> Any:
        """stop, resume, remove or retry_failed_steps (with its arguments): answered from the
        stored job when that decides it, else on the job's actor (activated if need be)."""
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}")
        async with self.claims.using(job_id):
            state = await self._owned(job_id)
            if self._answered_from_storage(state, operation):
                return None
            actor = await self.job_actor(job_id)
            return await getattr(actor, operation).remote(*args)

    def _answered_from_storage(self, state: JobState, operation: str) -> bool:
        """Raises the job's own refusal, or returns True for an operation that does nothing
        (a resume of a completed job); False when the job actor has work to do."""
        if operation == "stop":
            refuse_stop(state)
        elif operation == "resume":
            # Not live here: only a completed job does nothing; REMOVING raises.
            return resume_action(state, explicit=True) is Resume.NOTHING
        elif operation == "retry_failed_steps":
            try:
                job_type = import_type(state.type, self.options.allowed_type_prefixes)
            except Exception:  # the job actor reports a type it cannot load, as it always has
                return False
            if issubclass(job_type, Job):  # checked before anything from storage is built
                check_retry_failed(job_type(), state)
        # remove always goes to the actor: on a job being removed it runs the finish again.
        return False

    def config(self) -> dict[str, str]:
        """The storage URL and options (JSON) this manager was created with."""
        return {"storage": self.storage_url, "options": self.options_json}

    # -- retention and dead-job cleanup -------------------------------------------------------

    def start_cleanup(self) -> None:
        """The cleanup pass every `cleanup_interval`, as the named task "cleanup": a pass that
        fails is logged by name and runs again after 1 s, doubling to 60 s."""
        interval = self.options.cleanup_seconds
        if interval is None or not self.cleanup.enabled:
            return
        self.tasks.repeat(
            "cleanup", lambda: asyncio.sleep(interval), self.cleanup.run_pass, STANDARD
        )

    def release(self, job_id: str) -> None:
        """The held job's starter has read its outcome (see `start`): the release runs in the
        background, as the named task "release {job_id}", retried while the job's actor is
        still alive."""
        self.tasks.spawn(f"release {job_id}", self.cleanup.release(job_id))

    def cleanup_stats(self) -> dict[str, Any]:
        return {
            "passes": self.cleanup.passes,
            "removed": {job_id: str(why) for job_id, why in self.cleanup.removed.items()},
            "failures": dict(self.tasks.failures),
        }

    # -- metrics ------------------------------------------------------------------------------

    def _labels(self, job_type: str) -> Labels:
        return Labels(self.key.scope, self.key.namespace, job_type)

    def watch_jobs(self) -> None:
        """Sets the jobs gauge from storage now and every `JOBS_GAUGE_SECONDS` (metrics on)."""
        if self.metrics.enabled:
            self.tasks.repeat(
                "jobs gauge", lambda: asyncio.sleep(JOBS_GAUGE_SECONDS), self.gauge_jobs, STANDARD
            )
            self.tasks.spawn("jobs gauge: first", self.gauge_jobs())

    def record_metrics(self, batch: MetricsBatch) -> None:
        """What a job actor of this key relayed (`runtime.job_actor`), recorded here."""
        replay(self.metrics, batch)

    async def gauge_jobs(self) -> None:
        """One count query; every job type seen keeps a series per status."""
        where = JobFilter(self.key.scope, self.key.namespace, frozenset(GAUGED_STATUSES))
        counts = await self.storage.count_jobs_by_type_and_status(where)
        for job_type, status, value in jobs_gauge(counts, self._gauged_types):
            self.metrics.jobs(value, self._labels(job_type), status)
            self._gauged_types.add(job_type)

    # -- rehydration --------------------------------------------------------------------------

    async def rehydrate(self) -> builtins.list[str]:
        """Loads the interrupted jobs and returns their ids; they resume in the background,
        oldest first, at most `max_concurrent_rehydration` at a time. Overlapping calls share
        one preparation and one drain."""
        await self._record_key()
        if self._rehydration is None or self._rehydration.done():
            if self._drain is not None and not self._drain.done() and self._rehydration:
                return self._rehydration.result()
            self._rehydration = asyncio.get_running_loop().create_task(
                self._prepare(), name=f"{self.tasks.owner}: rehydration"
            )
        return await asyncio.shield(self._rehydration)

    async def _prepare(self) -> builtins.list[str]:
        jobs = await self.storage.list_unsettled_jobs(self.key.scope, self.key.namespace)
        snapshot = [j.id for j in jobs if j.id not in self._starting]
        self._drain = self.tasks.spawn("drain", self._drain_jobs(snapshot))
        return snapshot

    async def _drain_jobs(self, job_ids: builtins.list[str]) -> None:
        limit = asyncio.Semaphore(max(1, self.options.max_concurrent_rehydration))
        self.drained = []

        async def one(job_id: str) -> None:
            async with limit:
                self.resuming += 1
                self.peak_resuming = max(self.peak_resuming, self.resuming)
                try:
                    async with self.claims.using(job_id):
                        # Reloaded before dispatch: a job finished meanwhile is left alone.
                        state = await self.storage.get_job(job_id)
                        if (
                            state is not None
                            and state.status in REHYDRATED_JOB
                            and job_id not in self._starting
                        ):
                            self.drained.append(job_id)
                            actor = await self.job_actor(job_id)
                            await actor.recover.remote()
                            self.metrics.count(Counter.REHYDRATIONS, 1, self._labels(state.type))
                except Exception as error:
                    # Left in storage: the next pass, or reconciliation, resumes it.
                    log.warning("rehydrating job %s failed: %s", job_id, error,
                                extra=ids(job_id))  # fmt: skip
                finally:
                    self.resuming -= 1

        loop = asyncio.get_running_loop()
        tasks: builtins.list[asyncio.Task[None]] = []
        for job_id in job_ids:  # oldest first: each waits its turn at the semaphore in order
            tasks.append(loop.create_task(one(job_id), name=f"{self.tasks.owner}: drain {job_id}"))
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)


@ray.remote
class JobsManagerActor:
    """A thin shell over `ManagerCore`; created by `actors.manager_actor`."""

    def __init__(
        self, scope: str, namespace: str, storage_url: str, options_json: str, ray_namespace: str
    ) -> None:
        configure_actor()
        self.core = ManagerCore(scope, namespace, storage_url, options_json, ray_namespace)
        self.core.watch_jobs()
        with warnings.catch_warnings():  # Ray 2.60 reads its own deprecated `actor_id` here
            warnings.simplefilter("ignore")
            restarted = ray.get_runtime_context().was_current_actor_reconstructed
        if restarted:
            # A manager killed mid-drain comes back and drains again from storage.
            self.core.tasks.spawn("restart rehydration", self.core.rehydrate())
        self.core.start_cleanup()

    async def start(
        self,
        job_type: str,
        request: Any,
        job_id: str | None = None,
        resume_after: ResumeAfter | None = None,
        held: bool = False,
        priority: int | None = None,
    ) -> tuple[str, StartJobError | None]:
        return await self.core.start(job_type, request, job_id, resume_after, held, priority)

    async def get(self, job_id: str) -> JobState:
        return await self.core.get(job_id)

    async def status(self, job_id: str) -> JobState:
        return await self.core.status(job_id)

    async def list(self, status: JobStatus | None = None) -> builtins.list[JobState]:
        return await self.core.list(status)

    async def steps(self, job_id: str) -> builtins.list[StepState]:
        return await self.core.steps(job_id)

    async def failures(self, job_id: str) -> builtins.list[FailureCluster]:
        return await self.core.failures(job_id)

    async def outputs(
        self, job_id: str, stage: int | None, after: str | None, limit: int
    ) -> builtins.list[StepOutput]:
        return await self.core.outputs(job_id, stage, after, limit)

    async def operate(self, job_id: str, operation: str, *args: Any) -> Any:
        return await self.core.operate(job_id, operation, *args)

    async def rehydrate(self) -> builtins.list[str]:
        return await self.core.rehydrate()

    async def config(self) -> dict[str, str]:
        return self.core.config()

    async def release(self, job_id: str) -> None:
        self.core.release(job_id)

    async def cleanup_stats(self) -> dict[str, Any]:
        """Cleanup passes run, the jobs they (and releases) removed with why, and background
        tasks that failed (name: last error)."""
        return self.core.cleanup_stats()

    async def record_metrics(
        self,
        counts: builtins.list[tuple[str, int, Labels, str]],
        observations: builtins.list[tuple[str, float, Labels, str]],
    ) -> None:
        """A job actor's metrics, recorded in this long-lived process (see `job_actor`)."""
        self.core.record_metrics((counts, observations))

    async def spares(self) -> builtins.list[str]:
        """The ids of the spare job actors ready for the next starts."""
        return self.core.spares.ready()

    async def drain_stats(self) -> dict[str, Any]:
        """The rehydration drain as observed: order of dispatch and peak concurrency."""
        done = self.core._drain is None or self.core._drain.done()
        return {"drained": self.core.drained, "peak": self.core.peak_resuming, "done": done}
