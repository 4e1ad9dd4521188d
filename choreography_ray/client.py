"""`Jobs.connect` and `Jobs.connect_async`, and the sync and async clients of a jobs manager.

The async client is the core; the sync one runs the same coroutines to completion. Nothing on
the async path blocks an event loop (an async actor's, in a Ray application): `connect_async`
and the async clients get actor handles in a worker thread (a named-actor lookup blocks on
Ray's GCS) and await actor calls, never `ray.get`.

A jobs manager is one actor per (scope, namespace) and keeps the storage and options of the
connection that created it. A client for a manager that runs with another storage or other
options raises `JobsManagerConflictError` rather than use them silently: `jobs.manager(...)` at
once, `jobs.async_manager(...)` at its first call.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import logging
import os
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import ray
from pydantic import BaseModel

from choreography_ray.bulk import BulkOperation, BulkResult, JobSelection, act_on, select_jobs
from choreography_ray.core.stopping import settled
from choreography_ray.errors import (
    ChoreographyError,
    JobsManagerConflictError,
    JobsManagerUnavailableError,
    JobTimeoutError,
    StartJobError,
)
from choreography_ray.failures import FailureCluster
from choreography_ray.job import Job
from choreography_ray.limit import Limit, LimitState
from choreography_ray.model import JobState, PoolState, StepOutput, StepState
from choreography_ray.options import JobsOptions
from choreography_ray.runtime import actors
from choreography_ray.runtime.actors import LazyHandle
from choreography_ray.runtime.names import DEFAULT_NAMESPACE, manager_name
from choreography_ray.runtime.recovery import ensure_recovery, ensure_recovery_async
from choreography_ray.status import JobStatus
from choreography_ray.storage import redact_url
from choreography_ray.types import type_path

if TYPE_CHECKING:
    import ray.data

    from choreography_ray.scheduler_client import AsyncScheduler, Scheduler

T = TypeVar("T")


#: Seconds a client waits for a jobs manager that Ray is restarting before it gives up.
MANAGER_RESTART_WAIT = 30.0


async def call_actor(
    handle: Any,
    method: str,
    args: tuple[Any, ...],
    *,
    what: str,
    unavailable: type[ChoreographyError],
    check: Callable[[dict[str, str]], None] | None = None,
    wait_restart: bool = True,
) -> Any:
    """`method` on one of our actors, after `check` of its `config()` (when given). An actor
    that Ray is restarting is waited for, up to `MANAGER_RESTART_WAIT` seconds (with
    `wait_restart`; a call that may have run before its answer was lost is not repeated); our
    own errors come out as they were raised, anything else as `unavailable`: no Ray exception
    type leaks."""
    deadline = time.monotonic() + MANAGER_RESTART_WAIT
    delay = 0.1
    while True:
        try:
            if check is not None:
                check(await handle.config.remote())
                check = None
            return await getattr(handle, method).remote(*args)
        except ray.exceptions.RayTaskError as error:
            cause = error.cause
            if isinstance(cause, ChoreographyError):
                raise cause from None
            raise unavailable(f"{method} on {what} failed: {cause!r}") from None
        except ray.exceptions.RayError as error:
            # The actor is restarting (or gone): its next incarnation answers.
            if not wait_restart or time.monotonic() >= deadline:
                raise unavailable(
                    f"{what} did not answer {method} within {MANAGER_RESTART_WAIT:g} s: "
                    f"{type(error).__name__}"
                ) from None
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


def default_storage_url() -> str:
    """`CHOREOGRAPHY_STORAGE`, else an SQLite file under the user's data directory."""
    url = os.environ.get("CHOREOGRAPHY_STORAGE")
    if url:
        return url
    base = Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share"))
    return f"sqlite:///{base / 'choreography-ray' / 'jobs.db'}"


def resolve_storage_url(url: str | None) -> str:
    """The storage URL the actors get: the default when none is given, and a relative SQLite
    path made absolute against this process's working directory (Ray workers run elsewhere)."""
    url = url or default_storage_url()
    prefix = "sqlite:///"
    if url.startswith(prefix):
        path = Path(url[len(prefix) :]).expanduser()
        return f"{prefix}{path if path.is_absolute() else path.resolve()}"
    return url


