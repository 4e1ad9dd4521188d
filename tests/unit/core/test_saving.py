"""Saving the job record and its counted-step records: a failed save loses nothing (issue 9,
item 4); a failed take-back of a counted stop is not left behind (item 8)."""

from __future__ import annotations

import asyncio

import pytest

from choreography_ray.core.counting import Counting
from choreography_ray.errors import JobOperationError, StorageError
from choreography_ray.status import JobStatus
from choreography_ray.storage import CountedKind
from tests.unit.core.conftest import Activations
from tests.unit.core.fakes import STOPPED, FaultyStorage
from tests.unit.core.harness import Harness, eventually
from tests.unit.core.jobs import Plan, StagedJob

pytestmark = pytest.mark.timeout(30)


# -- item 4 ---------------------------------------------------------------------------------------


def test_save__a_failed_progress_save_keeps_the_counts_and_the_dirty_flag(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[1, 2]), storage=storage)
        await h.c.start()
        await h.hosts.finish("000000")
        await h.settle()
        assert (await h.stored()).stage == 1  # a stage change is stored when it happens
        await h.hosts.finish("000001")
        await h.settle()
        storage.fail("save_job", 1)

        with pytest.raises(StorageError):
            await h.save_progress()
        assert h.c.stages[1].successful == 1
        assert h.c.dirty
        assert (await h.stored()).progress.stages[1].successful_steps == 0

        await h.save_progress()
        stored = await h.stored()
        assert stored.progress.stages[0].successful_steps == 1
        assert stored.progress.stages[1].successful_steps == 1
        assert not h.c.dirty

    activations.run(scenario)


def test_save__the_periodic_save_retries_a_failed_save(
    activations: Activations, fast_backoff: object
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(
            StagedJob, Plan(sizes=[1, 1]), storage=storage, progress_save_interval=0.02
        )
        await h.c.start()
        storage.fail("save_job", 2)
        await h.hosts.finish("000000")
        await eventually(lambda: storage.jobs[h.job_id].stage == 1, what="stage 1 saved")
        assert storage.jobs[h.job_id].progress.successful_steps == 1

    activations.run(scenario)


def test_save__a_report_during_a_slow_save_is_not_lost(activations: Activations) -> None:
    """The save's write waits; a report arrives meanwhile and waits for its turn; the next
    save carries it (a save that snapshot the state before its await would write it back)."""

    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[3]), storage=storage)
        await h.c.start()
        await h.hosts.finish("000000")
        slow = asyncio.Event()
        storage.gate("save_job", slow)
        save = asyncio.create_task(h.save_progress())
        await h.settle()
        report = asyncio.create_task(h.hosts.finish("000001"))
        await h.settle()
        assert not report.done()
        del storage.gates["save_job"]
        slow.set()
        await asyncio.gather(save, report)
        await h.settle()
        assert h.c.stages[0].successful == 2
        await h.save_progress()
        assert (await h.stored()).progress.successful_steps == 2
        await h.hosts.finish("000002")
        await h.settle()
        stored = await h.stored()
        assert (stored.status, stored.progress.successful_steps) == (
            JobStatus.COMPLETED_SUCCESSFULLY,
            3,
        )

    activations.run(scenario)


def test_save__a_lost_acknowledgement_of_the_terminal_save_still_ends_the_job_once(
    activations: Activations, fast_backoff: object
) -> None:
    """The completed status is written but its answer lost: the activation's version is stale.
    The job must still end COMPLETED, and on_completed run once."""

    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(
            StagedJob, Plan(sizes=[1]), storage=storage, progress_save_interval=0.02
        )
        await h.c.start()
        storage.ack_lost("save_job", 1)
        await h.hosts.finish("000000")

        await eventually(lambda: h.c.job_state.status is JobStatus.COMPLETED_SUCCESSFULLY)
        await asyncio.sleep(0.1)
        assert (await h.status()) is JobStatus.COMPLETED_SUCCESSFULLY
        assert h.calls["on_completed"] == 1

    activations.run(scenario)


# -- item 8 ---------------------------------------------------------------------------------------


async def resumed_after_a_stop(activations: Activations, storage: FaultyStorage) -> Harness:
    """A job of two steps, stopped (both stops counted and recorded) and resumed."""
    h = await activations.new(StagedJob, Plan(sizes=[2]), storage=storage)
    await h.c.start()
    await h.c.stop()
    await h.hosts.stop_cancelled()
    await h.settle()
    assert await h.counted(CountedKind.STOPPED) == ["000000", "000001"]
    await h.c.resume()
    await h.settle()
    assert h.hosts.running_ids() == {"000000", "000001"}
    return h


