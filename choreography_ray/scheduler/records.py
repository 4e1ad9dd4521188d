"""The scheduler's stored records: manifests, runs, work queue entries, dead letters, decisions
and checkpoints. Immutable pydantic models stored as JSON (never pickled); job types by import
path. Every record carries `schema_version`, as the job records do (`choreography_ray.model`).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from choreography_ray.durations import Duration
from choreography_ray.model import SCHEMA_VERSION, StageShape, utcnow
from choreography_ray.scheduler.schedules import After, Schedule
from choreography_ray.scheduler.status import DeadLetterStatus, EntryKind, RunStatus, WorkStatus


def new_id() -> str:
    return uuid.uuid4().hex


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


#: The settings of a manifest an upsert writes only when code states them (the spec's rule).
SETTINGS = frozenset(
    {"max_retries", "failure_window", "replay_decisions_on_retry", "enabled", "timeout"}
)
#: What defines a manifest: written on every upsert.
DEFINITION = frozenset({"job_type", "request", "schedule", "namespace"})


class Manifest(_Record):
    """A job type, its request and a schedule, with the retry settings of its runs."""

    schema_version: int = SCHEMA_VERSION
    scope: str
    name: str = Field(min_length=1)
    #: The job type's import path, "pkg.module:ClassName".
    job_type: str
    request: dict[str, Any] = Field(default_factory=dict)
    schedule: Schedule
    #: The jobs manager namespace its runs start in.
    namespace: str = "default"
    #: Retries after the first run: a manifest runs at most `max_retries + 1` times in a row of
    #: counted failures before it is dead-lettered.
    max_retries: int = Field(default=3, ge=0)
    #: None: the scheduler's `failure_count_window`.
    failure_window: Duration | None = None
    replay_decisions_on_retry: bool = True
    enabled: bool = True
    #: How long a run may take from its start: a run past it is stopped through the jobs
    #: manager and settled CANCELLED. None: the scheduler's `default_run_timeout`.
    timeout: Duration | None = None
    created: datetime = Field(default_factory=utcnow)
    updated: datetime = Field(default_factory=utcnow)

    @property
    def parent(self) -> str | None:
        """The manifest whose successes this one runs after, if it is a dependent."""
        return self.schedule.parent if isinstance(self.schedule, After) else None


class ManifestRun(_Record):
    """One run of a manifest: a job started through the jobs manager."""

    schema_version: int = SCHEMA_VERSION
    id: str = Field(default_factory=new_id)
    scope: str
    manifest: str
    #: The job's id, known once the dispatcher starts it.
    job_id: str | None = None
    status: RunStatus = RunStatus.QUEUED
    #: The job type and request it was queued with: a replay needs them equal to the retry's.
    job_type: str
    request: dict[str, Any] = Field(default_factory=dict)
    namespace: str = "default"
    #: The work queue entry it was queued by, and who queued it.
    entry_id: str | None = None
    kind: EntryKind = EntryKind.SCHEDULED
    #: The schedule occurrence it runs for (None off-schedule: triggers and requeues).
    occurrence: datetime | None = None
    #: For a dependent's run: the parent's successful run it was started for.
    parent_run: str | None = None
    queued_at: datetime = Field(default_factory=utcnow)
    #: When its entry was claimed, on the database's clock.
    dispatched_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    is_retry: bool = False
    #: The run whose recorded decisions it replays, or None when it asks afresh.
    replays: str | None = None
    #: The run whose checkpoint it resumes after, or None when it runs from the top.
    resumed_from: str | None = None
    #: Its replay could not be honoured and it asked its deciders afresh: its answers are its own.
    replay_abandoned: bool = False
    dispatch_attempts: int = 0
    error: str | None = None
    #: When the scheduler stopped its job for running past its manifest's timeout (the run is
    #: settled CANCELLED once the stop is final).
    timed_out_at: datetime | None = None

    @property
    def counted_from(self) -> datetime:
        """When it started, for the failure window (a run that never started: when queued)."""
        return self.started_at or self.queued_at

    @property
    def dated(self) -> datetime:
        """When it was dispatched (the database's stamp), else when it started or was queued:
        what a parent's later success is compared with."""
        return self.dispatched_at or self.counted_from

    @property
    def asked_itself(self) -> bool:
        """It asked its deciders itself rather than replaying another run's answers."""
        return self.replays is None or self.replay_abandoned


class WorkEntry(_Record):
    """A run waiting for the dispatcher. `scheduled_at` is the database's time plus the delay;
    None means at once."""

    schema_version: int = SCHEMA_VERSION
    id: str = Field(default_factory=new_id)
    scope: str
    manifest: str
    kind: EntryKind = EntryKind.SCHEDULED
    status: WorkStatus = WorkStatus.QUEUED
    run_id: str
    #: One queued entry of this manifest at a time holds the manifest's key.
    holds_manifest_key: bool = True
    created_at: datetime = Field(default_factory=utcnow)
    scheduled_at: datetime | None = None
    dispatched_at: datetime | None = None
    dispatch_attempts: int = 0
    replays: str | None = None
    resume_from: str | None = None
    #: The run an operator's requeue queues again (a dead letter's, `requeue_execution`,
    #: `resume_execution`): the replay a never-started `requeues` kept is this entry's.
    requeues: str | None = None


class DeadLetter(_Record):
    """A manifest that ran out of retries, awaiting an operator."""

    schema_version: int = SCHEMA_VERSION
    id: str = Field(default_factory=new_id)
    scope: str
    manifest: str
    status: DeadLetterStatus = DeadLetterStatus.AWAITING_INTERVENTION
    #: Counted failures when it was dead-lettered (the first run and its retries).
    retry_count_at_dead_letter: int
    reason: str
    #: The latest failed run: what a requeue replays and resumes.
    run_id: str | None = None
    dead_lettered_at: datetime = Field(default_factory=utcnow)
    resolved_at: datetime | None = None
    note: str | None = None


class Decision(_Record):
    """An answer recorded by `StepContext.decide(question, state, ask)` in one run."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    scope: str
    manifest: str
    question: str
    #: `decisions.state_hash(state)`: a stable hash of the state's canonical JSON.
    state_hash: str
    #: The answer as JSON (what `decide` stored, and returns on a replay).
    answer: Any = None
    recorded_at: datetime = Field(default_factory=utcnow)
    #: Replayed from the run this run replays, rather than asked here.
    replayed: bool = False

    @property
    def key(self) -> str:
        from choreography_ray.scheduler.decisions import decision_key

        return decision_key(self.question, self.state_hash)


class Checkpoint(_Record):
    """A stage a run completed: a retry may resume after it while the stage layout matches."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    scope: str
    manifest: str
    stage: int
    #: Every stage of the run's plan and its step count.
    layout: tuple[StageShape, ...]
    completed_at: datetime = Field(default_factory=utcnow)


class SchedulerLease(_Record):
    """The durable lock of a scheduler scope: who runs its manifests, until when (the
    database's clock). Its holder is one activation of the scheduler actor."""

    schema_version: int = SCHEMA_VERSION
    #: "scheduler/{scope}".
    name: str
    holder: str
    acquired_at: datetime
    expires_at: datetime
    #: The fencing token: one more each time the lease changes holder, the same on a renewal.
    #: MongoDB's fenced writes carry it (0: a lease written before the token).
    token: int = 0


class TriggerResult(_Record):
    run_id: str | None = None
    #: No run was queued: a run of the manifest was in flight already (the dispatcher had
    #: claimed the queued entry, its job runs, or an operator's requeue is queued), and
    #: `run_id` names it.
    already_dispatched: bool = False
    #: The run whose decisions the triggered run replays, or None.
    replay_decisions_of: str | None = None


class RequeueResult(_Record):
    run_id: str
    message: str
