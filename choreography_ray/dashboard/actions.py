"""What the dashboard's buttons do: operations on jobs and dead letters, through the clients.

The pages read storage; the actions change state, so they go where the rules live: a job's
jobs manager (`AsyncJobsManager`) and a scope's scheduler (`AsyncScheduler`), reached in the
Ray cluster given by `--address`. The dashboard uses the actors that run there and never
creates one: a manager or scheduler made here would run with the dashboard's options rather
than the application's. An actor running on another storage than the dashboard's is refused
(it would act on other records than the page shows).

Ray's blocking calls (joining the cluster, finding an actor by name) run in a worker thread
(`asyncio.to_thread`); the operations themselves are awaited, so the server's event loop never
blocks.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from choreography_ray.client import AsyncJobsManager, call_actor
from choreography_ray.errors import (
    ChoreographyError,
    JobOperationError,
    JobsManagerUnavailableError,
    SchedulerOperationError,
)
from choreography_ray.limit import LimitState
from choreography_ray.logs import get_logger
from choreography_ray.model import PoolState
from choreography_ray.options import JobsOptions
from choreography_ray.runtime.names import (
    DEFAULT_NAMESPACE,
    LIMITER,
    job_name,
    manager_name,
    scheduler_name,
)
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler_client import AsyncScheduler
from choreography_ray.storage import redact_url

T = TypeVar("T")


class JobOperation(enum.StrEnum):
    """An action on one job; the value is its path segment."""

    #: `manager.stop(job_id)`.
    STOP = "stop"
    #: `manager.resume(job_id)`.
    RESUME = "resume"
    #: `manager.retry_failed_steps(job_id)`.
    RETRY_FAILED = "retry-failed"
    #: `manager.remove(job_id)`.
    REMOVE = "remove"


class DeadLetterOperation(enum.StrEnum):
    #: `scheduler.requeue(dead_letter_id, ask_afresh)`.
    REQUEUE = "requeue"
    #: `scheduler.acknowledge(dead_letter_id, note)`.
    ACKNOWLEDGE = "acknowledge"


log = get_logger(__name__)

#: Seconds a job actor has to say which pools its steps run on, before the page shows none.
POOLS_SECONDS = 3.0


class ActionRefused(Exception):
    """An operation that did not happen: `code` is the operation's error code
    (`JobIsNotRunning`, `NotSupported`, `DeadLetterAlreadyResolved`, ...) or the name of what
    went wrong (`NoJobsManager`, `JobsManagerUnavailableError`, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def refusal(error: ChoreographyError) -> ActionRefused:
    """An error of an operation as the page shows it."""
    if isinstance(error, JobOperationError | SchedulerOperationError):
        return ActionRefused(error.error.value, error.message or str(error))
    return ActionRefused(type(error).__name__, str(error))


class Actions(Protocol):
    """The operations behind the dashboard's buttons. Each returns what to tell the user and
    raises `ActionRefused` when the operation was refused or could not be asked."""

    async def operate(self, scope: str, namespace: str, job_id: str, op: JobOperation) -> str: ...

    async def retry_failures(self, scope: str, namespace: str, job_id: str, signature: str) -> str:
        """`manager.retry_failed_steps(job_id, signature=signature)`: one failure cluster."""

    async def requeue(self, scope: str, dead_letter_id: str, ask_afresh: bool) -> str: ...

    async def acknowledge(self, scope: str, dead_letter_id: str, note: str) -> str: ...

    async def requeue_all(self, scope: str, manifest: str | None, ask_afresh: bool) -> str:
        """Every dead letter awaiting intervention, of `manifest` or of the scope."""

    async def acknowledge_all(self, scope: str, manifest: str | None, note: str) -> str: ...

    async def scheduler_options(self, scope: str) -> SchedulerOptions | None:
        """The options of the scope's running scheduler, or None when none runs."""

    async def job_pools(self, job_id: str) -> list[PoolState]:
        """The pools a running job's steps run on (docs/pools.md); none when its actor is gone
        or does not answer within `POOLS_SECONDS`."""

    async def limits(self) -> list[LimitState]:
        """Every limit the cluster's limiter counts (`Jobs.limits`, docs/pools.md); none when
        no limiter runs or it does not answer within `POOLS_SECONDS`."""

    async def close(self) -> None: ...


class RayActions:
    """`Actions` through the clients of the actors running in a Ray cluster."""

    def __init__(
        self,
        storage_url: str,
        address: str | None = None,
        ray_namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        self.storage_url = storage_url
        self.address = address
        self.ray_namespace = ray_namespace
        self._joined = False
        self._joining = asyncio.Lock()
        #: The join a page asked for in the background (`job_pools`, `limits`), if any.
        self._join_task: asyncio.Task[None] | None = None
        self._managers: dict[tuple[str, str], AsyncJobsManager] = {}
        self._schedulers: dict[str, AsyncScheduler] = {}

    async def connect(self) -> None:
        """Joins the cluster (unless this process is in one already)."""
        async with self._joining:
            await asyncio.to_thread(self.join)

    def join(self) -> None:
        """`connect` in this thread. The command joins so, in its main thread: a Ray it starts
        (`--address local`) has processes that Linux ends with the thread that started them."""
        import ray

        if not ray.is_initialized():
            ray.init(
                address=self.address,
                namespace=self.ray_namespace,
                logging_level=logging.WARNING,
                log_to_driver=False,
            )
            self._joined = True

    async def close(self) -> None:
        if self._join_task is not None:  # a join under way ends first, then is undone
            await asyncio.gather(self._join_task, return_exceptions=True)
        if self._joined:
            import ray

            await asyncio.to_thread(ray.shutdown)
            self._joined = False

    async def operate(self, scope: str, namespace: str, job_id: str, op: JobOperation) -> str:
        manager = await self._manager(scope, namespace)
        try:
            if op is JobOperation.STOP:
                await manager.stop(job_id)
                return f"Stop of job {job_id} requested"
            if op is JobOperation.RESUME:
                await manager.resume(job_id)
                return f"Job {job_id} resumed"
            if op is JobOperation.REMOVE:
                await manager.remove(job_id)
                return f"Job {job_id} removed"
            count = await manager.retry_failed_steps(job_id)
            return f"{count:,} failed step(s) of job {job_id} run again"
        except ChoreographyError as error:
            if not isinstance(error, JobOperationError):
                self._managers.pop((scope, namespace), None)  # found afresh next time
            raise refusal(error) from error

    async def retry_failures(self, scope: str, namespace: str, job_id: str, signature: str) -> str:
        manager = await self._manager(scope, namespace)
        try:
            count = await manager.retry_failed_steps(job_id, signature=signature)
        except ChoreographyError as error:
            if not isinstance(error, JobOperationError):
                self._managers.pop((scope, namespace), None)  # found afresh next time
            raise refusal(error) from error
        return f"{count:,} failed step(s) of job {job_id} with failure {signature!r} run again"

    async def _on_scheduler(self, scope: str, call: Callable[[AsyncScheduler], Awaitable[T]]) -> T:
        """`call` on the scope's scheduler; its error as the page shows it."""
        scheduler = await self._scheduler(scope)
        try:
            return await call(scheduler)
        except ChoreographyError as error:
            self._forget_scheduler(scope, error)
            raise refusal(error) from error

    async def requeue(self, scope: str, dead_letter_id: str, ask_afresh: bool) -> str:
        run_id = await self._on_scheduler(scope, lambda s: s.requeue(dead_letter_id, ask_afresh))
        afresh = ", asking its deciders afresh" if ask_afresh else ""
        return f"Dead letter {dead_letter_id} requeued as run {run_id}{afresh}"

    async def acknowledge(self, scope: str, dead_letter_id: str, note: str) -> str:
        await self._on_scheduler(scope, lambda s: s.acknowledge(dead_letter_id, note))
        return f"Dead letter {dead_letter_id} acknowledged"

    async def requeue_all(self, scope: str, manifest: str | None, ask_afresh: bool) -> str:
        run_ids = await self._on_scheduler(scope, lambda s: s.requeue_all(manifest, ask_afresh))
        afresh = ", asking their deciders afresh" if ask_afresh else ""
        return f"{len(run_ids)} dead letter(s) requeued{afresh}"

    async def acknowledge_all(self, scope: str, manifest: str | None, note: str) -> str:
        count = await self._on_scheduler(scope, lambda s: s.acknowledge_all(manifest, note=note))
        return f"{count} dead letter(s) acknowledged"

    async def scheduler_options(self, scope: str) -> SchedulerOptions | None:
        try:
            scheduler = await self._scheduler(scope)
            config: dict[str, str] = await scheduler._call("config")
        except (ActionRefused, ChoreographyError):
            return None
        return JobsOptions.model_validate_json(config["options"]).scheduler

    async def job_pools(self, job_id: str) -> list[PoolState]:
        """A page never waits for the cluster to be joined (seconds): until it is, it shows
        no pools and has it joined in the background."""
        import ray

        if not ray.is_initialized():
            self._join_in_background()
            return []
        actor = await self._actor(job_name(job_id))
        if actor is None:
            return []
        try:
            pools: list[PoolState] = await asyncio.wait_for(actor.pools.remote(), POOLS_SECONDS)
        except (TimeoutError, ray.exceptions.RayError):
            return []
        return pools

    async def limits(self) -> list[LimitState]:
        """`Jobs.limits` (`runtime.limits.limit_states`) as `job_pools` asks: a page never waits
        for the cluster to be joined, nor longer than `POOLS_SECONDS` for the limiter."""
        import ray

        if not ray.is_initialized():
            self._join_in_background()
            return []
        limiter = await self._actor(LIMITER)
        if limiter is None:
            return []
        try:
            states: list[LimitState] = await asyncio.wait_for(
                limiter.states.remote(), POOLS_SECONDS
            )
        except (TimeoutError, ray.exceptions.RayError) as error:
            log.warning("dashboard: the limiter did not say its limits: %r", error)
            return []
        return states

    def _join_in_background(self) -> None:
        if self._join_task is None or self._join_task.done():
            self._join_task = asyncio.get_running_loop().create_task(
                self.connect(), name="dashboard: join the cluster"
            )
            self._join_task.add_done_callback(_joined)

    # finding the actors
    def _forget_scheduler(self, scope: str, error: ChoreographyError) -> None:
        if not isinstance(error, SchedulerOperationError):
            self._schedulers.pop(scope, None)  # found afresh next time

    async def _actor(self, name: str) -> Any:
        import ray

        await self.connect()

        def find() -> Any:
            try:
                return ray.get_actor(name, namespace=self.ray_namespace)
            except ValueError:
                return None

        return await asyncio.to_thread(find)

    async def _checked_config(self, handle: Any, what: str) -> None:
        config: dict[str, str] = await call_actor(
            handle, "config", (), what=what, unavailable=JobsManagerUnavailableError
        )
        if config["storage"] != self.storage_url:
            raise ActionRefused(
                "OtherStorage",
                f"{what} runs on {redact_url(config['storage'])}, not on the dashboard's "
                f"{redact_url(self.storage_url)}",
            )

    async def _manager(self, scope: str, namespace: str) -> AsyncJobsManager:
        key = (scope, namespace)
        if key in self._managers:
            return self._managers[key]
        name = manager_name(scope, namespace)
        handle = await self._actor(name)
        if handle is None:
            raise ActionRefused(
                "NoJobsManager",
                f"no jobs manager {name} runs in the Ray cluster (Ray namespace "
                f"{self.ray_namespace}); the application's Jobs.connect starts it",
            )
        try:
            await self._checked_config(handle, f"jobs manager {name}")
        except ChoreographyError as error:
            raise refusal(error) from error
        manager = self._managers[key] = AsyncJobsManager(handle, scope, namespace)
        return manager

    async def _scheduler(self, scope: str) -> AsyncScheduler:
        if scope in self._schedulers:
            return self._schedulers[scope]
        name = scheduler_name(scope)
        handle = await self._actor(name)
        if handle is None:
            raise ActionRefused(
                "NoScheduler",
                f"no scheduler {name} runs in the Ray cluster (Ray namespace "
                f"{self.ray_namespace}); the application's jobs.scheduler(scope) starts it",
            )
        try:
            await self._checked_config(handle, f"scheduler {name}")
        except ChoreographyError as error:
            raise refusal(error) from error
        scheduler = self._schedulers[scope] = AsyncScheduler(handle, scope)
        return scheduler


def _joined(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.warning("%s failed (a later page asks again): %s", task.get_name(), error)
