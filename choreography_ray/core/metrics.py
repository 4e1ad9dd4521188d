"""Metrics as the rules see them: the names, a small port with a no-op default, the tally a job
activation counts into, and a storage wrapper that times the job's writes.

The rules never call a metrics library. A job activation counts its steps' fates into a `Tally`
as it settles them (an integer increment, nothing more) and records what moved once at the end
of each turn (`Tally.record`): one call per counter per batch of reports, never one per step.
Every call names `Labels` (scope, namespace, job type), never a job or step id, so the number of
series stays that of the job types. The Ray shell implements `Metrics` with `ray.util.metrics`
(`runtime/metrics.py`); with `JobsOptions.metrics` off, and in the unit tests, it is
`NO_METRICS`. docs/metrics.md says what each metric means and when it is recorded.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar

from choreography_ray.model import JobState
from choreography_ray.status import JobStatus
from choreography_ray.storage import CountedKind, PlannedStep, StepUpdate, Storage

T = TypeVar("T")


class Counter(enum.StrEnum):
    """The counters, by their `ray.util.metrics` name (Prometheus adds `ray_` and `_total`)."""

    #: Step attempts a step host took and stored RUNNING: a retry or a restart counts again.
    STEPS_STARTED = "choreography_steps_started"
    #: Steps whose success the job counted.
    STEPS_SUCCEEDED = "choreography_steps_succeeded"
    #: Steps whose failure the job counted: no attempt left, or not to be retried.
    STEPS_FAILED = "choreography_steps_failed"
    #: Failed attempts the job scheduled to run again.
    STEPS_RETRIED = "choreography_steps_retried"
    #: Running steps the watchdog started again because their owner was gone and their lease
    #: had expired.
    STEPS_RESTARTED_BY_LEASE = "choreography_steps_restarted_by_lease"
    #: Steps whose stop the job counted (running steps that reported it, never-started ones).
    STEPS_STOPPED = "choreography_steps_stopped"
    #: Outcomes whose delivery to their job failed and was tried again, once per try.
    OUTCOME_DELIVERIES_RETRIED = "choreography_outcome_deliveries_retried"
    #: Jobs a jobs manager's rehydration resumed (or whose stop it finished).
    REHYDRATIONS = "choreography_rehydrations"
    #: `STEPS_FAILED` by failure signature (the tag `signature`; `BoundedTags` keeps its
    #: values few).
    STEP_FAILURES = "choreography_step_failures"


class Histogram(enum.StrEnum):
    """The histograms; each has one tag beside the labels (`HISTOGRAM_TAG`)."""

    #: Seconds one storage write took, tagged by `operation` (`WriteOperation`).
    STORAGE_WRITE_SECONDS = "choreography_storage_write_seconds"
    #: Items in one batch, tagged by `kind` (`BatchKind`).
    BATCH_SIZE = "choreography_batch_size"


#: The tag each histogram has beside the labels.
HISTOGRAM_TAG = {Histogram.STORAGE_WRITE_SECONDS: "operation", Histogram.BATCH_SIZE: "kind"}
#: The counters that have a tag beside the labels, and its name.
COUNTER_TAG = {Counter.STEP_FAILURES: "signature"}
#: Values of a counter's tag per (counter, labels) before the others are recorded as
#: `OTHER_TAG`: a job type with thousands of distinct failures keeps a few series.
MAX_TAG_VALUES = 20
OTHER_TAG = "other"

#: The gauge of jobs by status, with the tag `status` beside the labels.
JOBS_GAUGE = "choreography_jobs"

#: The statuses the jobs gauge reports: every status a job can rest in or run through but the
#: terminal ones (those pile up until retention removes them, and a count of them would read
#: every finished job's index entry on each tick).
GAUGED_STATUSES: tuple[JobStatus, ...] = (
    JobStatus.PREPARING_JOB,
    JobStatus.PREPARING_STEPS,
    JobStatus.STARTING_STEPS,
    JobStatus.RUNNING,
    JobStatus.STOPPED,
    JobStatus.REMOVING,
)


class BatchKind(enum.StrEnum):
    """What a `choreography_batch_size` observation counts."""

    #: Steps in one start operation from a job to a step host.
    START = "start"
    #: Outcomes in one report a job accepted from a step host.
    OUTCOMES = "outcomes"
    #: Step records one step host's group commit wrote in one round, for this job type.
    GROUP_COMMIT = "group_commit"


class WriteOperation(enum.StrEnum):
    """What a `choreography_storage_write_seconds` observation timed."""

    CREATE_JOB = "create_job"
    SAVE_JOB = "save_job"
    INSERT_PLAN = "insert_plan"
    UPDATE_STEPS = "update_steps"
    ADD_COUNTED = "add_counted"
    REMOVE_JOB = "remove_job"
    #: One round of a step host's group commit: its bulk update and its deletes.
    GROUP_COMMIT = "group_commit"
    #: One lease renewal round of a step host.
    RENEW_LEASES = "renew_leases"


class Labels(NamedTuple):
    """The tags every metric carries. Hashable: the Ray shell builds each tag dict once."""

    scope: str
    namespace: str
    job_type: str


#: Labels of a batch whose job did not say them (a job actor of an earlier release).
UNKNOWN = Labels("", "", "")


class Metrics(Protocol):
    """The metrics port. Calls never raise: a failed recording is the implementation's to log."""

    #: False for the no-op port: callers skip work done only to record (timing a write).
    enabled: bool

    def count(self, counter: Counter, value: int, labels: Labels, tag: str = "") -> None:
        """Adds `value` (> 0; 0 is skipped) to the counter; `tag` is the value of its
        `COUNTER_TAG`, for a counter that has one."""

    def observe(self, histogram: Histogram, value: float, labels: Labels, tag: str) -> None:
        """One observation; `tag` is the value of the histogram's `HISTOGRAM_TAG`."""

    def jobs(self, value: int, labels: Labels, status: JobStatus) -> None:
        """Sets the jobs gauge of (labels, status)."""


