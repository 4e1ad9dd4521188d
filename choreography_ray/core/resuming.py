"""Resume, what rehydration does to one job, and RetryFailedSteps.

A resume recounts progress from storage, runs `on_before_resuming_job_steps` and rebuilds the
window at the stage the job had reached, steps that were running first; a step still running on
a live host is adopted rather than started twice. A job that is not stopped is resumed by
rehydration; a stopped or removing job has its stop finished instead, never both.
"""

from __future__ import annotations

import enum
from typing import Any

from choreography_ray.core.stages import Stages
from choreography_ray.errors import JobOperationError, ResumeJobError, RetryFailedStepsError
from choreography_ray.job import Job
from choreography_ray.model import JobState
from choreography_ray.status import JobStatus


class Resume(enum.Enum):
    #: Nothing to do: completed, already running here, or not to be resumed automatically.
    NOTHING = enum.auto()
    #: The job was interrupted before its plan was stored: it fails with MISSING_STEP_PLAN.
    MISSING_PLAN = enum.auto()
    RESUME = enum.auto()


def resume_action(state: JobState, explicit: bool) -> Resume:
    """What a resume of a job this activation does not drive does, by its status."""
    status = state.status
    if status in (JobStatus.COMPLETED_SUCCESSFULLY, JobStatus.COMPLETED_WITH_FAILURES):
        return Resume.NOTHING  # resuming a completed job does nothing
    if status is JobStatus.REMOVING:
        raise JobOperationError(ResumeJobError.JOB_IS_BEING_REMOVED)
    if not explicit and status in (JobStatus.STOPPED, JobStatus.FAILED):
        return Resume.NOTHING  # a stopped job resumes only when asked
    if not state.has_plan:
        return Resume.MISSING_PLAN
    return Resume.RESUME


class Recover(enum.Enum):
    NOTHING = enum.auto()
    FINISH_STOP = enum.auto()
    RESUME = enum.auto()


def recover_action(state: JobState) -> Recover:
    if state.status is JobStatus.REMOVING or (
        state.status is JobStatus.STOPPED and not state.stop_finalized
    ):
        return Recover.FINISH_STOP
    if state.status is JobStatus.RUNNING or state.status.is_preparing:
        return Recover.RESUME
    return Recover.NOTHING


def rebase_stops(stages: Stages, stopped_total: int, stage: int) -> None:
    """Stops counted in an earlier execution stay counted, at the stage the job had reached,
    until their step reports again."""
    for counter in stages.counters.values():
        counter.stopped = 0
    if stopped_total and stage in stages.counters:
        stages[stage].stopped = stopped_total


def check_retry_failed(job: Job[Any], state: JobState) -> None:
    if not job.can_retry_failed_steps:
        raise JobOperationError(RetryFailedStepsError.NOT_SUPPORTED)
    if state.status is not JobStatus.COMPLETED_WITH_FAILURES:
        raise JobOperationError(RetryFailedStepsError.JOB_IS_NOT_COMPLETED_WITH_FAILURES)
