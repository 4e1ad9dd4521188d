"""Stop and remove: persist the stop first, tell running steps, finish once all reported.

A stop counts never-started steps as stopped and pending retries as failed, runs `on_stopped`
once every step has reported, and records `stop_finalized`. A removal then clears the job. A
finish that fails is retried on one timer (1 s doubling to 60 s) until it succeeds; a removal's
failed finish also answers the step's report with an error, so its next report runs it again.
"""

from __future__ import annotations

from typing import NamedTuple

from choreography_ray.core.counting import Counting
from choreography_ray.core.stages import Stages
from choreography_ray.core.window import Window
from choreography_ray.errors import JobOperationError, StopJobError
from choreography_ray.model import JobState
from choreography_ray.status import JobStatus
from choreography_ray.storage import Storage


def refuse_stop(state: JobState) -> None:
    if state.status.is_terminal or state.status in (JobStatus.STOPPED, JobStatus.REMOVING):
        raise JobOperationError(
            StopJobError.JOB_IS_NOT_RUNNING, f"job {state.id} is {state.status}"
        )


class Halted(NamedTuple):
    """What `halt` counted."""

    failed: int
    stopped: int


def halt(window: Window, stages: Stages, counting: Counting) -> Halted:
    """Counts pending attempts (waiting for their delay, or due and waiting to start) as
    failed and never-started steps as stopped."""
    failed = stopped = 0
    for run in window.never_started():
        start = run.start
        if run.retry:
            stages[start.stage].failed += 1
            counting.count_outcome(start.step_id)
            failed += 1
        elif counting.count_stop(start.step_id):
            stages[start.stage].stopped += 1
            stopped += 1
    return Halted(failed, stopped)


def settled(state: JobState) -> bool:
    """At rest: a terminal status, or a stop that is final (every running step reported its
    stop and `on_stopped` ran, so `progress.stopped_steps` is complete). What `wait` returns
    at, and a job whose activation drives nothing."""
    return state.status.is_terminal or (state.status is JobStatus.STOPPED and state.stop_finalized)


def stop_owed(state: JobState) -> bool:
    """A stop or removal is persisted and not finished yet."""
    return state.status is JobStatus.REMOVING or (
        state.status is JobStatus.STOPPED and not state.stop_finalized
    )


async def remove_records(storage: Storage, job_id: str) -> None:
    """Deletes a job's steps, its counted records, its outputs, then its record: a removal cut
    short leaves the job record, by which it is found and finished again."""
    await storage.remove_job_steps(job_id)
    await storage.remove_job_counted(job_id)
    await storage.remove_job_outputs(job_id)
    await storage.remove_job(job_id)
