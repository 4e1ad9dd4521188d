"""Operations of two writes, and the half-written states a failure between them leaves: each
is one write now, or heals on the next cycle. Faults are injected into the memory storage."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any

import pytest

from choreography_ray.scheduler.core import SchedulerCore
from choreography_ray.scheduler.manifest_manager import new_run
from choreography_ray.scheduler.port import JobView
from choreography_ray.scheduler.records import WorkEntry
from choreography_ray.scheduler.schedules import Every
from choreography_ray.scheduler.status import DeadLetterStatus, EntryKind, RunStatus, WorkStatus
from choreography_ray.status import JobStatus
from tests.unit.scheduler.harness import JOB, Harness, run

RUNS = JobView(JobStatus.RUNNING)


class Fault(Exception):
    """The storage failed this write."""


def fail_once(h: Harness, method: str) -> None:
    """The storage's next call of `method` fails, before it writes anything."""
    real: Callable[..., Coroutine[Any, Any, Any]] = getattr(h.storage, method)

    async def failing(*args: Any, **kwargs: Any) -> Any:
        setattr(h.storage, method, real)
        raise Fault(f"{method} failed")

    setattr(h.storage, method, failing)


async def queued_retry(h: Harness) -> str:
    """A manifest run every minute whose retry is queued (after a 5 min delay); its run's id."""
    h.jobs.ends_as = JobView(JobStatus.FAILED)
    core = await h.start()
    await core.schedule("m", JOB, {}, Every.minutes(1))
    await h.run_for(1.5)
    (entry,) = await h.storage.queued_entries("s", "m")
    return entry.run_id


def test_disable__a_failing_write_of_the_run_leaves_no_queued_run_behind() -> None:
    async def scenario() -> None:
        h = Harness()
        run_id = await queued_retry(h)
        fail_once(h, "save_run")
        with contextlib.suppress(Fault):  # the earlier code failed here, between its writes
            await h.core.schedule("m", JOB, {}, Every.minutes(1), enabled=False)
        await h.run_for(1)
        queued = await h.storage.get_run(run_id)
        assert queued is not None and queued.status is RunStatus.CANCELLED
        h.jobs.ends_as = RUNS
        await h.core.schedule("m", JOB, {}, Every.minutes(1), enabled=True)
        await h.run_for(90)  # the cancelled retry settled its occurrence: the next one runs
        assert (await h.core.runs("m"))[0].status is RunStatus.RUNNING

    run(scenario)


def test_a_waiting_run_whose_entry_was_cancelled_is_settled_by_the_next_cycle() -> None:
    async def scenario() -> None:
        h = Harness()
        run_id = await queued_retry(h)
        (entry,) = await h.storage.queued_entries("s", "m")
        # What a failure between MongoDB's two writes of a disable leaves.
        await h.storage.cancel_entry(entry.id)
        assert (await h.storage.get_entry(entry.id)).status is WorkStatus.CANCELLED  # type: ignore[union-attr]
        await h.run_for(1)
        settled = await h.storage.get_run(run_id)
        assert settled is not None and settled.status is RunStatus.CANCELLED

    run(scenario)


def test_a_queued_entry_whose_run_was_never_written_is_cancelled_and_the_manifest_queued() -> None:
    async def scenario() -> None:
        h = Harness()
        h.jobs.ends_as = RUNS
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(1), enabled=False)
        # What a failure between MongoDB's writes of an enqueue leaves: the entry alone.
        # A retry's, due in an hour: the dispatcher would not come across it before then.
        later = h.clock.now + timedelta(hours=1)
        orphan = WorkEntry(scope="s", manifest="m", run_id="never-written", scheduled_at=later)
        h.storage.entries[orphan.id] = orphan
        await core.schedule("m", JOB, {}, Every.minutes(1), enabled=True)
        await h.run_for(1)
        assert (await h.storage.get_entry(orphan.id)).status is WorkStatus.CANCELLED  # type: ignore[union-attr]
        (started,) = await core.runs("m")
        assert started.status is RunStatus.RUNNING

    run(scenario)


