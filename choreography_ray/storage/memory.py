"""The in-process memory provider: the reference for the contract, and the one unit tests use.

Jobs, steps, counted records and step outputs live in dicts of immutable records. Inside a Ray
cluster `memory://` is held by one actor (see `choreography_ray.runtime.memory_actor`) so every
process sees the same data; it is lost with the cluster. Records are stored at this release's
`schema_version`; one of a newer version (as a test injects) is refused when read.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import TypeVar

from choreography_ray.errors import ConcurrencyError, CorruptRecordError, DuplicateRecordError
from choreography_ray.failures import FailureCluster, failure_cluster
from choreography_ray.model import (
    SCHEMA_VERSION,
    JobsManagerKey,
    JobState,
    StepState,
    check_schema_version,
    utcnow,
)
from choreography_ray.status import REHYDRATED_JOB, JobStatus, StepStatus
from choreography_ray.storage import (
    CountedKind,
    JobCounts,
    JobCursor,
    JobFilter,
    LeaseRenewal,
    PlannedStep,
    StatusCounts,
    StepUpdate,
    StoredOutput,
    StoredStart,
    as_utc,
    ended_without_output,
    planned_records,
    starts_of,
)


class MemoryStorage:
    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self.jobs: dict[str, JobState] = {}
        self.steps: dict[str, dict[str, StepState]] = {}
        self._sorted_ids: dict[str, list[str]] = {}
        self.counted: dict[tuple[str, CountedKind], dict[str, None]] = {}
        self.outputs: dict[str, dict[str, StoredOutput]] = {}
        self.keys: dict[JobsManagerKey, None] = {}

    async def create_job(self, job: JobState) -> JobState:
        if job.id in self.jobs:
            raise DuplicateRecordError(f"job {job.id!r} exists already")
        stored = job.model_copy(
            update={
                "version": 1,
                "completed_steps_counted": (),
                "stopped_steps_counted": (),
                "schema_version": SCHEMA_VERSION,
            }
        )
        self.jobs[job.id] = stored
        return stored

    async def get_job(self, job_id: str) -> JobState | None:
        return _checked(self.jobs.get(job_id), JobState, "jobs", job_id)

    async def save_job(self, job: JobState) -> JobState:
        current = self.jobs.get(job.id)
        if current is None or current.version != job.version:
            found = "no record" if current is None else f"version {current.version}"
            raise ConcurrencyError(f"job {job.id!r} is at {found}, not {job.version}")
        stored = job.model_copy(
            update={
                "version": job.version + 1,
                "completed_steps_counted": (),
                "stopped_steps_counted": (),
                "schema_version": SCHEMA_VERSION,
            }
        )
        self.jobs[job.id] = stored
        return stored

    async def list_jobs(
        self, scope: str, namespace: str, status: JobStatus | None = None
    ) -> list[JobState]:
        return [
            j
            for job_id, job in self.jobs.items()
            if (j := _checked(job, JobState, "jobs", job_id)) is not None
            and j.scope == scope
            and j.namespace == namespace
            and (status is None or j.status == status)
        ]

    async def get_jobs_excluding_finalized_stops(
        self, scope: str, namespace: str
    ) -> list[JobState]:
        jobs = [
            j
            for j in await self.list_jobs(scope, namespace)
            if not (j.status == JobStatus.STOPPED and j.stop_finalized)
        ]
        return sorted(jobs, key=lambda j: j.created)

    async def list_unsettled_jobs(self, scope: str, namespace: str) -> list[JobState]:
        return [
            j
            for j in await self.get_jobs_excluding_finalized_stops(scope, namespace)
            if j.status in REHYDRATED_JOB
        ]

    async def find_jobs(
        self,
        where: JobFilter,
        *,
        before: JobCursor | None = None,
        after: JobCursor | None = None,
        limit: int = 50,
    ) -> list[JobState]:
        found = [j for j in self._all_jobs() if where.matches(j)]
        if before is not None:
            found = [j for j in found if JobCursor.of(j) < before]
        if after is not None:
            newer = sorted((j for j in found if JobCursor.of(j) > after), key=JobCursor.of)
            return newer[:limit][::-1]
        return sorted(found, key=JobCursor.of, reverse=True)[:limit]

    async def count_jobs_by_type_and_status(self, where: JobFilter) -> JobCounts:
        counts: JobCounts = {}
        for j in self._all_jobs():
            if where.matches(j):
                counts[j.type, j.status] = counts.get((j.type, j.status), 0) + 1
        return counts

    def _all_jobs(self) -> list[JobState]:
        return [
            j
            for job_id, job in self.jobs.items()
            if (j := _checked(job, JobState, "jobs", job_id)) is not None
        ]

    async def list_jobs_for_cleanup(
        self,
        scope: str,
        namespace: str,
        statuses: Collection[JobStatus],
        before: datetime,
        limit: int,
    ) -> list[JobState]:
        wanted, before = set(statuses), as_utc(before)
        jobs = [
            (as_utc(j.status_since), j.id, j)
            for j in await self.list_jobs(scope, namespace)
            if j.status in wanted
        ]
        return [j for since, _, j in sorted(jobs, key=lambda t: t[:2]) if since < before][:limit]

    async def remove_job(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)

    async def insert_steps(self, steps: Sequence[StepState]) -> None:
        seen: set[str] = set()
        for step in steps:
            if step.key in seen or step.step_id in self.steps.get(step.job_id, {}):
                raise DuplicateRecordError(f"step {step.key!r} exists already")
            seen.add(step.key)
        for step in steps:
            self.steps.setdefault(step.job_id, {})[step.step_id] = step
            self._sorted_ids.pop(step.job_id, None)

    async def insert_plan(self, job_id: str, steps: Sequence[PlannedStep]) -> None:
        await self.insert_steps(planned_records(job_id, steps))

    async def get_step(self, job_id: str, step_id: str) -> StepState | None:
        step = self.steps.get(job_id, {}).get(step_id)
        return _checked(step, StepState, "job_steps", f"{job_id}/{step_id}")

    async def get_steps(self, job_id: str, step_ids: Collection[str]) -> dict[str, StepState]:
        steps = self.steps.get(job_id, {})
        found: dict[str, StepState] = {}
        for step_id in step_ids:
            step = _checked(steps.get(step_id), StepState, "job_steps", f"{job_id}/{step_id}")
            if step is not None:
                found[step_id] = step
        return found

    async def list_steps(
        self,
        job_id: str,
        *,
        statuses: Collection[StepStatus] | None = None,
        stage: int | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> list[StepState]:
        steps = self.steps.get(job_id, {})
        ids = self._sorted_ids.get(job_id)
        if ids is None:
            ids = self._sorted_ids[job_id] = sorted(steps)
        start = 0 if after is None else bisect.bisect_right(ids, after)
        page: list[StepState] = []
        for step_id in ids[start:]:
            step = _checked(steps.get(step_id), StepState, "job_steps", f"{job_id}/{step_id}")
            if step is None or (statuses is not None and step.status not in statuses):
                continue
            if stage is not None and step.stage != stage:
                continue
            page.append(step)
            if len(page) >= limit:
                break
        return page

    async def list_starts(
        self,
        job_id: str,
        *,
        statuses: Collection[StepStatus] | None = None,
        stage: int | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> list[StoredStart]:
        page = await self.list_steps(
            job_id, statuses=statuses, stage=stage, after=after, limit=limit
        )
        return starts_of(page)

    async def list_failed(
        self, job_id: str, signature: str, *, after: str | None = None, limit: int = 1000
    ) -> list[StepState]:
        page: list[StepState] = []
        while len(page) < limit:
            steps = await self.list_steps(job_id, after=after, limit=limit)
            page += [s for s in steps if s.failure_signature == signature]
            if len(steps) < limit:
                break
            after = steps[-1].step_id
        return page[:limit]

    async def failure_clusters(self, job_id: str) -> list[FailureCluster]:
        groups: dict[str, list[StepState]] = {}
        for step in await self.list_steps(job_id, limit=len(self.steps.get(job_id, {}))):
            if step.failure_signature is not None:
                groups.setdefault(step.failure_signature, []).append(step)
        return sorted(
            (failure_cluster(signature, steps) for signature, steps in groups.items()),
            key=lambda c: (-c.count, c.signature),
        )

    async def update_steps(self, updates: Sequence[StepUpdate]) -> None:
        now = utcnow()
        for u in updates:
            steps = self.steps.get(u.job_id, {})
            step = steps.get(u.step_id)
            if step is None or step.attempt > u.attempt:
                continue
            changes = step.status_changes
            if u.change is not None and changes[-1:] != (u.change,):
                changes = (*changes, u.change)
            steps[u.step_id] = step.model_copy(
                update={
                    "status": u.status,
                    "attempt": u.attempt,
                    "lease": u.lease,
                    "status_changes": changes,
                    "updated": now,
                    "failure_signature": u.failure_signature,
                }
            )
        for job_id, ended in ended_without_output(updates).items():
            existing = self.steps.get(job_id, {})
            await self.delete_outputs(job_id, [e for e in ended if e[0] in existing])

    async def renew_leases(self, renewals: Sequence[LeaseRenewal]) -> int:
        now = utcnow()
        renewed = 0
        for r in renewals:
            steps = self.steps.get(r.job_id, {})
            step = steps.get(r.step_id)
            if step is None or step.status is not StepStatus.RUNNING or step.attempt != r.attempt:
                continue
            steps[r.step_id] = step.model_copy(update={"lease": r.lease, "updated": now})
            renewed += 1
        return renewed

    async def delete_steps(
        self, job_id: str, step_ids: Collection[str], outputs: Sequence[StoredOutput] = ()
    ) -> None:
        await self.put_outputs(outputs)
        steps = self.steps.get(job_id, {})
        for step_id in step_ids:
            steps.pop(step_id, None)

    async def has_steps(self, job_id: str, stage: int, statuses: Collection[StepStatus]) -> bool:
        wanted = frozenset(statuses)
        return any(step.stage == stage and step.status in wanted for step in self._steps(job_id))

    async def count_by_status(self, job_id: str) -> StatusCounts:
        counts: StatusCounts = {}
        for step in self._steps(job_id):
            key = (step.stage, step.status)
            counts[key] = counts.get(key, 0) + 1
        return counts

    def _steps(self, job_id: str) -> list[StepState]:
        """The job's records, each checked as a read checks it."""
        checked = (
            _checked(step, StepState, "job_steps", f"{job_id}/{step_id}")
            for step_id, step in self.steps.get(job_id, {}).items()
        )
        return [step for step in checked if step is not None]

    async def remove_job_steps(self, job_id: str) -> None:
        self.steps.pop(job_id, None)
        self._sorted_ids.pop(job_id, None)

    async def add_counted(self, job_id: str, kind: CountedKind, step_ids: Collection[str]) -> None:
        self.counted.setdefault((job_id, kind), {}).update(dict.fromkeys(step_ids))

    async def remove_counted(self, job_id: str, kind: CountedKind, step_id: str) -> None:
        self.counted.get((job_id, kind), {}).pop(step_id, None)

    async def list_counted(self, job_id: str, kind: CountedKind) -> list[str]:
        return sorted(self.counted.get((job_id, kind), {}))

    async def count_counted(self, job_id: str, kind: CountedKind) -> int:
        return len(self.counted.get((job_id, kind), {}))

    async def remove_job_counted(self, job_id: str) -> None:
        for kind in CountedKind:
            self.counted.pop((job_id, kind), None)

    async def put_outputs(self, outputs: Sequence[StoredOutput]) -> None:
        for o in outputs:
            stored = self.outputs.setdefault(o.job_id, {})
            current = stored.get(o.step_id)
            if current is None or current.attempt <= o.attempt:
                stored[o.step_id] = o

    async def delete_outputs(self, job_id: str, steps: Sequence[tuple[str, int]]) -> None:
        stored = self.outputs.get(job_id, {})
        for step_id, attempt in steps:
            current = stored.get(step_id)
            if current is not None and current.attempt <= attempt:
                del stored[step_id]

    async def list_outputs(
        self,
        job_id: str,
        *,
        stage: int | None = None,
        after: str | None = None,
        until: str | None = None,
        limit: int = 1000,
    ) -> list[StoredOutput]:
        stored = self.outputs.get(job_id, {})
        ids = sorted(
            step_id
            for step_id, o in stored.items()
            if (after is None or step_id > after)
            and (until is None or step_id <= until)
            and (stage is None or o.stage == stage)
        )
        return [stored[step_id] for step_id in ids[:limit]]

    async def count_outputs(self, job_id: str, stage: int | None = None) -> int:
        stored = self.outputs.get(job_id, {}).values()
        return sum(1 for o in stored if stage is None or o.stage == stage)

    async def output_span(self, job_id: str, stage: int | None = None) -> tuple[str, str] | None:
        stored = self.outputs.get(job_id, {}).values()
        ids = [o.step_id for o in stored if stage is None or o.stage == stage]
        return (min(ids), max(ids)) if ids else None

    async def remove_job_outputs(self, job_id: str) -> None:
        self.outputs.pop(job_id, None)

    async def add_manager_key(self, key: JobsManagerKey) -> None:
        self.keys[key] = None

    async def list_manager_keys(self) -> list[JobsManagerKey]:
        return list(self.keys)

    async def close(self) -> None:
        return None


_R = TypeVar("_R", JobState, StepState)


def _checked(record: object, model: type[_R], collection: str, key: str) -> _R | None:
    """`record`, unless something other than a `model` was stored under `key` (as a test does
    to inject a corrupt record) or it is of a newer schema than this release reads."""
    if record is None:
        return None
    if isinstance(record, model):
        check_schema_version(collection, key, record.schema_version)
        return record
    raise CorruptRecordError(collection, key, f"not a {model.__name__}: {record!r:.80}")
