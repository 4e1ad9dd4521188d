"""Retention and dead-job cleanup: what a jobs manager's cleanup pass removes, and how.

The rules (docs/retention.md), each measured from `JobState.status_since`, the time the job
reached its current status:

- a **terminal** job (COMPLETED_SUCCESSFULLY, COMPLETED_WITH_FAILURES, FAILED) older than
  `terminal_job_retention` goes, oldest first, at most `max_terminal_jobs_per_cleanup` a pass;
- a **dead** job, PREPARING_JOB or PREPARING_STEPS for longer than `dead_job_threshold` with no
  steps (none counted in its record, none stored), goes;
- nothing else is touched: STARTING_STEPS, RUNNING, STOPPED, REMOVING and NONE stay.

At most `max_concurrent_cleanup` removals run at once. A removal deletes a job's records only
while nothing holds the job: no operation of this manager uses it (`Claims`; every activation
of a job actor goes through its manager) and no activation of it is alive (`is_active`, which
the Ray shell answers from the named actor). The job is read again after those checks and must
still be due. Records go in `stopping.remove_records` order, the job record last, so a removal
cut short is found and finished by the next pass.

`keep_after_completed` and `keep_after_completed_with_failures` (class attributes of `Job`) drop
a finished job's records as it finishes: the job activation does it after its terminal save
(`core.job`), unless the job is `held` by its starter (the scheduler, which settles its run from
the stored outcome). `Cleanup.release` is the starter's word that it has read the outcome.

No Ray here: the shell is `runtime/manager.py`.
"""

from __future__ import annotations

import asyncio
import enum
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from choreography_ray.core.backoff import Backoff
from choreography_ray.core.stopping import remove_records
from choreography_ray.job import Job
from choreography_ray.logs import get_logger
from choreography_ray.model import JobsManagerKey, JobState, utcnow
from choreography_ray.options import JobsOptions
from choreography_ray.status import JobStatus
from choreography_ray.storage import Storage, as_utc
from choreography_ray.types import import_type

log = get_logger(__name__)

#: The statuses retention removes.
TERMINAL = (JobStatus.COMPLETED_SUCCESSFULLY, JobStatus.COMPLETED_WITH_FAILURES, JobStatus.FAILED)
#: The statuses a dead job is stuck in.
PREPARING = (JobStatus.PREPARING_JOB, JobStatus.PREPARING_STEPS)
#: Terminal jobs read per query when `max_terminal_jobs_per_cleanup` is off (the pass reads
#: pages until none is due).
TERMINAL_PAGE = 1_000
#: Preparing jobs older than the threshold read per pass: dead ones are rare (rehydration fails
#: an interrupted job without a plan), so one page is plenty.
DEAD_CANDIDATES_PER_PASS = 1_000
#: Tries of a release while an activation of the job is still alive (a finished job's actor
#: exits about a second after it finished), and the delay between them, in seconds.
RELEASE_ATTEMPTS = 6
RELEASE_BACKOFF = Backoff(1.0, 30.0)
#: Removed jobs a `Cleanup` remembers (the latest), for `removed`.
REMEMBERED = 1_000


def keeps_records(job_type: type[Job[Any]], status: JobStatus) -> bool:
    """Whether a job of `job_type` keeps its records at `status` (until retention removes them):
    False only for a completed job whose type turned the matching `keep_after_*` off. A FAILED
    job is always kept."""
    if status is JobStatus.COMPLETED_SUCCESSFULLY:
        return job_type.keep_after_completed
    if status is JobStatus.COMPLETED_WITH_FAILURES:
        return job_type.keep_after_completed_with_failures
    return True


def drops_records(job_type: type[Job[Any]]) -> bool:
    """Whether a job of `job_type` drops its records at some completion."""
    return not (job_type.keep_after_completed and job_type.keep_after_completed_with_failures)


class Removal(enum.StrEnum):
    """Why a job's records were removed."""

    #: Terminal for longer than `terminal_job_retention`.
    RETENTION = "retention"
    #: Preparing without steps for longer than `dead_job_threshold`.
    DEAD = "dead"
    #: Completed, of a type that does not keep its records, and released by its starter.
    NOT_KEPT = "not kept"


