"""The sync and async clients of a scheduler actor `scheduler/{scope}` (`jobs.scheduler(scope)`,
`jobs.async_scheduler(scope)`).

The async client is the core; the sync one runs the same coroutines to completion. Refusals
come out as `SchedulerOperationError` (its `.error` a `SchedulerError`), an actor that does not
answer as `SchedulerUnavailableError`; no Ray exception type leaks. Like a jobs manager, a
scheduler keeps the storage and options of the connection that created it, and a client of a
connection with others raises `JobsManagerConflictError`.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Collection, Coroutine
from datetime import datetime, timedelta
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from choreography_ray.client import call_actor, manager_conflict
from choreography_ray.errors import InvalidRequestError, SchedulerUnavailableError
from choreography_ray.job import Job
from choreography_ray.options import JobsOptions
from choreography_ray.runtime.actors import LazyHandle
from choreography_ray.runtime.names import scheduler_name
from choreography_ray.scheduler.records import (
    DeadLetter,
    Manifest,
    ManifestRun,
    RequeueResult,
    TriggerResult,
)
from choreography_ray.scheduler.schedules import schedule_of
from choreography_ray.scheduler.status import DeadLetterStatus
from choreography_ray.types import type_path

T = TypeVar("T")

#: Operations that may have run before an answer lost to an actor restart: not repeated (a
#: repeat would queue a second run, or report an error or a zero count for a call that
#: succeeded: an acknowledgement, the opt-out's count of cleared links).
_NOT_REPEATED = frozenset({
    "requeue", "requeue_all", "requeue_execution", "resume_execution", "acknowledge",
    "acknowledge_all", "set_replay_decisions_on_retry",
})  # fmt: skip


def job_type_and_request(
    job_type: type[Job[Any]] | str, request: BaseModel | dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The import path and the JSON request a manifest stores; a request is validated against
    a job type given as a class, so a bad one is refused when scheduled, not at each run."""
    payload = request.model_dump(mode="json") if isinstance(request, BaseModel) else request
    if isinstance(job_type, str):
        return job_type, payload
    try:
        validated = job_type.request_type().model_validate(payload)
    except ValidationError as error:
        raise InvalidRequestError(str(error)) from None
    return type_path(job_type), validated.model_dump(mode="json")


class AsyncScheduler:
    """The scheduler of one scope, with `async` methods."""

    def __init__(
        self, handle: Any, scope: str, expected: tuple[str, JobsOptions] | None = None
    ) -> None:
        self._handle = handle if isinstance(handle, LazyHandle) else LazyHandle.of(handle)
        self.scope = scope
        self._expected = expected

    def check(self, running: dict[str, str]) -> None:
        """Raises `JobsManagerConflictError` when the scheduler runs with another storage or
        other options than this connection's; after a successful check, no call checks again."""
        if self._expected is None:
            return
        storage, options = self._expected
        conflict = manager_conflict(
            scheduler_name(self.scope), running, storage, options, what="scheduler"
        )
        if conflict is not None:
            raise conflict
        self._expected = None

    async def _call(self, method: str, *args: Any) -> Any:
        return await call_actor(
            await self._handle.get(),
            method,
            args,
            what=f"scheduler {self.scope}",
            unavailable=SchedulerUnavailableError,
            check=self.check if self._expected is not None else None,
            wait_restart=method not in _NOT_REPEATED,
        )

    async def schedule(
        self,
        name: str,
        job_type: type[Job[Any]] | str,
        request: BaseModel | dict[str, Any],
        *,
        every: timedelta | float | None = None,
        cron: str | None = None,
        tz: str | None = None,
        once_at: datetime | None = None,
        after: str | None = None,
        namespace: str = "default",
        max_retries: int | None = None,
        failure_window: timedelta | None = None,
        replay_decisions_on_retry: bool | None = None,
        enabled: bool | None = None,
        timeout: timedelta | None = None,  # noqa: ASYNC109 (a manifest's setting, not a deadline)
    ) -> Manifest:
        """Upserts the manifest: its job type, request, schedule and namespace always; of its
        settings those stated here (an unstated one keeps its stored value; a new manifest
        takes the default). `timeout`: how long a run may take from its start (a run past it
        is stopped and settled CANCELLED; None: `SchedulerOptions.default_run_timeout`)."""
        schedule = schedule_of(every=every, cron=cron, tz=tz, once_at=once_at, after=after)
        path, payload = job_type_and_request(job_type, request)
        settings = {"namespace": namespace, "max_retries": max_retries,
                    "failure_window": failure_window,
                    "replay_decisions_on_retry": replay_decisions_on_retry,
                    "enabled": enabled, "timeout": timeout}  # fmt: skip
        manifest: Manifest = await self._call("schedule", name, path, payload, schedule, settings)
        return manifest

    async def manifests(self) -> builtins.list[Manifest]:
        found: builtins.list[Manifest] = await self._call("manifests")
        return found

    async def manifest(self, name: str) -> Manifest:
        found: Manifest = await self._call("manifest", name)
        return found

    async def runs(self, name: str | None = None, limit: int = 100) -> builtins.list[ManifestRun]:
        """Newest first."""
        found: builtins.list[ManifestRun] = await self._call("runs", name, limit)
        return found

    async def trigger(self, name: str, ask_afresh: bool = False) -> TriggerResult:
        result: TriggerResult = await self._call("trigger", name, ask_afresh)
        return result

    async def dead_letters(
        self, name: str | None = None, status: DeadLetterStatus | None = None
    ) -> builtins.list[DeadLetter]:
        found: builtins.list[DeadLetter] = await self._call("dead_letters", name, status)
        return found

    async def requeue(self, dead_letter_id: str, ask_afresh: bool = False) -> str:
        """Queues a run at once (no backoff) and resolves the dead letter; the new run's id."""
        run_id: str = await self._call("requeue", dead_letter_id, ask_afresh)
        return run_id

    async def acknowledge(self, dead_letter_id: str, note: str) -> None:
        await self._call("acknowledge", dead_letter_id, note)

    async def requeue_all(
        self, name: str | None = None, ask_afresh: bool = False
    ) -> builtins.list[str]:
        """Requeues every dead letter awaiting intervention (of manifest `name`, or of the
        scope), oldest first; the new runs' ids."""
        run_ids: builtins.list[str] = await self._call("requeue_all", name, ask_afresh)
        return run_ids

    async def acknowledge_all(self, name: str | None = None, *, note: str) -> int:
        """Acknowledges every dead letter awaiting intervention (of manifest `name`, or of the
        scope) with `note`; how many."""
        count: int = await self._call("acknowledge_all", name, note)
        return count

    async def requeue_execution(self, run_id: str, ask_afresh: bool = False) -> RequeueResult:
        result: RequeueResult = await self._call("requeue_execution", run_id, ask_afresh)
        return result

    async def resume_execution(self, run_id: str) -> str:
        new_run: str = await self._call("resume_execution", run_id)
        return new_run

    async def set_replay_decisions_on_retry(self, names: Collection[str], value: bool) -> str:
        message: str = await self._call("set_replay_decisions_on_retry", list(names), value)
        return message

    async def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = await self._call("stats")
        return stats


