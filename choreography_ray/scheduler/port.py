"""What the scheduler needs of the job system: the jobs port, and how a job's end settles a run.

The scheduler's core starts each run as a job and reads the jobs' statuses through a small
injected `JobsPort`; the Ray shell implements it with the jobs manager of each manifest's
namespace, the unit tests with a fake. A start that fails raises `DispatchError`, which says
whether the jobs manager was reached: one that never was (the actor could not be reached,
storage refused the job) is requeued with the dispatch backoff; one the manager refused (an
unknown job type, a request that does not validate) is a failed run at once.

The scheduler starts its jobs *held*: a job type that does not keep its finished records
(`Job.keep_after_completed` or `keep_after_completed_with_failures` off) keeps them until the
run is settled from them, and `release_job` then drops them. Without the hold the records could
be gone before a cycle read them, and a success would settle as a cancellation (a removed job).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Protocol

from choreography_ray.model import ResumeAfter, StageProgress
from choreography_ray.scheduler.status import RunStatus
from choreography_ray.status import JobStatus


class DispatchError(Exception):
    """A run's job could not be started. `reached`: the jobs manager was reached and refused
    the job (a failed run); otherwise the dispatch is requeued."""

    def __init__(self, message: str, *, reached: bool) -> None:
        super().__init__(message)
        self.reached = reached


@dataclass(frozen=True, slots=True)
class JobView:
    """What the scheduler reads of a run's job."""

    status: JobStatus
    #: A stop is final: every running step reported its stop.
    stop_finalized: bool = False
    #: Its stages' progress: a failed run's completed stages are its checkpoints.
    stages: tuple[StageProgress, ...] = ()
    #: The checkpoint it started after; None when it ran from the top.
    resumed_after: ResumeAfter | None = None


class JobsPort(Protocol):
    async def start_job(
        self,
        scope: str,
        namespace: str,
        job_type: str,
        request: dict[str, Any],
        job_id: str,
        resume_after: ResumeAfter | None = None,
    ) -> str:
        """Starts a job of `job_type` (an import path) in (scope, namespace) with the id
        `job_id` (fresh, chosen by the dispatcher), after `resume_after`'s stage when given;
        its id. Raises `DispatchError`."""

    def checkpoint_stages(self, job_type: str) -> bool:
        """Whether the job type opts into checkpoints; False for one that cannot be imported."""

    async def job_views(self, job_ids: Collection[str]) -> dict[str, JobView]:
        """The jobs' statuses; a job that no longer exists (removed) is left out."""

    async def stop_job(self, scope: str, namespace: str, job_id: str) -> None:
        """Stops the job (a run past its timeout) through its jobs manager; raises when the
        stop was refused or the manager could not be reached."""

    async def release_job(self, scope: str, namespace: str, job_type: str, job_id: str) -> None:
        """The run of `job_id` is settled from its job: the job is no longer held, and a job
        type that does not keep its finished records has them dropped (in the background)."""


def run_status_of(view: JobView | None) -> RunStatus | None:
    """The status a run settles at when its job is `view` (None: the job was removed), or
    None while the job has not ended."""
    if view is None:
        return RunStatus.CANCELLED
    if view.status is JobStatus.COMPLETED_SUCCESSFULLY:
        return RunStatus.SUCCEEDED
    if view.status in (JobStatus.COMPLETED_WITH_FAILURES, JobStatus.FAILED):
        return RunStatus.FAILED
    if view.status is JobStatus.STOPPED and view.stop_finalized:
        return RunStatus.CANCELLED
    return None
