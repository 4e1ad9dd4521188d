"""Durable storage: one small async protocol, one module per provider.

`open_storage(url)` picks the provider by URL scheme:

    memory://                in-process (tests), or held by one Ray actor so every process sees it
    sqlite:///path/jobs.db   the embedded default: one machine, WAL, durable
    mongodb://host/db        clusters; pymongo, bulk writes

Stored layout (MongoDB collections; SQLite tables of the same names):

    jobs                one record per job. Key: job id. Fields: scope, namespace, type, status,
                        status_changes, stage, progress, request, has_plan, stop_finalized,
                        records_counted_steps, error, created, resume_after, held, priority,
                        fairness_key, version, schema_version, and status_since: when it
                        reached its status (`JobState.status_since`, derived, written with
                        every save).
                        Indexes: (scope, namespace, status): `list_unsettled_jobs`',
                        (status, stop_finalized),
                        (scope, namespace, status, status_since): the cleanup query's,
                        (created, id) for `find_jobs`' newest-first pages.
    job_steps           one record per prepared step not yet succeeded. Key: "{job_id}/{step_id}".
                        Fields: job_id, step_id, type, stage, status, attempt, lease {silo,
                        activation, heartbeat}, request, status_changes, updated, schema_version.
                        Indexes: (job_id, status, step_id), (job_id, stage, status, step_id),
                        (job_id, step_id) (SQLite's end in step_id as its key does).
                        A lease renewal is a conditional write: it sets lease and updated only
                        where status is RUNNING and attempt is the renewal's, so it never undoes
                        an outcome stored meanwhile, nor touches a later attempt.
    job_counted_steps   one small record per counted step identity (CompletedStepsCounted,
                        StoppedStepsCounted). Key: (job, kind, step_id). Writing one costs the
                        same at 10 and at 1,000,000 records of a job.
    job_outputs         one record per succeeded step that returned an output. Key:
                        "{job_id}/{step_id}". Fields: job_id, step_id, stage, attempt, output
                        (its JSON text). Index (job_id, step_id): the pages of `list_outputs`,
                        a Dataset's read tasks each reading a range of step ids.
    jobs_manager_keys   the recovery key catalog: every (scope, namespace) a manager served.

Each provider's docstring says how it lays these out.
"""

from __future__ import annotations

import enum
import json
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple, Protocol, runtime_checkable

from choreography_ray.failures import FailureCluster
from choreography_ray.model import (
    JobsManagerKey,
    JobState,
    Lease,
    StatusChange,
    StepOutput,
    StepState,
    utcnow,
)
from choreography_ray.status import JobStatus, StepStatus


class CountedKind(enum.StrEnum):
    """Which counted-steps list a record belongs to."""

    #: `JobState.completed_steps_counted`: outcomes counted after a resume or reopen.
    COMPLETED = "completed"
    #: `JobState.stopped_steps_counted`: stops counted in this execution.
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class StepUpdate:
    """One step's new status in a bulk update. `lease=None` clears the lease; `change`, when
    set, is appended to the step's status history; `failure_signature` is stored as given (a
    failure's; None clears it)."""

    job_id: str
    step_id: str
    status: StepStatus
    attempt: int
    lease: Lease | None = None
    change: StatusChange | None = None
    failure_signature: str | None = None


class StoredOutput(NamedTuple):
    """A succeeded step's output as stored: its JSON text, as the step host serialized it."""

    job_id: str
    step_id: str
    stage: int
    attempt: int
    output: str

    def parsed(self) -> StepOutput:
        return StepOutput(
            job_id=self.job_id,
            step_id=self.step_id,
            stage=self.stage,
            attempt=self.attempt,
            output=json.loads(self.output),
        )


#: The statuses an attempt ends in without an output (docs/outputs.md).
WITHOUT_OUTPUT = frozenset(
    {StepStatus.FAILED, StepStatus.COMPLETED_WITH_FAILURE, StepStatus.STOPPED}
)


def ended_without_output(updates: Sequence[StepUpdate]) -> dict[str, list[tuple[str, int]]]:
    """Per job, (step id, attempt) of the updates to a status without an output: `update_steps`
    deletes the outputs an earlier attempt of such a step stored, while its record exists (a
    step whose record is gone succeeded, and keeps its output)."""
    ended: dict[str, list[tuple[str, int]]] = {}
    for u in updates:
        if u.status in WITHOUT_OUTPUT:
            ended.setdefault(u.job_id, []).append((u.step_id, u.attempt))
    return ended


class LeaseRenewal(NamedTuple):
    """A running step's new lease, for `renew_leases`: applied only while the stored step is
    RUNNING at `attempt`. Renewals of one host share their `lease` object."""

    job_id: str
    step_id: str
    attempt: int
    lease: Lease


