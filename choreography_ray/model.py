"""The records every part shares: job and step state, progress, leases and keys.

Every stored record carries `schema_version`. A record written before a field existed loads with
that field's default (pydantic fills it), which is how records of older releases are read; a
record written before `schema_version` existed is of version 1 (`FIRST_SCHEMA_VERSION`). A
record of a newer version than `SCHEMA_VERSION` is refused by every provider before it is parsed
(`check_schema_version`): a newer release may have changed what a field means, so reading it with
this release's defaults could misread it, and saving it back would lose what it added.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, computed_field

from choreography_ray.core.sharing import DEFAULT_PRIORITY
from choreography_ray.errors import UnsupportedSchemaError
from choreography_ray.status import JobStatus, StepStatus

#: The schema version this release writes, and the newest it reads.
SCHEMA_VERSION = 1
#: The version of a record stored without `schema_version` (written before the field existed).
FIRST_SCHEMA_VERSION = 1


def check_schema_version(collection: str, record_id: str, version: object) -> None:
    """Raises `UnsupportedSchemaError` when a stored record's `schema_version` (None when it has
    none) is newer than this release reads. A value that is not a whole number is left to the
    record's validation, which reports it as corrupt."""
    if isinstance(version, bool) or not isinstance(version, int | str):
        return
    try:
        number = int(version)
    except ValueError:
        return
    if number > SCHEMA_VERSION:
        raise UnsupportedSchemaError.for_record(collection, record_id, number, SCHEMA_VERSION)


def utcnow() -> datetime:
    return datetime.now(UTC)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class JobsManagerKey(_Record):
    """The (scope, namespace) of one jobs manager: what recovery asks to rehydrate."""

    scope: str
    namespace: str

    def __str__(self) -> str:
        return f"{self.scope}/{self.namespace}"


class StatusChange(_Record):
    """One entry of a job's or step's status history."""

    status: str
    occurred: datetime = Field(default_factory=utcnow)
    exception_messages: tuple[str, ...] = ()


class Lease(_Record):
    """Who runs a step: the Ray node (silo), the hosting actor + incarnation, the last heartbeat."""

    silo: str
    activation: str
    heartbeat: datetime


class StageProgress(_Record):
    stage: int
    is_started: bool = False
    total_steps: int = 0
    successful_steps: int = 0
    failed_steps: int = 0
    unreachable_steps: int = 0
    stopped_steps: int = 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def is_completed(self) -> bool:
        done = self.successful_steps + self.failed_steps + self.unreachable_steps
        return done >= self.total_steps


class StageShape(_Record):
    """A stage of a plan and its step count: what a checkpoint's layout is made of."""

    stage: int
    steps: int


class ResumeAfter(_Record):
    """A job that starts after a checkpoint: the stages up to `stage` are not run again (their
    steps are counted as succeeded), when the plan's stage layout is still `layout`."""

    stage: int
    layout: tuple[StageShape, ...]
    #: The scheduler run whose checkpoint it is.
    source: str


class JobProgress(_Record):
    total_steps: int = 0
    successful_steps: int = 0
    failed_steps: int = 0
    stopped_steps: int = 0
    unreachable_steps: int = 0
    stages: tuple[StageProgress, ...] = ()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def is_completed(self) -> bool:
        """Every step reached an outcome: successful + failed + unreachable = total."""
        done = self.successful_steps + self.failed_steps + self.unreachable_steps
        return self.total_steps > 0 and done >= self.total_steps

    @computed_field  # type: ignore[prop-decorator]
    @property
    def is_stopped(self) -> bool:
        """Every step has an outcome or a stop, counting the steps of stages never started."""
        not_started = sum(s.total_steps for s in self.stages if not s.is_started)
        done = self.successful_steps + self.failed_steps + self.unreachable_steps
        return done + self.stopped_steps + not_started >= self.total_steps

    @computed_field  # type: ignore[prop-decorator]
    @property
    def has_failures(self) -> bool:
        return self.failed_steps + self.unreachable_steps > 0


