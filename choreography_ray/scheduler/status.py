"""The persisted statuses of the scheduler's records."""

from __future__ import annotations

import enum


class RunStatus(enum.StrEnum):
    """The status of one run of a manifest, as stored."""

    #: A work queue entry for the run exists; the dispatcher has not started its job yet.
    QUEUED = "Queued"
    #: Its job was started through the jobs manager and has not ended.
    RUNNING = "Running"
    #: Its job ended COMPLETED_SUCCESSFULLY.
    SUCCEEDED = "Succeeded"
    #: Its job ended COMPLETED_WITH_FAILURES or FAILED, or its dispatch ran out of attempts.
    FAILED = "Failed"
    #: Its job was stopped (timed out or by an operator): not a failure, never retried.
    CANCELLED = "Cancelled"
    #: A dispatch attempt never reached the jobs manager; the entry waits for another attempt.
    DISPATCH_REQUEUED = "DispatchRequeued"

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED_RUN


_FINISHED_RUN = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})


class DeadLetterStatus(enum.StrEnum):
    """The status of a dead letter, as stored."""

    #: The manifest ran out of retries; nothing runs it until an operator resolves this.
    AWAITING_INTERVENTION = "AwaitingIntervention"
    #: Resolved by a requeue: a run was queued at once and the failure count starts afresh.
    RETRIED = "Retried"
    #: Resolved by an operator's acknowledgement (with a note): the schedule carries on.
    ACKNOWLEDGED = "Acknowledged"

    @property
    def is_resolved(self) -> bool:
        return self is not DeadLetterStatus.AWAITING_INTERVENTION


class WorkStatus(enum.StrEnum):
    """The status of a work queue entry, as stored."""

    #: Waiting for the dispatcher (from `scheduled_at`, or at once when it has none).
    QUEUED = "Queued"
    #: Claimed by a dispatcher, which starts (or started) its run's job.
    DISPATCHED = "Dispatched"
    #: Taken off the queue without a dispatch (its manifest was removed or disabled).
    CANCELLED = "Cancelled"


class EntryKind(enum.StrEnum):
    """Who queued a work queue entry."""

    #: The manifest manager's cycle: the manifest was due (a retry is one of these).
    SCHEDULED = "Scheduled"
    #: `trigger`: an off-schedule run.
    TRIGGER = "Trigger"
    #: `requeue` of a dead letter: at once, no backoff.
    DEAD_LETTER_REQUEUE = "DeadLetterRequeue"
    #: `requeue_execution`: a run queued again, from the top.
    REQUEUE_EXECUTION = "RequeueExecution"
    #: `resume_execution`: a run resumed after its latest checkpoint.
    RESUME_EXECUTION = "ResumeExecution"

    @property
    def holds_manifest_key(self) -> bool:
        """Entries of this kind are one per manifest while queued (see docs/scheduler.md)."""
        return self in (EntryKind.SCHEDULED, EntryKind.TRIGGER)

    @property
    def belongs_to_manifest(self) -> bool:
        """A run of this kind is one of its manifest's schedule: it blocks, settles and retries
        it, and fires its dependents. Not one an operator queued for an execution
        (`requeue_execution`, `resume_execution`): it runs beside the schedule."""
        return self not in (EntryKind.REQUEUE_EXECUTION, EntryKind.RESUME_EXECUTION)

    @property
    def counts_toward_retries(self) -> bool:
        """A failed run of this kind counts toward its manifest's retries. A run an operator
        queued for an execution (`requeue_execution`, `resume_execution`) belongs to no
        manifest's retry count, as in Trax."""
        return self not in (EntryKind.REQUEUE_EXECUTION, EntryKind.RESUME_EXECUTION)