def test_counted__a_failed_take_back_of_a_stop_is_written_with_the_next_save(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await resumed_after_a_stop(activations, storage)
        await h.hosts.finish("000000")  # its stop is taken back
        await h.settle()
        storage.fail("remove_counted", 1)

        with pytest.raises(StorageError):
            await h.save_progress()
        assert await h.counted(CountedKind.STOPPED) == ["000000", "000001"]
        await h.save_progress()
        assert await h.counted(CountedKind.STOPPED) == ["000001"]

        # Stopped and resumed again: the stale record would count a second stop.
        await h.c.stop()
        await h.hosts.stop_cancelled()
        await h.settle()
        stored = await h.stored()
        assert stored.progress.stopped_steps == 1
        assert stored.progress.successful_steps == 1
        await h.c.resume()
        await h.settle()
        assert h.c.stages[0].stopped == 1
        await h.hosts.finish_all()
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert (stored.progress.successful_steps, stored.progress.stopped_steps) == (2, 0)
        assert await h.counted(CountedKind.STOPPED) == []

    activations.run(scenario)


def test_counted__a_stop_record_of_a_step_that_since_succeeded_is_not_counted_on_reactivation(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await resumed_after_a_stop(activations, storage)
        await h.hosts.finish("000000")  # succeeded; its stop is taken back in memory only
        await h.activate(reconstructed=True)  # the actor is lost before its next save
        await h.settle()

        counters = h.c.stages[0]
        assert counters.successful + counters.stopped <= counters.total
        await h.hosts.finish("000001")
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert (stored.progress.successful_steps, stored.progress.stopped_steps) == (2, 0)

    activations.run(scenario)


def test_counted__a_stop_counted_twice_is_counted_once(activations: Activations) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        await h.c.start()
        await h.c.stop()
        await h.hosts.finish("000000", STOPPED, deliver=2)
        await h.hosts.finish("000001", STOPPED)
        await h.settle()
        stored = await h.stored()
        assert stored.progress.stopped_steps == 2
        assert await h.counted(CountedKind.STOPPED) == ["000000", "000001"]

    activations.run(scenario)


def test_save__a_lost_answer_of_a_status_save_is_read_back(
    activations: Activations, fast_backoff: object
) -> None:
    """A save that wrote but lost its answer is read back once: the record moved on by one
    version with this save's status, so the save succeeded and the removal goes on."""

    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[1]), storage=storage)
        await h.c.start()
        await h.hosts.finish("000000")
        await h.settle()
        assert (await h.status()) is JobStatus.COMPLETED_SUCCESSFULLY
        storage.ack_lost("save_job", 1)  # REMOVING is written; its answer lost, on purpose

        await h.c.remove()
        await h.settle()

        assert h.job_id not in storage.jobs

    activations.run(scenario)


def test_save__a_removal_stored_without_an_answer_is_finished_by_the_watchdog(
    activations: Activations, fast_backoff: object
) -> None:
    """The answer and the read-back both fail: the caller gets an error, storage says REMOVING.
    The next watchdog tick reads the record, finds its own write, and finishes the removal."""

    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[1]), storage=storage)
        await h.c.start()
        await h.hosts.finish("000000")
        await h.settle()
        storage.ack_lost("save_job", 1)  # REMOVING is written; its answer lost, on purpose
        storage.fail("get_job", 1)  # and the read-back fails, on purpose

        with pytest.raises(JobOperationError):
            await h.c.remove()
        assert storage.jobs[h.job_id].status is JobStatus.REMOVING
        await h.c.watchdog_tick()
        await h.settle()

        assert h.job_id not in storage.jobs, "the removal stored is never finished"

    activations.run(scenario)


def test_counting__a_failed_take_back_never_leaves_a_step_stored_both_ways() -> None:
    """Found by the storage-fault state machine: the outcome's record was written before the
    take-back of its stop, which then failed; a new activation read the step counted as an
    outcome and as stopped. Take-backs are written first now."""

    async def scenario() -> None:
        storage = FaultyStorage()
        counting = Counting()
        counting.count_stop("s")
        await counting.flush(storage, "job")
        counting.records = True
        counting.take_back_stop("s")
        counting.count_outcome("s")
        storage.fail("remove_counted", 1)

        with pytest.raises(StorageError):
            await counting.flush(storage, "job")
        assert await storage.list_counted("job", CountedKind.STOPPED) == ["s"]
        assert await storage.list_counted("job", CountedKind.COMPLETED) == []
        await counting.flush(storage, "job")
        assert await storage.list_counted("job", CountedKind.STOPPED) == []
        assert await storage.list_counted("job", CountedKind.COMPLETED) == ["s"]

    asyncio.run(scenario())