class JobState(_Record):
    """A job as stored. `version` is the optimistic-concurrency counter of its record."""

    schema_version: int = SCHEMA_VERSION
    id: str
    scope: str
    namespace: str
    type: str
    status: JobStatus = JobStatus.NONE
    created: datetime = Field(default_factory=utcnow)
    status_changes: tuple[StatusChange, ...] = ()
    stage: int = 0
    progress: JobProgress = JobProgress()
    request: dict[str, Any] = Field(default_factory=dict)
    #: The plan (every step record) is stored; a job without it cannot resume.
    has_plan: bool = False
    stop_finalized: bool = False
    #: Steps whose outcome the job counted after it resumed (read from `job_counted_steps`).
    completed_steps_counted: tuple[str, ...] = ()
    #: Steps whose stop the job counted (read from `job_counted_steps`).
    stopped_steps_counted: tuple[str, ...] = ()
    #: The job resumed or reopened at least once: its outcomes are recorded as counted.
    records_counted_steps: bool = False
    #: Why the job is FAILED, when it is.
    error: str | None = None
    #: The checkpoint it starts after (a scheduler's retry of a job type with
    #: `checkpoint_stages`). Once the plan is stored it is kept only when the plan's stage
    #: layout matched and stages were skipped; otherwise cleared, and the job ran from the top.
    resume_after: ResumeAfter | None = None
    #: Whoever started it reads its outcome from storage (the scheduler, for its runs): a job
    #: type that does not keep its finished records (`Job.keep_after_completed` off) drops them
    #: only once its starter releases it, not as it completes (docs/retention.md).
    held: bool = False
    #: Its steps' turn where steps wait for capacity, 1 first ... 5 (docs/sharing.md): the
    #: start's `priority`, else its type's `Job.priority`.
    priority: int = DEFAULT_PRIORITY
    #: The key whose weighted share of the waiting capacity its steps take: its type's
    #: `Job.fairness_key`, else the namespace. "" on a record stored before the field existed:
    #: `share_key` reads it as the namespace.
    fairness_key: str = ""
    version: int = 0

    @property
    def key(self) -> JobsManagerKey:
        return JobsManagerKey(scope=self.scope, namespace=self.namespace)

    @property
    def share_key(self) -> str:
        """The fairness key its steps share capacity by: `fairness_key`, else the namespace."""
        return self.fairness_key or self.namespace

    @property
    def status_since(self) -> datetime:
        """When the job reached its current status: its last status change, else `created`.
        What retention and the dead-job threshold measure a job's age from."""
        return self.status_changes[-1].occurred if self.status_changes else self.created

    def with_status(self, status: JobStatus, *exception_messages: str) -> JobState:
        change = StatusChange(status=status, exception_messages=tuple(exception_messages))
        return self.model_copy(
            update={"status": status, "status_changes": (*self.status_changes, change)}
        )


class StepState(_Record):
    """A prepared step as stored. A step that succeeded is deleted, so it is not read back."""

    schema_version: int = SCHEMA_VERSION
    job_id: str
    step_id: str
    type: str
    stage: int = 0
    status: StepStatus = StepStatus.SCHEDULED
    attempt: int = 0
    lease: Lease | None = None
    is_prepared: bool = True
    request: dict[str, Any] = Field(default_factory=dict)
    status_changes: tuple[StatusChange, ...] = ()
    updated: datetime = Field(default_factory=utcnow)
    #: What its failure groups by (`failures.failure_signature`), while it is stored failed.
    failure_signature: str | None = None

    @property
    def key(self) -> str:
        return step_key(self.job_id, self.step_id)


def step_key(job_id: str, step_id: str) -> str:
    return f"{job_id}/{step_id}"


class PoolState(_Record):
    """A pool of step hosts of one resource shape (`JobStep.resources`), as its hosts answer:
    `hosts` answered, `pending` did not (created and not placed by Ray yet, or busy past the
    time asked), `busy` steps are in a perform or batch, `queued` wait in the hosts, `waiting`
    steps wait in their jobs for room on the pool's hosts (the demand an autoscaler is asked
    for, `wanted` hosts in all)."""

    shape: str
    hosts: int = 0
    pending: int = 0
    busy: int = 0
    queued: int = 0
    waiting: int = 0
    wanted: int = 0
    nodes: tuple[str, ...] = ()


_M = TypeVar("_M", bound=BaseModel)


class StepOutput(_Record):
    """What a succeeded step returned (`StepResult.succeeded(output=...)`), as stored: one per
    step, the succeeded attempt's. `output` is its JSON, parsed (a dict for a model);
    `output_as(Model)` types it back (docs/outputs.md)."""

    job_id: str
    step_id: str
    stage: int
    attempt: int
    output: Any

    def output_as(self, model: type[_M]) -> _M:
        return model.model_validate(self.output)