def manager_conflict(
    name: str,
    running: dict[str, str],
    storage: str,
    options: JobsOptions,
    what: str = "jobs manager",
) -> JobsManagerConflictError | None:
    """The error for a manager (or a scheduler: `what`) whose config (`config()`) is not this
    connection's storage and options, or None when they are the same."""
    differences: builtins.list[str] = []
    if running["storage"] != storage:
        differences.append(
            f"storage: running {redact_url(running['storage'])!r}, asked {redact_url(storage)!r}"
        )
    theirs = JobsOptions.model_validate_json(running["options"])
    fields = ["storage"] if differences else []
    for field in type(options).model_fields:
        if getattr(theirs, field) != getattr(options, field):
            fields.append(field)
            differences.append(
                f"{field}: running {getattr(theirs, field)!r}, asked {getattr(options, field)!r}"
            )
    if not differences:
        return None
    return JobsManagerConflictError(
        f"the {what} {name} runs with other settings than this connection's "
        f"({'; '.join(differences)}). A {what} keeps the storage and options of the "
        "connection that created it: connect with the same storage and options, or use "
        "another scope (or Ray namespace) for these.",
        fields,
    )


def _join_ray(address: str | None, namespace: str) -> bool:
    """Joins the Ray cluster at `address` unless this process has (a Ray worker always has);
    whether it did, so that `close` ends what it started."""
    if ray.is_initialized():
        return False
    ray.init(
        address=address,
        namespace=namespace,
        logging_level=logging.WARNING,
        log_to_driver=True,
        configure_logging=True,
    )
    return True


@dataclass(frozen=True, slots=True)
class StartedJob:
    job_id: str
    #: None, or the start error of the first stage (the job exists and runs anyway).
    error: StartJobError | None = None


