"""choreography_ray: a durable job system for large fan-out on Ray."""

from choreography_ray.client import AsyncJobsManager, Jobs, JobsManager, StartedJob
from choreography_ray.errors import (
    CannotResumeJobError,
    ChoreographyError,
    ConcurrencyError,
    CorruptRecordError,
    DuplicateRecordError,
    IllegalTransitionError,
    InvalidRequestError,
    JobLookupError,
    JobOperationError,
    JobTimeoutError,
    RemoveJobError,
    ResumeJobError,
    RetryFailedStepsError,
    StartJobError,
    StopJobError,
    StorageError,
    StorageUnavailableError,
    TypeImportError,
    UnsupportedSchemaError,
)
from choreography_ray.job import Job, StepSpec
from choreography_ray.model import (
    JobProgress,
    JobsManagerKey,
    JobState,
    Lease,
    StageProgress,
    StatusChange,
    StepState,
)
from choreography_ray.options import JobsOptions
from choreography_ray.status import JobStageFailureBehavior, JobStatus, StepStatus
from choreography_ray.step import JobStep, StepContext, StepResult

__version__ = "0.1.0"

__all__ = [
    "AsyncJobsManager",
    "CannotResumeJobError",
    "ChoreographyError",
    "ConcurrencyError",
    "CorruptRecordError",
    "DuplicateRecordError",
    "IllegalTransitionError",
    "InvalidRequestError",
    "Job",
    "JobLookupError",
    "JobOperationError",
    "JobProgress",
    "JobStageFailureBehavior",
    "JobState",
    "JobStatus",
    "JobStep",
    "JobTimeoutError",
    "Jobs",
    "JobsManager",
    "JobsManagerKey",
    "JobsOptions",
    "Lease",
    "RemoveJobError",
    "ResumeJobError",
    "RetryFailedStepsError",
    "StageProgress",
    "StartJobError",
    "StartedJob",
    "StatusChange",
    "StepContext",
    "StepResult",
    "StepSpec",
    "StepState",
    "StepStatus",
    "StopJobError",
    "StorageError",
    "StorageUnavailableError",
    "TypeImportError",
    "UnsupportedSchemaError",
    "__version__",
]