class NoMetrics:
    """The port when metrics are off: every call does nothing."""

    enabled = False

    def count(self, counter: Counter, value: int, labels: Labels, tag: str = "") -> None:
        return None

    def observe(self, histogram: Histogram, value: float, labels: Labels, tag: str) -> None:
        return None

    def jobs(self, value: int, labels: Labels, status: JobStatus) -> None:
        return None


NO_METRICS: Metrics = NoMetrics()


@dataclass(slots=True)
class Tally:
    """What one activation counted since its last recording."""

    started: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    restarted_by_lease: int = 0
    stopped: int = 0
    #: The failures among `failed`, by signature.
    signatures: dict[str, int] = field(default_factory=dict)

    def failure(self, signature: str) -> None:
        self.failed += 1
        self.signatures[signature] = self.signatures.get(signature, 0) + 1

    def record(self, metrics: Metrics, labels: Labels) -> None:
        """Records each count that moved, once, and starts again from zero."""
        for name, counter in _TALLIED:
            value = getattr(self, name)
            if value:
                setattr(self, name, 0)
                metrics.count(counter, value, labels)
        signatures, self.signatures = self.signatures, {}
        for signature, value in signatures.items():
            metrics.count(Counter.STEP_FAILURES, value, labels, signature)


class BoundedTags:
    """The first `MAX_TAG_VALUES` values of a counter's tag per (counter, labels) are recorded
    as they are, later ones as `OTHER_TAG`: what keeps a tag made from data (a failure
    signature) from making a series per step."""

    def __init__(self, limit: int = MAX_TAG_VALUES) -> None:
        self.limit = limit
        self._seen: dict[tuple[str, Labels], set[str]] = {}

    def __call__(self, counter: str, labels: Labels, tag: str) -> str:
        seen = self._seen.setdefault((counter, labels), set())
        if tag in seen:
            return tag
        if len(seen) >= self.limit:
            return OTHER_TAG
        seen.add(tag)
        return tag


_TALLIED = (
    ("started", Counter.STEPS_STARTED),
    ("succeeded", Counter.STEPS_SUCCEEDED),
    ("failed", Counter.STEPS_FAILED),
    ("retried", Counter.STEPS_RETRIED),
    ("restarted_by_lease", Counter.STEPS_RESTARTED_BY_LEASE),
    ("stopped", Counter.STEPS_STOPPED),
)


def jobs_gauge(
    counts: dict[tuple[str, JobStatus], int], known_types: Iterable[str]
) -> list[tuple[str, JobStatus, int]]:
    """Every (job type, gauged status, count) to set: each type counted now or before, with
    zero for a status it has no job in, so a series that emptied reads 0 instead of its last
    value."""
    types = sorted({job_type for job_type, _ in counts} | set(known_types))
    return [(t, s, counts.get((t, s), 0)) for t in types for s in GAUGED_STATUSES]


class TimedWrites:
    """A job activation's storage whose writes observe `choreography_storage_write_seconds`
    (successful writes only; a failed one raises as it would). Reads and every other call go
    straight to the storage."""

    def __init__(self, storage: Storage, metrics: Metrics, labels: Labels) -> None:
        self.inner = storage
        self.url = storage.url
        self._metrics = metrics
        self._labels = labels

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def _timed(self, operation: WriteOperation, write: Awaitable[T]) -> T:
        began = time.perf_counter()
        result = await write
        self._metrics.observe(
            Histogram.STORAGE_WRITE_SECONDS,
            time.perf_counter() - began,
            self._labels,
            operation,
        )
        return result

    async def save_job(self, job: JobState) -> JobState:
        return await self._timed(WriteOperation.SAVE_JOB, self.inner.save_job(job))

    async def insert_plan(self, job_id: str, steps: Sequence[PlannedStep]) -> None:
        await self._timed(WriteOperation.INSERT_PLAN, self.inner.insert_plan(job_id, steps))

    async def update_steps(self, updates: Sequence[StepUpdate]) -> None:
        await self._timed(WriteOperation.UPDATE_STEPS, self.inner.update_steps(updates))

    async def add_counted(self, job_id: str, kind: CountedKind, step_ids: Collection[str]) -> None:
        write = self.inner.add_counted(job_id, kind, step_ids)
        await self._timed(WriteOperation.ADD_COUNTED, write)

    async def remove_job(self, job_id: str) -> None:
        await self._timed(WriteOperation.REMOVE_JOB, self.inner.remove_job(job_id))