class PlannedStep(NamedTuple):
    """One step of a plan as `insert_plan` takes it: SCHEDULED, attempt 0, no lease yet; the
    request already serialized, as JSON text."""

    step_id: str
    type: str
    stage: int
    request_json: str


class StoredStart(NamedTuple):
    """What starting a stored step needs, as `list_starts` reads it: no record object, the
    request as JSON text."""

    step_id: str
    type: str
    stage: int
    status: StepStatus
    attempt: int
    request_json: str


def starts_of(steps: Sequence[StepState]) -> list[StoredStart]:
    """`list_starts` for providers without a faster path: from the step records."""
    return [
        StoredStart(s.step_id, s.type, s.stage, s.status, s.attempt, json.dumps(s.request))
        for s in steps
    ]


def planned_records(job_id: str, steps: Sequence[PlannedStep]) -> list[StepState]:
    """The step records of a plan, for providers without a faster path."""
    now = utcnow()
    return [
        StepState(
            job_id=job_id,
            step_id=s.step_id,
            type=s.type,
            stage=s.stage,
            request=json.loads(s.request_json),
            updated=now,
        )
        for s in steps
    ]


def as_utc(when: datetime) -> datetime:
    """`when` in UTC; a naive datetime is read as UTC."""
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def utc_text(when: datetime) -> str:
    """`when` as fixed-width UTC ISO-8601 text with microseconds: such texts sort as the
    instants do, so a provider can index and compare them."""
    return as_utc(when).isoformat(timespec="microseconds")


#: Counts of a job's stored steps by (stage, status).
StatusCounts = dict[tuple[int, StepStatus], int]
#: Counts of jobs by (job type, status).
JobCounts = dict[tuple[str, JobStatus], int]


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs `find_jobs` and `count_jobs_by_type_and_status` read: every field that is
    not None narrows them. `type` is a job type's import path, matched exactly."""

    scope: str | None = None
    namespace: str | None = None
    statuses: frozenset[JobStatus] | None = None
    type: str | None = None
    #: Only jobs created at or after this instant.
    created_since: datetime | None = None

    def matches(self, job: JobState) -> bool:
        """The filter applied to one record: what every provider's query does."""
        return (
            (self.scope is None or job.scope == self.scope)
            and (self.namespace is None or job.namespace == self.namespace)
            and (self.statuses is None or job.status in self.statuses)
            and (self.type is None or job.type == self.type)
            and (self.created_since is None or job.created >= self.created_since)
        )


class JobCursor(NamedTuple):
    """A place in the newest-first order of `find_jobs`: a job's (created, id)."""

    created: datetime
    job_id: str

    @classmethod
    def of(cls, job: JobState) -> JobCursor:
        return cls(job.created, job.id)