class AsyncJobsManager:
    """The jobs manager of one (scope, namespace), with `async` methods. Its first call gets the
    manager's actor (in a worker thread, when `handle` is a `LazyHandle`) and checks that the
    manager runs with this connection's storage and options."""

    def __init__(
        self,
        handle: Any,
        scope: str,
        namespace: str,
        expected: tuple[str, JobsOptions] | None = None,
    ) -> None:
        self._handle = handle if isinstance(handle, LazyHandle) else LazyHandle.of(handle)
        self.scope = scope
        self.namespace = namespace
        #: The connection's (storage, options) to check the manager against; None once checked.
        self._expected = expected

    async def _call(self, method: str, *args: Any) -> Any:
        """`method` on the manager actor, once the manager's settings are checked. A manager
        that Ray is restarting is waited for, up to `MANAGER_RESTART_WAIT` seconds (but for
        `start`, which may have run before its answer was lost); the spec's errors come out as
        they were raised, and no Ray exception type leaks."""
        return await call_actor(
            await self._handle.get(),
            method,
            args,
            what=f"jobs manager {self.scope}/{self.namespace}",
            unavailable=JobsManagerUnavailableError,
            check=self.check if self._expected is not None else None,
            wait_restart=method != "start",
        )

    def check(self, running: dict[str, str]) -> None:
        """Raises `JobsManagerConflictError` when `running` (the manager's config) is not this
        connection's; after a successful check, no call checks again."""
        if self._expected is None:
            return
        storage, options = self._expected
        conflict = manager_conflict(
            manager_name(self.scope, self.namespace), running, storage, options
        )
        if conflict is not None:
            raise conflict
        self._expected = None

    async def start(
        self,
        job_type: type[Job[Any]],
        request: BaseModel | dict[str, Any],
        priority: int | None = None,
    ) -> StartedJob:
        """Starts a job of `job_type`; `priority` (1 first ... 5, None: the type's `priority`)
        orders its steps where steps wait for capacity (docs/sharing.md)."""
        payload = request.model_dump(mode="json") if isinstance(request, BaseModel) else request
        # None, None, False: the job id, checkpoint and hold only the scheduler passes.
        job_id, error = await self._call(
            "start", type_path(job_type), payload, None, None, False, priority
        )
        return StartedJob(job_id, error)

    async def get(self, job_id: str) -> JobState:
        state: JobState = await self._call("get", job_id)
        return state

    async def list(self, status: JobStatus | None = None) -> builtins.list[JobState]:
        jobs: builtins.list[JobState] = await self._call("list", status)
        return jobs

    async def steps(self, job_id: str) -> builtins.list[StepState]:
        steps: builtins.list[StepState] = await self._call("steps", job_id)
        return steps

    async def wait(self, job_id: str, timeout: float | None = None) -> JobState:  # noqa: ASYNC109
        """Returns at a terminal or stopped status; `JobTimeoutError` after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.02
        while True:
            state: JobState = await self._call("status", job_id)
            if settled(state):
                return state  # with its counted steps, as `get` has it
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeoutError(
                    f"job {job_id} is still {state.status}"
                    + (" (its stop not final yet)" if state.status is JobStatus.STOPPED else "")
                    + f" after {timeout} s"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    async def stop(self, job_id: str) -> None:
        await self._call("operate", job_id, "stop")

    async def resume(self, job_id: str) -> None:
        await self._call("operate", job_id, "resume")

    async def remove(self, job_id: str) -> None:
        await self._call("operate", job_id, "remove")

    async def retry_failed_steps(
        self,
        job_id: str,
        signature: str | None = None,
        step_ids: Iterable[str] | None = None,
    ) -> int:
        """Runs the job's failed steps again: all, those of a failure `signature`, or those
        among `step_ids` (both: those of the signature among them). Returns how many."""
        ids = None if step_ids is None else builtins.list(step_ids)
        count: int = await self._call("operate", job_id, "retry_failed_steps", signature, ids)
        return count

    async def failures(self, job_id: str) -> builtins.list[FailureCluster]:
        """The job's failed steps grouped by failure signature, most frequent first."""
        clusters: builtins.list[FailureCluster] = await self._call("failures", job_id)
        return clusters

    async def outputs(
        self,
        job_id: str,
        stage: int | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> builtins.list[StepOutput]:
        """A page of the job's outputs (of one stage) by step id, those after step `after`: at
        most `limit`; fewer means the last page (docs/outputs.md)."""
        outputs: builtins.list[StepOutput] = await self._call(
            "outputs", job_id, stage, after, limit
        )
        return outputs

    async def rehydrate(self) -> builtins.list[str]:
        """Loads the interrupted jobs and returns their ids; they resume in the background."""
        ids: builtins.list[str] = await self._call("rehydrate")
        return ids


class JobsManager:
    """The sync client: each method runs its async twin to completion."""

    def __init__(self, inner: AsyncJobsManager) -> None:
        self._inner = inner
        self.scope = inner.scope
        self.namespace = inner.namespace

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run(coro)

    def start(
        self,
        job_type: type[Job[Any]],
        request: BaseModel | dict[str, Any],
        priority: int | None = None,
    ) -> StartedJob:
        return self._run(self._inner.start(job_type, request, priority))

    def get(self, job_id: str) -> JobState:
        return self._run(self._inner.get(job_id))

    def list(self, status: JobStatus | None = None) -> builtins.list[JobState]:
        return self._run(self._inner.list(status))

    def steps(self, job_id: str) -> builtins.list[StepState]:
        return self._run(self._inner.steps(job_id))

    def wait(self, job_id: str, timeout: float | None = None) -> JobState:
        return self._run(self._inner.wait(job_id, timeout))

    def stop(self, job_id: str) -> None:
        self._run(self._inner.stop(job_id))

    def resume(self, job_id: str) -> None:
        self._run(self._inner.resume(job_id))

    def remove(self, job_id: str) -> None:
        self._run(self._inner.remove(job_id))

    def retry_failed_steps(
        self,
        job_id: str,
        signature: str | None = None,
        step_ids: Iterable[str] | None = None,
    ) -> int:
        return self._run(self._inner.retry_failed_steps(job_id, signature, step_ids))

    def failures(self, job_id: str) -> builtins.list[FailureCluster]:
        return self._run(self._inner.failures(job_id))

    def outputs(
        self,
        job_id: str,
        stage: int | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> builtins.list[StepOutput]:
        return self._run(self._inner.outputs(job_id, stage, after, limit))

    def rehydrate(self) -> builtins.list[str]:
        return self._run(self._inner.rehydrate())


class Jobs:
    """A connection to the job system on a Ray cluster. Use `Jobs.connect(...)`."""

    def __init__(self, storage: str, options: JobsOptions, namespace: str, owns_ray: bool) -> None:
        self.storage = storage
        self.options = options
        self.namespace = namespace
        self._owns_ray = owns_ray

    @classmethod
    def connect(
        cls,
        storage: str | None = None,
        options: JobsOptions | None = None,
        address: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> Jobs:
        """Joins the Ray cluster at `address` (or starts a local one, as `ray.init` does).

        It blocks until the recovery actor answers: on an event loop (inside an async actor of
        a Ray application), use `await Jobs.connect_async(...)` instead."""
        owns_ray = _join_ray(address, namespace)
        jobs = cls(resolve_storage_url(storage), options or JobsOptions(), namespace, owns_ray)
        # The recovery actor rehydrates this storage's interrupted jobs now, and after node loss.
        ensure_recovery(jobs.storage, jobs.options, namespace)
        return jobs

    @classmethod
    async def connect_async(
        cls,
        storage: str | None = None,
        options: JobsOptions | None = None,
        address: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> Jobs:
        """`connect` for code on an event loop, such as an async actor of a Ray application: the
        recovery actor is found (or created) in a worker thread and its answer awaited, so the
        loop never blocks. Use `jobs.async_manager(...)` on the result.

        Inside a Ray actor or task, Ray is joined already (`address` is not used). A driver that
        has not joined Ray yet joins it first, as `connect` does, on the calling thread (Ray
        expects `ray.init` on the main thread), which blocks while Ray starts: call `ray.init`
        before the loop runs where that matters."""
        owns_ray = _join_ray(address, namespace)
        jobs = cls(resolve_storage_url(storage), options or JobsOptions(), namespace, owns_ray)
        await ensure_recovery_async(jobs.storage, jobs.options, namespace)
        return jobs

    def _manager_handle(self, scope: str, namespace: str) -> Any:
        return actors.manager_actor(
            scope, namespace, self.storage, self.options.model_dump_json(), self.namespace
        )

    def async_manager(self, scope: str, namespace: str) -> AsyncJobsManager:
        """The async client. It blocks nothing: its first call gets (or creates) the manager's
        actor in a worker thread, and raises `JobsManagerConflictError` if the manager runs with
        another storage or other options than this connection's."""
        handle = LazyHandle(functools.partial(self._manager_handle, scope, namespace))
        return AsyncJobsManager(handle, scope, namespace, (self.storage, self.options))

    def manager(self, scope: str, namespace: str) -> JobsManager:
        """The sync client; raises `JobsManagerConflictError` if the manager runs with another
        storage or other options than this connection's."""
        inner = self.async_manager(scope, namespace)
        inner.check(ray.get(inner._handle.get_sync().config.remote()))
        return JobsManager(inner)

    def outputs_dataset(self, job_id: str, stage: int | None = None) -> ray.data.Dataset:
        """The job's outputs (of one stage) as a Ray Dataset of rows `job_id, step_id, stage,
        attempt, output`, streamed from storage by parallel read tasks when it is consumed
        (docs/outputs.md). Any job id is read: one with no outputs is an empty Dataset."""
        from choreography_ray.datasets import outputs_dataset

        return outputs_dataset(self.storage, self.namespace, job_id, stage)

    def pools(self) -> builtins.list[PoolState]:
        """The pools of step hosts in this connection's Ray namespace, by resource shape:
        hosts, pending hosts, busy and queued steps (docs/pools.md)."""
        from choreography_ray.runtime.pools import list_pools

        return list_pools(self.namespace)

    def set_limit(self, name: str, limit: Limit) -> None:
        """Changes the named limit `name` on the running cluster (this connection's Ray
        namespace): the limiter answers the hosts' next asks with it, within a second, and keeps
        it over its own restarts. It beats `JobsOptions.limits[name]` from now on
        (docs/pools.md#limits-across-the-cluster)."""
        from choreography_ray.runtime.limits import set_limit

        set_limit(self.namespace, name, Limit.model_validate(limit))

    def limits(self) -> builtins.list[LimitState]:
        """Every limit the cluster's limiter counts: named ones, each step type's own and per
        key, with the permits held, the steps waiting and the keys holding or waiting most."""
        from choreography_ray.runtime.limits import limit_states

        return limit_states(self.namespace)

    def async_scheduler(self, scope: str) -> AsyncScheduler:
        """The async client of `scheduler/{scope}`. Like `async_manager`, it blocks nothing: its
        first call gets (or creates) the actor in a worker thread, and raises
        `JobsManagerConflictError` if the scheduler runs with another storage or options."""
        from choreography_ray.scheduler_client import AsyncScheduler

        handle = LazyHandle(
            functools.partial(
                actors.scheduler_actor,
                scope,
                self.storage,
                self.options.model_dump_json(),
                self.namespace,
            )
        )
        return AsyncScheduler(handle, scope, (self.storage, self.options))

    def scheduler(self, scope: str) -> Scheduler:
        """The sync client of `scheduler/{scope}`; raises `JobsManagerConflictError` if the
        scheduler runs with another storage or other options than this connection's."""
        from choreography_ray.scheduler_client import Scheduler

        inner = self.async_scheduler(scope)
        inner.check(ray.get(inner._handle.get_sync().config.remote()))
        return Scheduler(inner)

    # acting on many jobs (choreography_ray.bulk)
    async def select_jobs_async(self, selection: JobSelection) -> builtins.list[JobState]:
        """The stored jobs `selection` names, newest first, read from this connection's
        storage. Its `older_than` is the time since a job reached its current status."""
        from choreography_ray.runtime.shared_storage import open_shared_storage

        storage = open_shared_storage(self.storage, self.namespace)
        try:
            return await select_jobs(storage, selection)
        finally:
            await storage.close()

    def select_jobs(self, selection: JobSelection) -> builtins.list[JobState]:
        return asyncio.run(self.select_jobs_async(selection))

    async def act_on_jobs_async(
        self,
        operation: BulkOperation | str,
        selection: JobSelection,
        *,
        dry_run: bool = False,
        signature: str | None = None,
        step_ids: Iterable[str] | None = None,
    ) -> builtins.list[BulkResult]:
        """`operation` on each job `selection` names, in turn, through its jobs manager (as
        `async_manager` reaches it). A job whose operation is refused is reported in its result
        (`error`, `message`), not raised, and the others still run. `dry_run` reports the
        selected jobs, none acted on. `signature` and `step_ids` narrow `retry_failed_steps`
        as they narrow `manager.retry_failed_steps`."""
        operation = BulkOperation(operation)
        retry = operation is BulkOperation.RETRY_FAILED_STEPS
        if not retry and (signature is not None or step_ids is not None):
            raise ValueError("signature and step_ids narrow retry_failed_steps only")
        ids = None if step_ids is None else builtins.list(step_ids)
        managers: dict[tuple[str, str], AsyncJobsManager] = {}

        async def perform(job: JobState) -> int | None:
            key = (job.scope, job.namespace)
            if key not in managers:
                managers[key] = self.async_manager(*key)
            if retry:
                return await managers[key].retry_failed_steps(job.id, signature, ids)
            await getattr(managers[key], operation.method)(job.id)
            return None

        jobs = await self.select_jobs_async(selection)
        return await act_on(operation, jobs, None if dry_run else perform)

    def act_on_jobs(
        self,
        operation: BulkOperation | str,
        selection: JobSelection,
        *,
        dry_run: bool = False,
        signature: str | None = None,
        step_ids: Iterable[str] | None = None,
    ) -> builtins.list[BulkResult]:
        """`act_on_jobs_async` run to completion."""
        return asyncio.run(
            self.act_on_jobs_async(
                operation, selection, dry_run=dry_run, signature=signature, step_ids=step_ids
            )
        )

    def close(self) -> None:
        if self._owns_ray:
            ray.shutdown()

    def __enter__(self) -> Jobs:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