class Scheduler:
    """The sync client: each method runs its async twin to completion."""

    def __init__(self, inner: AsyncScheduler) -> None:
        self._inner = inner
        self.scope = inner.scope

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run(coro)

    def schedule(
        self,
        name: str,
        job_type: type[Job[Any]] | str,
        request: BaseModel | dict[str, Any],
        *,
        every: timedelta | float | None = None,
        cron: str | None = None,
        tz: str | None = None,
        once_at: datetime | None = None,
        after: str | None = None,
        namespace: str = "default",
        max_retries: int | None = None,
        failure_window: timedelta | None = None,
        replay_decisions_on_retry: bool | None = None,
        enabled: bool | None = None,
        timeout: timedelta | None = None,
    ) -> Manifest:
        """As `AsyncScheduler.schedule`."""
        return self._run(self._inner.schedule(
            name, job_type, request, every=every, cron=cron, tz=tz, once_at=once_at,
            after=after, namespace=namespace, max_retries=max_retries,
            failure_window=failure_window, replay_decisions_on_retry=replay_decisions_on_retry,
            enabled=enabled, timeout=timeout,
        ))  # fmt: skip

    def manifests(self) -> builtins.list[Manifest]:
        return self._run(self._inner.manifests())

    def manifest(self, name: str) -> Manifest:
        return self._run(self._inner.manifest(name))

    def runs(self, name: str | None = None, limit: int = 100) -> builtins.list[ManifestRun]:
        return self._run(self._inner.runs(name, limit))

    def trigger(self, name: str, ask_afresh: bool = False) -> TriggerResult:
        return self._run(self._inner.trigger(name, ask_afresh))

    def dead_letters(
        self, name: str | None = None, status: DeadLetterStatus | None = None
    ) -> builtins.list[DeadLetter]:
        return self._run(self._inner.dead_letters(name, status))

    def requeue(self, dead_letter_id: str, ask_afresh: bool = False) -> str:
        return self._run(self._inner.requeue(dead_letter_id, ask_afresh))

    def acknowledge(self, dead_letter_id: str, note: str) -> None:
        self._run(self._inner.acknowledge(dead_letter_id, note))

    def requeue_all(self, name: str | None = None, ask_afresh: bool = False) -> builtins.list[str]:
        return self._run(self._inner.requeue_all(name, ask_afresh))

    def acknowledge_all(self, name: str | None = None, *, note: str) -> int:
        return self._run(self._inner.acknowledge_all(name, note=note))

    def requeue_execution(self, run_id: str, ask_afresh: bool = False) -> RequeueResult:
        return self._run(self._inner.requeue_execution(run_id, ask_afresh))

    def resume_execution(self, run_id: str) -> str:
        return self._run(self._inner.resume_execution(run_id))

    def set_replay_decisions_on_retry(self, names: Collection[str], value: bool) -> str:
        return self._run(self._inner.set_replay_decisions_on_retry(names, value))

    def stats(self) -> dict[str, Any]:
        return self._run(self._inner.stats())