@runtime_checkable
class Storage(Protocol):
    """What the runtime needs from a database, and no more. Every method is a coroutine."""

    url: str

    # jobs
    async def create_job(self, job: JobState) -> JobState:
        """Insert a new job at version 1; `DuplicateRecordError` when the id exists."""

    async def get_job(self, job_id: str) -> JobState | None:
        """The job without its counted-steps lists (see `list_counted`)."""

    async def save_job(self, job: JobState) -> JobState:
        """Replace the job if its stored version is `job.version`; returns it at version + 1.
        A stale version raises `ConcurrencyError` and changes nothing."""

    async def list_jobs(
        self, scope: str, namespace: str, status: JobStatus | None = None
    ) -> list[JobState]: ...

    async def get_jobs_excluding_finalized_stops(
        self, scope: str, namespace: str
    ) -> list[JobState]:
        """Every job of the key but STOPPED jobs whose stop is finalized (REMOVING stays),
        filtered in the query, oldest first."""

    async def list_unsettled_jobs(self, scope: str, namespace: str) -> list[JobState]:
        """The key's jobs that rehydration may need to act on: those in `REHYDRATED_JOB` but
        STOPPED jobs whose stop is finalized (REMOVING stays), oldest first. Filtered in the
        query, along the (scope, namespace, status) index, so its cost follows these jobs and
        not every job the key ever finished (recovery reads it every reconciliation pass)."""

    async def find_jobs(
        self,
        where: JobFilter,
        *,
        before: JobCursor | None = None,
        after: JobCursor | None = None,
        limit: int = 50,
    ) -> list[JobState]:
        """A page of the jobs `where` matches, newest first (by created, then id): the `limit`
        just older than `before`, or just newer than `after`, or the newest. One indexed query,
        however many jobs are stored."""

    async def count_jobs_by_type_and_status(self, where: JobFilter) -> JobCounts:
        """The jobs `where` matches counted by (type, status), in one aggregate query."""

    async def list_jobs_for_cleanup(
        self,
        scope: str,
        namespace: str,
        statuses: Collection[JobStatus],
        before: datetime,
        limit: int,
    ) -> list[JobState]:
        """Jobs of the key in one of `statuses` that reached it (`JobState.status_since`)
        before `before`, oldest first (ties by id), at most `limit`: an indexed query, whose
        cost follows `limit` and not the number of jobs stored."""

    async def remove_job(self, job_id: str) -> None: ...

    # steps
    async def insert_steps(self, steps: Sequence[StepState]) -> None:
        """Bulk insert of step records, all or nothing."""

    async def insert_plan(self, job_id: str, steps: Sequence[PlannedStep]) -> None:
        """Bulk insert of a job's plan, all or nothing: the hot path's insert, which builds no
        record objects where the provider can avoid it."""

    async def get_step(self, job_id: str, step_id: str) -> StepState | None: ...

    async def get_steps(self, job_id: str, step_ids: Collection[str]) -> dict[str, StepState]:
        """The stored records among `step_ids`, by step id (an id without a record is left
        out): read by key, at most `IDS_PER_READ` ids per query, so the cost follows
        `len(step_ids)` and not the number of steps the job has."""

    async def list_steps(
        self,
        job_id: str,
        *,
        statuses: Collection[StepStatus] | None = None,
        stage: int | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> list[StepState]:
        """A page of a job's steps ordered by step id, those after `after`."""

    async def list_starts(
        self,
        job_id: str,
        *,
        statuses: Collection[StepStatus] | None = None,
        stage: int | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> list[StoredStart]:
        """The page `list_steps` reads, as what starting each step needs: the window's feed
        reads a large stage this way, a page at a time, without building records."""

    async def list_failed(
        self, job_id: str, signature: str, *, after: str | None = None, limit: int = 1000
    ) -> list[StepState]:
        """A page of the job's steps stored failed with `failure_signature` == `signature`, in
        step-id order, those after `after`: read along the signature index."""

    async def failure_clusters(self, job_id: str) -> list[FailureCluster]:
        """The job's failed steps grouped by signature, most frequent first (then by
        signature): one grouping query over the signature index, and one read by key per
        cluster for its example."""

    async def update_steps(self, updates: Sequence[StepUpdate]) -> None:
        """Bulk status update, in one write. Steps that no longer exist, or whose stored attempt
        is later than the update's, are skipped: an earlier attempt's outcome, written again
        after a lost acknowledgement, never overwrites a later attempt's. The same update
        written again records its status change once. An update to a failed or stopped status
        of a step whose record exists also deletes its output of that attempt or an earlier
        one (`ended_without_output`)."""

    async def renew_leases(self, renewals: Sequence[LeaseRenewal]) -> int:
        """Sets each step's lease (and `updated`) where the step is still RUNNING at the
        renewal's attempt, in one bulk write, and returns how many it renewed. A step whose
        outcome is stored, that runs again at another attempt, or that is gone is left as it
        is: a renewal racing an outcome write never turns the outcome back into RUNNING."""

    async def delete_steps(
        self, job_id: str, step_ids: Collection[str], outputs: Sequence[StoredOutput] = ()
    ) -> None:
        """Deletes the steps' records; `outputs` (the job's, of succeeded steps among them) are
        stored first, in the same write where the provider can (`put_outputs`' rules): the
        group commit's write of succeeded steps."""

    async def has_steps(self, job_id: str, stage: int, statuses: Collection[StepStatus]) -> bool:
        """Whether a step of the job's `stage` is stored in one of `statuses`: indexed look-ups
        that stop at the first record, whatever the job's size (the watchdog asks it every
        tick)."""

    async def count_by_status(self, job_id: str) -> StatusCounts:
        """The job's stored steps counted by (stage, status), through the status indexes; its
        cost follows the number of records counted (it runs once a stage is done, or on a
        resume: never per watchdog tick)."""

    async def remove_job_steps(self, job_id: str) -> None: ...

    # counted steps
    async def add_counted(self, job_id: str, kind: CountedKind, step_ids: Collection[str]) -> None:
        """Idempotent bulk add."""

    async def remove_counted(self, job_id: str, kind: CountedKind, step_id: str) -> None: ...

    async def list_counted(self, job_id: str, kind: CountedKind) -> list[str]: ...

    async def count_counted(self, job_id: str, kind: CountedKind) -> int: ...

    async def remove_job_counted(self, job_id: str) -> None: ...

    # step outputs
    async def put_outputs(self, outputs: Sequence[StoredOutput]) -> None:
        """Upserts outputs by (job, step) in one bulk write: written again (a lost
        acknowledgement, a step run again) it stays one record. A stored output of a later
        attempt than the one written is kept."""

    async def delete_outputs(self, job_id: str, steps: Sequence[tuple[str, int]]) -> None:
        """Deletes the outputs of (step id, attempt) pairs whose stored attempt is that attempt
        or earlier (a failed or stopped attempt's write never deletes a later attempt's)."""

    async def list_outputs(
        self,
        job_id: str,
        *,
        stage: int | None = None,
        after: str | None = None,
        until: str | None = None,
        limit: int = 1000,
    ) -> list[StoredOutput]:
        """A page of the job's outputs ordered by step id, those after `after` and up to
        `until` (both by string order); of one stage when given. Read along the (job_id,
        step_id) key: its cost follows the page, not the job."""

    async def count_outputs(self, job_id: str, stage: int | None = None) -> int:
        """How many outputs the job has stored (of one stage when given)."""

    async def output_span(self, job_id: str, stage: int | None = None) -> tuple[str, str] | None:
        """The first and last step ids with an output (of one stage), None when there is none:
        two look-ups at the ends of the key, whatever the job's size."""

    async def remove_job_outputs(self, job_id: str) -> None: ...

    # recovery key catalog
    async def add_manager_key(self, key: JobsManagerKey) -> None:
        """Idempotent."""

    async def list_manager_keys(self) -> list[JobsManagerKey]: ...

    async def close(self) -> None: ...


#: Steps read per page by `step_pages`.
PAGE = 5_000
#: Step ids per query of `get_steps`.
IDS_PER_READ = 500


async def output_pages(
    storage: Storage,
    job_id: str,
    *,
    stage: int | None = None,
    after: str | None = None,
    until: str | None = None,
    page: int = 1000,
) -> AsyncIterator[list[StoredOutput]]:
    """Every output of a job (of one stage, in a range of step ids), a page at a time, by step
    id."""
    while True:
        found = await storage.list_outputs(
            job_id, stage=stage, after=after, until=until, limit=page
        )
        if found:
            yield found
        if len(found) < page:
            return
        after = found[-1].step_id


async def step_pages(
    storage: Storage,
    job_id: str,
    *,
    statuses: Collection[StepStatus] | None = None,
    stage: int | None = None,
) -> AsyncIterator[list[StepState]]:
    """Every matching step of a job, a page at a time, in step-id order."""
    after: str | None = None
    while True:
        page = await storage.list_steps(
            job_id, statuses=statuses, stage=stage, after=after, limit=PAGE
        )
        if page:
            yield page
        if len(page) < PAGE:
            return
        after = page[-1].step_id


def chunks(items: Collection[str], size: int = IDS_PER_READ) -> list[list[str]]:
    """`items` in lists of at most `size`, for queries with a bounded number of keys."""
    ordered = list(items)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def open_storage(url: str, *, read_only: bool = False) -> Storage:
    """The provider for `url`; an unknown scheme is a `ValueError` naming the known ones.

    `read_only` is for readers outside the cluster (the CLI's read-only commands): such a
    storage creates nothing, ever. SQLite opens an existing file read-only (a missing one is
    `StorageUnavailableError`, never created) and lays out nothing; MongoDB creates no index.
    Its writes fail. `memory://` ignores it."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "memory":
        from choreography_ray.storage.memory import MemoryStorage

        return MemoryStorage(url)
    if scheme == "sqlite":
        from choreography_ray.storage.sqlite import SqliteStorage

        return SqliteStorage(url, read_only)
    if scheme in ("mongodb", "mongodb+srv"):
        from choreography_ray.storage.mongodb import MongoStorage

        return MongoStorage(url, read_only)
    raise ValueError(
        f"unknown storage URL {redact_url(url)!r}: use memory://, sqlite:///path.db "
        "or mongodb://host/database"
    )


def redact_url(url: str) -> str:
    """The URL without its password."""
    if "://" not in url or "@" not in url.split("://", 1)[1].split("/", 1)[0]:
        return url
    scheme, rest = url.split("://", 1)
    auth, host = rest.split("@", 1)
    user = auth.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


__all__ = [
    "CountedKind",
    "JobCounts",
    "JobCursor",
    "JobFilter",
    "LeaseRenewal",
    "PlannedStep",
    "StatusCounts",
    "StepUpdate",
    "Storage",
    "StoredOutput",
    "StoredStart",
    "as_utc",
    "chunks",
    "ended_without_output",
    "open_storage",
    "output_pages",
    "planned_records",
    "redact_url",
    "starts_of",
    "step_pages",
    "utc_text",
]
