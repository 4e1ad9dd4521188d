"""Errors raised by choreography_ray.

One root, `ChoreographyError`::

    ChoreographyError
    ├── JobOperationError          an operation answered one of the spec's error enums (.error)
    ├── JobTimeoutError            wait() gave up before the job reached a terminal status
    ├── InvalidRequestError        a request did not validate against the job's request type
    ├── TypeImportError            a job or step type stored by path cannot be imported
    ├── IllegalTransitionError     a job was asked to move between statuses the lifecycle forbids
    ├── JobsManagerConflictError   a jobs manager runs with another storage or other options
    ├── JobsManagerUnavailableError  the jobs manager could not be reached within the bound
    ├── SchedulerOperationError    a scheduler operation was refused (.error, a SchedulerError)
    ├── SchedulerUnavailableError  the scheduler actor could not be reached within the bound
    ├── StepHostUnknownError       a live step host did not say which steps it runs (asked again)
    ├── StaleActivationError       a step host refused a start of an older job activation (epoch)
    ├── ReportAgainError           a job could not take a step's report now (the host reports again)
    └── StorageError               anything the storage layer reports
        ├── StorageUnavailableError      the database cannot be reached (URL shown without password)
        ├── ConcurrencyError             a job save lost an optimistic-concurrency race
        ├── DuplicateRecordError         a record with that id exists already
        ├── CorruptRecordError           a stored record does not parse (collection and id named)
        └── UnsupportedSchemaError       a stored record is of a newer schema than this release
"""

from __future__ import annotations

import enum
from typing import TypeAlias


class StartJobError(enum.StrEnum):
    UNKNOWN = "Unknown"
    #: The request was refused; nothing was stored.
    INVALID_REQUEST = "InvalidRequest"
    #: `prepare_steps` threw or returned no plan the job could persist.
    COULD_NOT_PREPARE_STEPS = "CouldNotPrepareSteps"
    #: The job record or its plan could not be written.
    COULD_NOT_PERSIST = "CouldNotPersist"
    #: No step of the first stage started.
    FAILED_STARTING_ALL_JOB_STEPS = "FailedStartingAllJobSteps"
    #: Some steps did not start, or the first stage started none but a later stage is running.
    FAILED_STARTING_SOME_JOB_STEPS = "FailedStartingSomeJobSteps"
    #: A job with that id exists already.
    JOB_ALREADY_EXISTS = "JobAlreadyExists"


class StopJobError(enum.StrEnum):
    UNKNOWN = "Unknown"
    #: The stop could not be written; the job was left as it was.
    COULD_NOT_PERSIST_STOP = "CouldNotPersistStop"
    #: The job is terminal and has nothing to stop.
    JOB_IS_NOT_RUNNING = "JobIsNotRunning"


class RemoveJobError(enum.StrEnum):
    #: The finish of the removal failed again.
    UNKNOWN = "Unknown"
    #: A removal is already in progress; its finish was run again.
    JOB_IS_ALREADY_BEING_REMOVED = "JobIsAlreadyBeingRemoved"


class ResumeJobError(enum.StrEnum):
    UNKNOWN = "Unknown"
    #: A job that completed (with or without failures) is not resumed.
    JOB_IS_COMPLETED = "JobIsCompleted"
    #: A job being removed is never resumed.
    JOB_IS_BEING_REMOVED = "JobIsBeingRemoved"


class RetryFailedStepsError(enum.StrEnum):
    #: The job type does not allow it, or the job has stages.
    NOT_SUPPORTED = "NotSupported"
    JOB_IS_NOT_COMPLETED_WITH_FAILURES = "JobIsNotCompletedWithFailures"
    COULD_NOT_PERSIST = "CouldNotPersist"


class CannotResumeJobError(enum.StrEnum):
    #: The job was interrupted before its plan was stored; inspect or remove it.
    MISSING_STEP_PLAN = "MissingStepPlan"


class JobLookupError(enum.StrEnum):
    #: No job with that id in this manager's scope and namespace.
    JOB_NOT_FOUND = "JobNotFound"


class SchedulerError(enum.StrEnum):
    #: No manifest of that name in the scheduler's scope.
    MANIFEST_NOT_FOUND = "ManifestNotFound"
    #: No run with that id in the scheduler's scope.
    RUN_NOT_FOUND = "RunNotFound"
    #: No dead letter with that id in the scheduler's scope.
    DEAD_LETTER_NOT_FOUND = "DeadLetterNotFound"
    #: The dead letter was resolved already (requeued or acknowledged by someone else).
    DEAD_LETTER_ALREADY_RESOLVED = "DeadLetterAlreadyResolved"
    #: Another queued entry resumes the same run.
    RESUME_ALREADY_QUEUED = "ResumeAlreadyQueued"
    #: Only a FAILED or CANCELLED run can be resumed (not one that succeeded or has not ended).
    RUN_NOT_RESUMABLE = "RunNotResumable"
    #: This scheduler does not hold the scope's lock: another one (another cluster) runs it.
    NOT_LOCK_HOLDER = "NotLockHolder"
    #: A trigger of a disabled manifest: enable it first (`schedule(..., enabled=True)`).
    MANIFEST_DISABLED = "ManifestDisabled"
    #: A trigger of a manifest whose dead letter awaits intervention: requeue or acknowledge it.
    MANIFEST_DEAD_LETTERED = "ManifestDeadLettered"


