"""Acting on many jobs: the jobs a `JobSelection` names, and one operation carried out on each.

The Python API (`jobs.select_jobs`, `jobs.act_on_jobs`), the CLI's bulk `jobs stop|resume|
remove|retry-failed` and the dashboard's bulk form all select through `select_jobs`, so they
cannot drift. It reads `Storage.find_jobs` page by page, newest first, with scope, namespace,
statuses and one full type path in the query; a class name and the age are filtered here.

A job's age is the time since it reached its current status (`JobState.status_since`), the
age retention measures: `older_than=timedelta(days=7)` with `statuses={COMPLETED_SUCCESSFULLY}`
names the jobs that completed more than a week ago, however old they are.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict

from choreography_ray.errors import ChoreographyError, JobOperationError, OperationErrorCode
from choreography_ray.model import JobState, utcnow
from choreography_ray.status import JobStatus
from choreography_ray.storage import JobCursor, JobFilter, Storage

#: Jobs read per `find_jobs` query.
PAGE = 500


class BulkOperation(enum.StrEnum):
    """What `act_on_jobs` does to each selected job. Also read from the jobs manager's method
    name: `BulkOperation("retry_failed_steps")`."""

    #: `manager.stop(job_id)`.
    STOP = "Stop"
    #: `manager.resume(job_id)`.
    RESUME = "Resume"
    #: `manager.remove(job_id)`.
    REMOVE = "Remove"
    #: `manager.retry_failed_steps(job_id, signature, step_ids)`.
    RETRY_FAILED_STEPS = "RetryFailedSteps"

    @classmethod
    def _missing_(cls, value: object) -> BulkOperation | None:
        return cls.__members__.get(value.upper()) if isinstance(value, str) else None

    @property
    def method(self) -> str:
        """The jobs manager's method."""
        return self.name.lower()


class JobSelection(BaseModel):
    """Which jobs a bulk operation acts on: every field that is not None narrows them (an
    empty selection is every stored job).

    `types` are import paths (`pkg.module:Class`) or class names. `older_than` keeps the jobs
    that reached their current status (`JobState.status_since`) at least that long ago."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scope: str | None = None
    namespace: str | None = None
    types: frozenset[str] | None = None
    statuses: frozenset[JobStatus] | None = None
    older_than: timedelta | None = None

    def matches(self, job: JobState, now: datetime) -> bool:
        """The selection applied to one record: what `select_jobs` keeps."""
        return (
            self.where().matches(job)
            and (self.types is None or any(type_matches(job.type, t) for t in self.types))
            and (self.older_than is None or job.status_since <= now - self.older_than)
        )

    def where(self) -> JobFilter:
        """The part of the selection the storage query does."""
        exact = next(iter(self.types)) if self.types is not None and len(self.types) == 1 else None
        return JobFilter(
            scope=self.scope,
            namespace=self.namespace,
            statuses=self.statuses,
            type=exact if exact is not None and ":" in exact else None,
        )


class BulkResult(BaseModel):
    """What a bulk operation did to one job. A refused operation is reported here, not raised:
    `error` is its error enum (`StopJobError.JOB_IS_NOT_RUNNING`, ...) when the jobs manager
    answered one, and `message` says why for any error of the library."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    scope: str
    namespace: str
    operation: BulkOperation
    #: Whether the operation was done (False for every job of a dry run).
    acted: bool
    #: `retry_failed_steps`: how many failed steps started again.
    retried_steps: int | None = None
    error: OperationErrorCode | None = None
    message: str | None = None


def type_matches(job_type: str, wanted: str) -> bool:
    """`wanted` is the job's import path or its class name."""
    return wanted in (job_type, job_type.rpartition(":")[2])


async def select_jobs(
    storage: Storage, selection: JobSelection, *, now: datetime | None = None
) -> list[JobState]:
    """The stored jobs `selection` names, newest first."""
    now = now or utcnow()
    where, before = selection.where(), None
    selected: list[JobState] = []
    while True:
        page = await storage.find_jobs(where, before=before, limit=PAGE)
        selected += [job for job in page if selection.matches(job, now)]
        if len(page) < PAGE:
            return selected
        before = JobCursor.of(page[-1])


async def act_on(
    operation: BulkOperation,
    jobs: Sequence[JobState],
    perform: Callable[[JobState], Awaitable[int | None]] | None,
) -> list[BulkResult]:
    """`perform` on each job in turn; a job whose operation fails with a library error is
    reported and the others still run. Without `perform` (a dry run), each job is reported as
    not acted on."""
    results: list[BulkResult] = []
    for job in jobs:
        if perform is None:
            results.append(_result(operation, job))
            continue
        try:
            value = await perform(job)
        except JobOperationError as error:
            result = _result(operation, job, error=error.error, message=error.message or str(error))
        except ChoreographyError as error:
            result = _result(operation, job, message=f"{type(error).__name__}: {error}")
        else:
            result = _result(operation, job, acted=True, retried_steps=value)
        results.append(result)
    return results


def _result(
    operation: BulkOperation,
    job: JobState,
    *,
    acted: bool = False,
    retried_steps: int | None = None,
    error: OperationErrorCode | None = None,
    message: str | None = None,
) -> BulkResult:
    return BulkResult(job_id=job.id, scope=job.scope, namespace=job.namespace,
                      operation=operation, acted=acted, retried_steps=retried_steps,
                      error=error, message=message)  # fmt: skip
