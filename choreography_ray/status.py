"""The persisted statuses of jobs and steps, and how a stage reacts to a failure."""

from __future__ import annotations

import enum


class JobStatus(enum.StrEnum):
    """The status of a job, as stored."""

    #: No status yet: a job record that was never started.
    NONE = "None"
    #: The job record exists and `prepare_steps` is running.
    PREPARING_JOB = "PreparingJob"
    #: The plan is persisted; steps are being prepared for their first start.
    PREPARING_STEPS = "PreparingSteps"
    #: The first stage's steps are being handed to step hosts.
    STARTING_STEPS = "StartingSteps"
    #: Steps are running; the watchdog watches the job.
    RUNNING = "Running"
    #: Every step succeeded.
    COMPLETED_SUCCESSFULLY = "CompletedSuccessfully"
    #: Every step reached an outcome and at least one failed or was unreachable.
    COMPLETED_WITH_FAILURES = "CompletedWithFailures"
    #: A stop was persisted; `stop_finalized` says whether every step has reported it.
    STOPPED = "Stopped"
    #: A job hook threw, or the job could not be resumed.
    FAILED = "Failed"
    #: A removal was persisted and is being finished.
    REMOVING = "Removing"

    @property
    def is_terminal(self) -> bool:
        """The job will not run any more steps without an explicit call."""
        return self in _TERMINAL_JOB

    @property
    def is_preparing(self) -> bool:
        return self in (
            JobStatus.PREPARING_JOB,
            JobStatus.PREPARING_STEPS,
            JobStatus.STARTING_STEPS,
        )


_TERMINAL_JOB = frozenset(
    {JobStatus.COMPLETED_SUCCESSFULLY, JobStatus.COMPLETED_WITH_FAILURES, JobStatus.FAILED}
)


class StepStatus(enum.StrEnum):
    """The status of a step, as stored."""

    #: Not known: a step record that was never written.
    UNKNOWN = "Unknown"
    #: Prepared in the plan, not started yet (or waiting for a retry).
    SCHEDULED = "Scheduled"
    #: A step host activated the step and `perform` is running.
    RUNNING = "Running"
    #: `perform` succeeded (such a record is deleted once persisted).
    COMPLETED_SUCCESSFULLY = "CompletedSuccessfully"
    #: `perform` returned `StepResult.failed(...)` and no attempt is left.
    COMPLETED_WITH_FAILURE = "CompletedWithFailure"
    #: The step was told to stop and did.
    STOPPED = "Stopped"
    #: `perform` raised, or returned something that is not a `StepResult`.
    FAILED = "Failed"
    #: The step's job is being removed; the step deletes its record once its stop is stored.
    REMOVING = "Removing"
    #: A stage before this step's stopped the job; the step will never run.
    UNREACHABLE = "Unreachable"

    @property
    def is_failure(self) -> bool:
        return self in (StepStatus.FAILED, StepStatus.COMPLETED_WITH_FAILURE)

    @property
    def is_outcome(self) -> bool:
        """Counts toward completion."""
        return self in _OUTCOME_STEP


_OUTCOME_STEP = frozenset(
    {
        StepStatus.COMPLETED_SUCCESSFULLY,
        StepStatus.COMPLETED_WITH_FAILURE,
        StepStatus.FAILED,
        StepStatus.UNREACHABLE,
    }
)


#: Jobs an activation drives: preparing or running.
LIVE_JOB = frozenset(
    {
        JobStatus.PREPARING_JOB,
        JobStatus.PREPARING_STEPS,
        JobStatus.STARTING_STEPS,
        JobStatus.RUNNING,
    }
)
#: Jobs rehydration looks at: live ones, and stops and removals that may be unfinished.
REHYDRATED_JOB = LIVE_JOB | {JobStatus.STOPPED, JobStatus.REMOVING}
#: Steps that failed: counted as failed.
FAILED_STEP = frozenset({StepStatus.FAILED, StepStatus.COMPLETED_WITH_FAILURE})
#: Steps without an outcome yet: to start, running, stopped or being removed.
UNFINISHED_STEP = frozenset(
    {StepStatus.RUNNING, StepStatus.SCHEDULED, StepStatus.STOPPED, StepStatus.REMOVING}
)


class JobStageFailureBehavior(enum.StrEnum):
    """What a failed step in a stage does to the stages after it."""

    #: The stage is a barrier: later stages become UNREACHABLE and the job ends with failures.
    STOP_JOB = "StopJob"
    #: The stage is best-effort: the next stage starts once this one has reached its outcomes.
    CONTINUE_WITH_NEXT_STAGE = "ContinueWithNextStage"