@dataclass(frozen=True, slots=True)
class CleanupPolicy:
    """The cleanup options, each None when off."""

    retention: timedelta | None = timedelta(days=7)
    per_pass: int | None = 100
    dead_after: timedelta | None = timedelta(hours=1)
    concurrency: int | None = 4

    @classmethod
    def of(cls, options: JobsOptions) -> CleanupPolicy:
        return cls(
            retention=options.effective_terminal_job_retention,
            per_pass=options.max_terminal_jobs_per_cleanup,
            dead_after=options.effective_dead_job_threshold,
            concurrency=options.max_concurrent_cleanup,
        )


def due(state: JobState, now: datetime, policy: CleanupPolicy) -> Removal | None:
    """Why the record says the job goes now, or None. A dead job must also have no step
    stored, which only storage can say (`Cleanup` asks it)."""
    since, now = as_utc(state.status_since), as_utc(now)
    if state.status in TERMINAL and policy.retention is not None:
        return Removal.RETENTION if since < now - policy.retention else None
    dead = state.status in PREPARING and state.progress.total_steps == 0
    if dead and policy.dead_after is not None and since < now - policy.dead_after:
        return Removal.DEAD
    return None


class Claims:
    """Which jobs this manager's operations use, and which a removal is deleting: a removal
    never starts on a job in use, and an operation waits for a removal in progress (and then
    finds the job gone)."""

    def __init__(self) -> None:
        self._using: Counter[str] = Counter()
        self._removing: dict[str, asyncio.Event] = {}

    @asynccontextmanager
    async def using(self, job_id: str) -> AsyncIterator[None]:
        while (removal := self._removing.get(job_id)) is not None:
            await removal.wait()
        self._using[job_id] += 1
        try:
            yield
        finally:
            self._using[job_id] -= 1
            if not self._using[job_id]:
                del self._using[job_id]

    @contextmanager
    def removal(self, job_id: str) -> Iterator[bool]:
        """True while this removal holds the job; False when the job is in use or being
        removed already (nothing is held then)."""
        if self._using[job_id] or job_id in self._removing:
            yield False
            return
        done = self._removing[job_id] = asyncio.Event()
        try:
            yield True
        finally:
            del self._removing[job_id]
            done.set()


@dataclass
class PassReport:
    """What one pass did."""

    removed: dict[str, Removal] = field(default_factory=dict)
    #: Due, but held by an operation or a live activation: the next pass tries again.
    skipped: list[str] = field(default_factory=list)
    #: Removals that failed, with their error: the next pass tries again.
    failed: dict[str, str] = field(default_factory=dict)