OperationErrorCode: TypeAlias = (
    StartJobError
    | StopJobError
    | RemoveJobError
    | ResumeJobError
    | RetryFailedStepsError
    | CannotResumeJobError
    | JobLookupError
)


class ChoreographyError(Exception):
    """The root of every error this package raises."""


class JobOperationError(ChoreographyError):
    """An operation on a job failed with one of the spec's error codes."""

    def __init__(self, error: OperationErrorCode, message: str = "") -> None:
        self.error = error
        self.message = message
        super().__init__(
            f"{type(error).__name__}.{error.name}" + (f": {message}" if message else "")
        )

    def __reduce__(self) -> tuple[type[JobOperationError], tuple[OperationErrorCode, str]]:
        return JobOperationError, (self.error, self.message)


class JobTimeoutError(ChoreographyError, TimeoutError):
    """`wait` reached its timeout before the job reached a terminal or stopped status."""


class InvalidRequestError(ChoreographyError, ValueError):
    """A request does not validate against the job type's request model."""


class TypeImportError(ChoreographyError, ImportError):
    """A type stored by import path cannot be imported (or is not allowed)."""


class IllegalTransitionError(ChoreographyError):
    """A job status change the lifecycle does not allow."""


class JobsManagerConflictError(ChoreographyError, ValueError):
    """The jobs manager of this (scope, namespace) runs with another storage or other options
    than this connection's; `.fields` names what differs."""

    def __init__(self, message: str, fields: list[str] | None = None) -> None:
        super().__init__(message)
        self.fields = fields or []

    def __reduce__(self) -> tuple[type[JobsManagerConflictError], tuple[str, list[str]]]:
        return JobsManagerConflictError, (str(self), self.fields)


class JobsManagerUnavailableError(ChoreographyError):
    """The jobs manager actor did not answer within the client's bound (it is restarting, or
    its node is gone), or failed in a way that is not one of the spec's errors."""


class StepHostUnknownError(ChoreographyError):
    """A live step host did not answer which steps it runs: they are unknown, not none (the
    operation that asked is tried again)."""


class StaleActivationError(ChoreographyError):
    """A step host refused a start of a job activation older than one that has asked it
    already (its epoch is older): the newer activation drives the job now."""


class ReportAgainError(ChoreographyError):
    """The job could not take a step's report now (finishing its removal failed): the step host
    delivers it again, which runs the finish again."""


class SchedulerOperationError(ChoreographyError):
    """A scheduler operation was refused; `.error` says why."""

    def __init__(self, error: SchedulerError, message: str = "") -> None:
        self.error = error
        self.message = message
        super().__init__(f"SchedulerError.{error.name}" + (f": {message}" if message else ""))

    def __reduce__(self) -> tuple[type[SchedulerOperationError], tuple[SchedulerError, str]]:
        return SchedulerOperationError, (self.error, self.message)


class SchedulerUnavailableError(ChoreographyError):
    """The scheduler actor did not answer within the client's bound, or failed in a way that
    is not a `SchedulerOperationError`."""


class StorageError(ChoreographyError):
    """Anything the storage layer reports."""


class StorageUnavailableError(StorageError):
    """The database cannot be reached; the message names the URL without its password."""


class ConcurrencyError(StorageError):
    """A job save carried a stale version: another writer saved the job first."""


class DuplicateRecordError(StorageError):
    """A record with that id exists already."""


class CorruptRecordError(StorageError):
    """A stored record does not parse; the message names the collection and id."""

    def __init__(self, collection: str, record_id: str, reason: str) -> None:
        self.collection = collection
        self.record_id = record_id
        self.reason = reason
        super().__init__(f"corrupt record {record_id!r} in {collection!r}: {reason}")

    def __reduce__(self) -> tuple[type[CorruptRecordError], tuple[str, str, str]]:
        return CorruptRecordError, (self.collection, self.record_id, self.reason)


class UnsupportedSchemaError(StorageError):
    """A stored record carries a `schema_version` newer than this release reads: it was written
    by a newer release and is refused, never misread (nor written over). Built by `for_record`,
    whose message names the collection, the record id, its version and the version read here;
    the same values are its attributes."""

    def __init__(
        self,
        message: str,
        *,
        collection: str = "",
        record_id: str = "",
        version: int | None = None,
        supported: int | None = None,
    ) -> None:
        super().__init__(message)
        self.collection = collection
        self.record_id = record_id
        self.version = version
        self.supported = supported

    @classmethod
    def for_record(
        cls, collection: str, record_id: str, version: int, supported: int
    ) -> UnsupportedSchemaError:
        message = (
            f"record {record_id!r} in {collection!r} has schema_version {version}; this release "
            f"reads schema_version {supported} and older: upgrade choreography-ray to read it"
        )
        return cls(
            message,
            collection=collection,
            record_id=record_id,
            version=version,
            supported=supported,
        )

    def __reduce__(
        self,
    ) -> tuple[type[UnsupportedSchemaError], tuple[str, ...], dict[str, object]]:
        return type(self), tuple(map(str, self.args)), dict(vars(self))
