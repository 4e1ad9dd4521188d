"""The cleanup pass's rules on the memory storage, without Ray (issue 12, item 3): terminal jobs
past `terminal_job_retention`, oldest first and at most `max_terminal_jobs_per_cleanup` a pass;
jobs PREPARING without steps past `dead_job_threshold`; at most `max_concurrent_cleanup`
removals at once; nothing else touched; never a job in use or with a live activation. Ages are
set through storage: each job is created with its status changes in the past."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from choreography_ray.core import cleanup as cleanup_module
from choreography_ray.core.backoff import Backoff
from choreography_ray.core.cleanup import (
    Claims,
    Cleanup,
    CleanupPolicy,
    Removal,
    due,
    keeps_records,
)
from choreography_ray.model import JobProgress, JobsManagerKey, JobState, StatusChange, StepState
from choreography_ray.options import JobsOptions
from choreography_ray.status import JobStatus
from choreography_ray.storage import CountedKind, StoredOutput
from choreography_ray.storage.memory import MemoryStorage
from choreography_ray.types import type_path
from tests.unit.core.fakes import FaultyStorage
from tests.unit.core.harness import eventually
from tests.unit.core.jobs import NotKeptJob, NotKeptWithFailuresJob, StagedJob

pytestmark = pytest.mark.timeout(30)

S = JobStatus
NOW = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)
KEY = JobsManagerKey(scope="unit", namespace="cleanup")
DAY, HOUR = timedelta(days=1), timedelta(hours=1)


def run(scenario: Callable[[], Any]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 20))


def aged(job_id: str, status: JobStatus, age: timedelta, **fields: Any) -> JobState:
    """A job of KEY that reached `status` `age` before NOW, created a year earlier."""
    reached = NOW - age
    history = (StatusChange(status=S.PREPARING_JOB, occurred=reached - 365 * DAY),
               StatusChange(status=status, occurred=reached))  # fmt: skip
    return JobState(id=job_id, scope=KEY.scope, namespace=KEY.namespace, status=status,
                    status_changes=history, created=reached - 365 * DAY,
                    **{"type": type_path(StagedJob), **fields})  # fmt: skip


async def store(storage: MemoryStorage, *jobs: JobState, steps: int = 0) -> None:
    for job in jobs:
        await storage.create_job(job)
        await storage.insert_steps(
            [StepState(job_id=job.id, step_id=f"{n:03}", type="pkg:Step") for n in range(steps)]
        )
        if steps:
            await storage.add_counted(job.id, CountedKind.COMPLETED, ["000"])
            await storage.put_outputs([StoredOutput(job.id, "900", 0, 1, '{"n": 1}')])


class Activations:
    """Which jobs have a live activation (what the Ray shell asks its GCS)."""

    def __init__(self) -> None:
        self.live: set[str] = set()
        self.asked: list[str] = []

    async def __call__(self, job_id: str) -> bool:
        self.asked.append(job_id)
        return job_id in self.live


def make(storage: MemoryStorage, options: JobsOptions | None = None, **kwargs: Any) -> Cleanup:
    policy = CleanupPolicy.of(options or JobsOptions())
    defaults: dict[str, Any] = {"claims": Claims(), "is_active": Activations()}
    parts = {**defaults, **kwargs}
    return Cleanup(storage, KEY, policy, parts["claims"], parts["is_active"], clock=lambda: NOW)


async def ids(storage: MemoryStorage) -> set[str]:
    return {j.id for j in await storage.list_jobs(KEY.scope, KEY.namespace)}


# -- the rules on one record ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "age", "expected"),
    [
        (S.COMPLETED_SUCCESSFULLY, 8 * DAY, Removal.RETENTION),
        (S.COMPLETED_WITH_FAILURES, 8 * DAY, Removal.RETENTION),
        (S.FAILED, 8 * DAY, Removal.RETENTION),
        (S.COMPLETED_SUCCESSFULLY, 7 * DAY, None),  # exactly the retention: not older
        (S.FAILED, 6 * DAY, None),
        (S.PREPARING_JOB, 2 * HOUR, Removal.DEAD),
        (S.PREPARING_STEPS, 2 * HOUR, Removal.DEAD),
        (S.PREPARING_JOB, 30 * timedelta(minutes=1), None),
        (S.STARTING_STEPS, 365 * DAY, None),
        (S.RUNNING, 365 * DAY, None),
        (S.STOPPED, 365 * DAY, None),
        (S.REMOVING, 365 * DAY, None),
        (S.NONE, 365 * DAY, None),
    ],
)
def test_due__by_status_and_the_age_of_the_status(
    status: JobStatus, age: timedelta, expected: Removal | None
) -> None:
    assert due(aged("j", status, age), NOW, CleanupPolicy()) is expected


def test_due__measured_from_the_last_status_change_else_created() -> None:
    # Created a year ago but completed an hour ago: kept.
    assert due(aged("j", S.COMPLETED_SUCCESSFULLY, HOUR), NOW, CleanupPolicy()) is None
    unchanged = JobState(id="j", scope="s", namespace="n", type="t", status=S.PREPARING_JOB,
                         created=NOW - 2 * HOUR)  # fmt: skip
    assert due(unchanged, NOW, CleanupPolicy()) is Removal.DEAD


def test_due__a_preparing_job_whose_record_counts_steps_is_not_dead() -> None:
    planned = aged("j", S.PREPARING_STEPS, DAY, progress=JobProgress(total_steps=3))
    assert due(planned, NOW, CleanupPolicy()) is None


@pytest.mark.parametrize("off", [None, 0, -1, float("inf")])
def test_due__an_option_turned_off_removes_nothing_of_its_kind(off: float | None) -> None:
    policy = CleanupPolicy.of(JobsOptions(terminal_job_retention=off, dead_job_threshold=off))
    assert policy.retention is None and policy.dead_after is None
    assert due(aged("j", S.FAILED, 3650 * DAY), NOW, policy) is None
    assert due(aged("j", S.PREPARING_JOB, 3650 * DAY), NOW, policy) is None


def test_keeps_records__per_job_type_and_outcome() -> None:
    assert keeps_records(StagedJob, S.COMPLETED_SUCCESSFULLY)
    assert keeps_records(StagedJob, S.COMPLETED_WITH_FAILURES)
    assert not keeps_records(NotKeptJob, S.COMPLETED_SUCCESSFULLY)
    assert keeps_records(NotKeptJob, S.COMPLETED_WITH_FAILURES)
    assert keeps_records(NotKeptWithFailuresJob, S.COMPLETED_SUCCESSFULLY)
    assert not keeps_records(NotKeptWithFailuresJob, S.COMPLETED_WITH_FAILURES)
    for job_type in (NotKeptJob, NotKeptWithFailuresJob):
        for status in (S.FAILED, S.STOPPED, S.RUNNING):
            assert keeps_records(job_type, status)


# -- a pass -----------------------------------------------------------------------------------


def test_pass__removes_old_terminal_and_dead_jobs_with_their_records_and_nothing_else() -> None:
    async def scenario() -> None:
        storage = MemoryStorage()
        await store(storage, aged("done", S.COMPLETED_SUCCESSFULLY, 8 * DAY), steps=2)
        await store(storage, aged("failures", S.COMPLETED_WITH_FAILURES, 30 * DAY), steps=1)
        await store(storage, aged("failed", S.FAILED, 9 * DAY))
        await store(storage, aged("dead-job", S.PREPARING_JOB, 2 * HOUR))
        await store(storage, aged("dead-steps", S.PREPARING_STEPS, 2 * HOUR))
        kept = [
            aged("done-recently", S.COMPLETED_SUCCESSFULLY, 6 * DAY),
            aged("preparing-now", S.PREPARING_JOB, 10 * timedelta(minutes=1)),
            aged("starting", S.STARTING_STEPS, 365 * DAY),
            aged("running", S.RUNNING, 365 * DAY),
            aged("stopped", S.STOPPED, 365 * DAY, stop_finalized=True),
            aged("stopping", S.STOPPED, 365 * DAY),
            aged("removing", S.REMOVING, 365 * DAY),
            aged("none", S.NONE, 365 * DAY),
        ]
        await store(storage, *kept)
        # Preparing with a stored step (its plan being written), or a plan in its record.
        await store(storage, aged("preparing-with-steps", S.PREPARING_STEPS, DAY), steps=1)
        planned = aged("planned", S.PREPARING_STEPS, DAY, progress=JobProgress(total_steps=1))
        await store(storage, planned)
        other = aged("elsewhere", S.FAILED, 30 * DAY).model_copy(update={"namespace": "other"})
        await store(storage, other)

        report = await make(storage).run_pass()

        assert report.removed == {
            "failures": Removal.RETENTION,
            "failed": Removal.RETENTION,
            "done": Removal.RETENTION,
            "dead-job": Removal.DEAD,
            "dead-steps": Removal.DEAD,
        }
        assert list(report.removed)[:3] == ["failures", "failed", "done"]  # oldest first
        assert await ids(storage) == {j.id for j in kept} | {"preparing-with-steps", "planned"}
        assert await storage.get_job("elsewhere") is not None
        for job_id in ("done", "failures"):
            assert await storage.list_steps(job_id) == []
            assert await storage.list_counted(job_id, CountedKind.COMPLETED) == []
            assert await storage.count_outputs(job_id) == 0
        assert await storage.list_steps("preparing-with-steps") != []
        assert await storage.count_outputs("preparing-with-steps") == 1

    run(scenario)


def test_pass__at_most_max_terminal_jobs_per_cleanup_oldest_first() -> None:
    async def scenario() -> None:
        storage = MemoryStorage()
        for n in range(5):
            await store(storage, aged(f"done-{n}", S.COMPLETED_SUCCESSFULLY, (20 - n) * DAY))
        cleanup = make(storage, JobsOptions(max_terminal_jobs_per_cleanup=2))

        assert list((await cleanup.run_pass()).removed) == ["done-0", "done-1"]
        assert list((await cleanup.run_pass()).removed) == ["done-2", "done-3"]
        assert list((await cleanup.run_pass()).removed) == ["done-4"]
        assert cleanup.passes == 3

    run(scenario)


def test_pass__without_a_per_pass_limit_removes_every_due_job_a_page_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cleanup_module, "TERMINAL_PAGE", 3)

    async def scenario() -> None:
        storage = MemoryStorage()
        for n in range(10):
            await store(storage, aged(f"done-{n:02}", S.FAILED, (20 + n) * DAY))
        await store(storage, aged("young", S.FAILED, DAY))

        report = await make(storage, JobsOptions(max_terminal_jobs_per_cleanup=None)).run_pass()

        assert len(report.removed) == 10
        assert await ids(storage) == {"young"}

    run(scenario)


@pytest.mark.parametrize(("concurrency", "expected"), [(4, 4), (2, 2), (None, 12)])
def test_pass__at_most_max_concurrent_cleanup_removals_at_once(
    concurrency: int | None, expected: int
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        for n in range(10):
            await store(storage, aged(f"done-{n}", S.COMPLETED_SUCCESSFULLY, 8 * DAY))
        for n in range(2):
            await store(storage, aged(f"dead-{n}", S.PREPARING_JOB, 2 * HOUR))
        running = peak = 0
        removals = storage.remove_job_steps

        async def slow_removal(job_id: str) -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1
            await removals(job_id)

        storage.remove_job_steps = slow_removal  # type: ignore[method-assign]
        options = JobsOptions(max_concurrent_cleanup=concurrency)

        report = await make(storage, options).run_pass()

        assert len(report.removed) == 12
        # The dead jobs are a second batch after the terminal ones: the bound holds in each.
        assert peak == min(expected, 10)

    run(scenario)


def test_pass__a_job_with_a_live_activation_or_in_use_is_skipped_then_removed_later() -> None:
    async def scenario() -> None:
        storage = MemoryStorage()
        await store(storage, aged("exiting", S.COMPLETED_SUCCESSFULLY, 8 * DAY))
        await store(storage, aged("in-use", S.COMPLETED_SUCCESSFULLY, 9 * DAY))
        await store(storage, aged("mid-prepare", S.PREPARING_JOB, 2 * HOUR))
        claims, active = Claims(), Activations()
        active.live = {"exiting", "mid-prepare"}
        cleanup = make(storage, claims=claims, is_active=active)

        async with claims.using("in-use"):
            report = await cleanup.run_pass()
        assert report.removed == {}
        assert sorted(report.skipped) == ["exiting", "in-use", "mid-prepare"]
        assert "in-use" not in active.asked  # in use here: Ray is not even asked
        assert await ids(storage) == {"exiting", "in-use", "mid-prepare"}

        active.live.clear()
        report = await cleanup.run_pass()
        assert set(report.removed) == {"exiting", "in-use", "mid-prepare"}

    run(scenario)


def test_pass__a_job_that_changed_since_the_query_is_left_alone() -> None:
    async def scenario() -> None:
        storage = MemoryStorage()
        await store(storage, aged("reopened", S.COMPLETED_WITH_FAILURES, 8 * DAY))
        await store(storage, aged("planned", S.PREPARING_JOB, 2 * HOUR))

        async def is_active(job_id: str) -> bool:
            # Between the query and the removal: one job reopened, the other's plan stored.
            state = await storage.get_job(job_id)
            assert state is not None
            if job_id == "reopened":
                await storage.save_job(state.with_status(S.RUNNING))
            else:
                await storage.insert_steps([StepState(job_id=job_id, step_id="0", type="p:S")])
            return False

        report = await make(storage, is_active=is_active).run_pass()

        assert report.removed == {}
        assert await ids(storage) == {"reopened", "planned"}

    run(scenario)


def test_pass__a_removal_that_fails_holds_up_no_other_and_is_retried_next_pass() -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        await store(storage, aged("first", S.FAILED, 9 * DAY))
        await store(storage, aged("second", S.FAILED, 8 * DAY))
        storage.fail("remove_job_steps")
        cleanup = make(storage, JobsOptions(max_concurrent_cleanup=1))

        report = await cleanup.run_pass()
        assert list(report.failed) == ["first"]
        assert "StorageUnavailableError" in report.failed["first"]
        assert list(report.removed) == ["second"]

        assert list((await cleanup.run_pass()).removed) == ["first"]
        assert await ids(storage) == set()

    run(scenario)


def test_pass__an_operation_waits_for_a_removal_in_progress_then_finds_the_job_gone() -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        await store(storage, aged("done", S.COMPLETED_SUCCESSFULLY, 8 * DAY))
        claims = Claims()
        gate = asyncio.Event()
        storage.gate("remove_job_steps", gate)
        cleanup = make(storage, claims=claims)

        removal = asyncio.create_task(cleanup.run_pass())
        await asyncio.sleep(0.01)
        seen: list[JobState | None] = []

        async def operation() -> None:
            async with claims.using("done"):
                seen.append(await storage.get_job("done"))

        waiting = asyncio.create_task(operation())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        gate.set()
        await removal
        await waiting
        assert seen == [None]

    run(scenario)


# -- release ----------------------------------------------------------------------------------


def test_release__drops_a_completed_job_its_type_does_not_keep_and_clears_other_holds() -> None:
    async def scenario() -> None:
        storage = MemoryStorage()
        not_kept = type_path(NotKeptJob)
        young = timedelta(minutes=1)
        await store(storage, aged("dropped", S.COMPLETED_SUCCESSFULLY, young, type=not_kept,
                                  held=True), steps=1)  # fmt: skip
        await store(storage, aged("failed", S.COMPLETED_WITH_FAILURES, young, type=not_kept,
                                  held=True))  # fmt: skip
        await store(storage, aged("stopped", S.STOPPED, young, type=not_kept, held=True))
        await store(storage, aged("kept", S.COMPLETED_SUCCESSFULLY, young, held=True))
        await store(storage, aged("unknown-type", S.COMPLETED_SUCCESSFULLY, young,
                                  type="no.such.module:Job", held=True))  # fmt: skip
        cleanup = make(storage)

        assert await cleanup.release("dropped") is True
        for job_id in ("failed", "stopped", "kept", "unknown-type", "missing"):
            assert await cleanup.release(job_id) is False, job_id

        assert await ids(storage) == {"failed", "stopped", "kept", "unknown-type"}
        assert await storage.list_steps("dropped") == []
        assert cleanup.removed == {"dropped": Removal.NOT_KEPT}
        # No longer held: a later completion (after a reopen) drops them itself.
        for job_id in ("failed", "stopped", "kept", "unknown-type"):
            state = await storage.get_job(job_id)
            assert state is not None and not state.held, job_id

    run(scenario)


def test_release__waits_out_a_live_activation_then_gives_up_to_retention(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cleanup_module, "RELEASE_BACKOFF", Backoff(0.001, 0.001))

    async def scenario() -> None:
        storage = MemoryStorage()
        done = aged("done", S.COMPLETED_SUCCESSFULLY, HOUR, type=type_path(NotKeptJob), held=True)
        await store(storage, done)
        active = Activations()
        active.live = {"done"}
        cleanup = make(storage, is_active=active)

        assert await cleanup.release("done") is False
        assert len(active.asked) == cleanup_module.RELEASE_ATTEMPTS
        assert await ids(storage) == {"done"}

        active.asked.clear()
        monkeypatch.setattr(cleanup_module, "RELEASE_BACKOFF", Backoff(0.05, 0.05))
        task = asyncio.create_task(cleanup.release("done"))
        await eventually(lambda: active.asked, what="the first try")
        active.live.clear()  # the actor exited
        assert await task is True
        assert await ids(storage) == set()

    run(scenario)