class Cleanup:
    """The cleanup of one jobs manager's key. `is_active(job_id)` tells whether an activation
    of the job is alive."""

    def __init__(
        self,
        storage: Storage,
        key: JobsManagerKey,
        policy: CleanupPolicy,
        claims: Claims,
        is_active: Callable[[str], Awaitable[bool]],
        *,
        allowed_type_prefixes: Sequence[str] | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.storage = storage
        self.key = key
        self.policy = policy
        self.claims = claims
        self.is_active = is_active
        self.allowed_type_prefixes = allowed_type_prefixes
        self.clock = clock
        self.passes = 0
        #: The latest jobs a pass or a release removed, by why (what tests and operators read).
        self.removed: dict[str, Removal] = {}

    @property
    def enabled(self) -> bool:
        return self.policy.retention is not None or self.policy.dead_after is not None

    async def run_pass(self) -> PassReport:
        """Removes the key's terminal jobs past retention, then its dead jobs."""
        now = self.clock()
        report = PassReport()
        concurrency = self.policy.concurrency
        limit = None if concurrency is None else asyncio.Semaphore(concurrency)
        if self.policy.retention is not None:
            before = as_utc(now) - self.policy.retention
            size = self.policy.per_pass or TERMINAL_PAGE
            while True:
                page = await self._candidates(TERMINAL, before, size)
                removed = await self._remove_all(page, now, report, limit)
                # Without a per-pass limit, pages until none is due (or none of a page went).
                if self.policy.per_pass is not None or len(page) < size or not removed:
                    break
        if self.policy.dead_after is not None:
            before = as_utc(now) - self.policy.dead_after
            page = await self._candidates(PREPARING, before, DEAD_CANDIDATES_PER_PASS)
            await self._remove_all(page, now, report, limit)
        self.passes += 1
        for job_id, why in report.removed.items():
            self._remember(job_id, why)
        if report.removed or report.failed:
            log.info(
                "jobs manager %s: cleanup removed %d jobs (%d skipped, %d failed)",
                self.key,
                len(report.removed),
                len(report.skipped),
                len(report.failed),
            )
        return report

    async def _candidates(
        self, statuses: Sequence[JobStatus], before: datetime, limit: int
    ) -> list[JobState]:
        return await self.storage.list_jobs_for_cleanup(
            self.key.scope, self.key.namespace, statuses, before, limit
        )

    async def _remove_all(
        self,
        candidates: Sequence[JobState],
        now: datetime,
        report: PassReport,
        limit: asyncio.Semaphore | None,
    ) -> int:
        async def one(job_id: str) -> bool:
            async with limit or nullcontext():
                try:
                    return await self._remove(job_id, now, report)
                except Exception as error:
                    # One job that cannot be removed holds up no other; the next pass retries.
                    report.failed[job_id] = f"{type(error).__name__}: {error}"
                    log.warning("cleanup of job %s failed: %s", job_id, error)
                    return False

        removed = await asyncio.gather(*(one(job.id) for job in candidates))
        return sum(removed)

    async def _remove(self, job_id: str, now: datetime, report: PassReport) -> bool:
        with self.claims.removal(job_id) as held:
            if not held or await self.is_active(job_id):
                report.skipped.append(job_id)
                return False
            state = await self.storage.get_job(job_id)
            if state is None or state.key != self.key:
                return False
            why = due(state, now, self.policy)
            if why is None:
                return False
            if why is Removal.DEAD and await self.storage.list_steps(job_id, limit=1):
                return False
            await remove_records(self.storage, job_id)
        report.removed[job_id] = why
        log.info("job %s removed by cleanup (%s)", job_id, why)
        return True

    # -- release ------------------------------------------------------------------------------

    async def release(self, job_id: str) -> bool:
        """Its starter has read the held job's outcome: the hold is cleared, and a completed
        job whose type does not keep its records has them dropped now. Tried again while an
        activation of the job is alive, up to `RELEASE_ATTEMPTS` times; whether the job's
        records were dropped."""
        for attempt in range(1, RELEASE_ATTEMPTS + 1):
            dropped = await self._release(job_id)
            if dropped is not None:
                return dropped
            await asyncio.sleep(RELEASE_BACKOFF.delay(attempt))
        log.warning(
            "job %s: still in use after %d tries to release it; its records stay until "
            "terminal_job_retention",
            job_id,
            RELEASE_ATTEMPTS,
        )
        return False

    async def _release(self, job_id: str) -> bool | None:
        """Whether the records were dropped; None while the job is held by an operation or a
        live activation."""
        with self.claims.removal(job_id) as held:
            if not held or await self.is_active(job_id):
                return None
            state = await self.storage.get_job(job_id)
            if state is None or state.key != self.key:
                return False
            if self._keeps(state):
                if state.held:  # a later completion of the job (after a reopen) drops them
                    await self.storage.save_job(state.model_copy(update={"held": False}))
                return False
            await remove_records(self.storage, job_id)
        self._remember(job_id, Removal.NOT_KEPT)
        log.info("job %s: its records were dropped once its starter released it", job_id)
        return True

    def _remember(self, job_id: str, why: Removal) -> None:
        self.removed[job_id] = why
        if len(self.removed) > REMEMBERED:
            del self.removed[next(iter(self.removed))]

    def _keeps(self, state: JobState) -> bool:
        if not state.status.is_terminal:
            return True
        try:
            job_type = import_type(state.type, self.allowed_type_prefixes)
        except Exception as error:
            log.warning("job %s: its type %s cannot be imported here (%s); its records are kept",
                        state.id, state.type, error)  # fmt: skip
            return True
        if not (isinstance(job_type, type) and issubclass(job_type, Job)):
            return True
        return keeps_records(job_type, state.status)