def test_a_queued_run_whose_entry_was_never_written_is_settled_by_the_next_cycle() -> None:
    async def scenario() -> None:
        h = Harness()
        h.jobs.ends_as = RUNS
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(1), enabled=False)
        # What an earlier release's MongoDB enqueue left: the run alone.
        _, lone = new_run(await core.manifest("m"), EntryKind.SCHEDULED, h.clock.now)
        await h.storage.save_run(lone)
        await core.schedule("m", JOB, {}, Every.minutes(1), enabled=True)
        await h.run_for(61)
        settled = await h.storage.get_run(lone.id)
        assert settled is not None and settled.status is RunStatus.CANCELLED
        assert (await core.runs("m"))[0].status is RunStatus.RUNNING  # it runs again

    run(scenario)


async def dead_lettered(h: Harness) -> str:
    """A manifest dead-lettered on its first failure; the dead letter's id."""
    h.jobs.ends_as = JobView(JobStatus.FAILED)
    core = await h.start()
    await core.schedule("m", JOB, {}, Every.hours(1), max_retries=0)
    await h.run_for(1.5)
    (letter,) = await core.dead_letters("m")
    return letter.id


def test_requeue__a_failing_enqueue_leaves_the_dead_letter_awaiting_a_second_requeue() -> None:
    async def scenario() -> None:
        h = Harness()
        letter = await dead_lettered(h)
        fail_once(h, "enqueue")
        with contextlib.suppress(Fault):
            await h.core.requeue(letter)
        run_id = await h.core.requeue(letter)  # the earlier code refused it: resolved already
        (resolved,) = await h.core.dead_letters("m")
        assert resolved.status is DeadLetterStatus.RETRIED
        assert (await h.storage.get_run(run_id)).status is RunStatus.QUEUED  # type: ignore[union-attr]

    run(scenario)


@pytest.mark.parametrize("completed_by", ["the next cycle", "a second requeue"])
def test_requeue__a_failing_resolution_is_completed_with_its_one_run(completed_by: str) -> None:
    async def scenario() -> None:
        h = Harness()
        letter = await dead_lettered(h)
        fail_once(h, "resolve_dead_letter")
        with contextlib.suppress(Fault):
            await h.core.requeue(letter)
        if completed_by == "the next cycle":
            await h.core.run_cycle()
        else:
            assert await h.core.requeue(letter) == letter  # its run has the dead letter's id
        (resolved,) = await h.core.dead_letters("m")
        assert resolved.status is DeadLetterStatus.RETRIED
        requeued = [r for r in await h.core.runs("m") if r.kind is EntryKind.DEAD_LETTER_REQUEUE]
        assert [r.id for r in requeued] == [letter]

    run(scenario)


def test_a_lock_that_lapses_in_the_middle_of_a_cycle_stops_its_writes() -> None:
    async def scenario() -> None:
        h = Harness()
        monotonic = [0.0]
        h.core = core = SchedulerCore("s", h.storage, h.jobs, h.options, holder="h",
                                      monotonic=lambda: monotonic[0])  # fmt: skip
        await core.start(loops=False)
        for name in ("a", "b"):
            await core.schedule(name, JOB, {}, Every.hours(1))
        real = h.storage.enqueue

        async def enqueue_then_lapse(*args: Any, **kwargs: Any) -> Any:
            done = await real(*args, **kwargs)
            monotonic[0] += h.options.lock_ttl.total_seconds() + 1  # no renewal came in time
            return done

        h.storage.enqueue = enqueue_then_lapse  # type: ignore[method-assign]
        await core.run_cycle()
        assert [e.manifest for e in await h.storage.queued_entries("s")] == ["a"]
        assert not await core.run_cycle()  # and nothing more until it holds the lock again

    run(scenario)
