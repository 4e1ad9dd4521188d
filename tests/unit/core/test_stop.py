"""Stop and remove: a failed removal finish runs one retry chain (issue 9, item 9); the watchdog
settles a lost report (item 14); a stop is final only once every step reported it (item 16)."""

from __future__ import annotations

import asyncio

import pytest

from choreography_ray.errors import JobOperationError, StopJobError
from choreography_ray.status import JobStatus, StepStatus
from tests.unit.core.conftest import FAST, Activations
from tests.unit.core.fakes import FAILED, STOPPED, FaultyStorage
from tests.unit.core.harness import Harness, eventually
from tests.unit.core.jobs import Plan, StagedJob

pytestmark = pytest.mark.timeout(30)


# -- item 16: a stop is final once every step reported it ----------------------------------------


def test_stop__is_final_only_once_every_running_step_reported_its_stop(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        await h.c.start()
        await h.c.stop()

        stored = await h.stored()
        assert (stored.status, stored.stop_finalized) == (JobStatus.STOPPED, False)
        assert not stored.progress.is_stopped
        await h.hosts.finish("000000", STOPPED)
        await h.settle()
        assert not (await h.stored()).stop_finalized
        assert h.calls["on_stopped"] == 0
        await h.hosts.finish("000001", STOPPED)
        await h.settle()

        stored = await h.stored()
        assert stored.stop_finalized
        assert stored.progress.stopped_steps == 2
        assert stored.progress.is_stopped
        assert h.calls["on_stopped"] == 1

    activations.run(scenario)


def test_stop__a_step_that_ignores_it_is_counted_with_its_outcome(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[3]), max_active_steps_per_job=2)
        await h.c.start()
        await h.c.stop()
        await h.hosts.finish("000000")  # ignored the stop, succeeded
        await h.hosts.finish("000001", FAILED, "boom")
        await h.settle()

        stored = await h.stored()
        assert stored.stop_finalized
        progress = stored.progress
        assert (progress.successful_steps, progress.failed_steps) == (1, 1)
        assert progress.stopped_steps == 1  # the step that never started
        assert progress.is_stopped

    activations.run(scenario)


def test_stop__a_retry_whose_start_failed_counts_as_failed_as_storage_holds_it(
    activations: Activations,
) -> None:
    """Found by the storage-faults state machine: a failed attempt's retry was handed to a host
    whose start operation threw; the stop then counted the step as a never-started stop, while
    storage holds its first attempt FAILED."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]), max_step_attempts=2)
        await h.c.start()
        await h.hosts.finish("000000")
        h.hosts.fail_starts = 1  # the retry's start operation throws
        await h.hosts.finish("000001", FAILED, "attempt 1")
        await h.settle()
        assert [s.step_id for s in h.c.window.failed_starts()] == ["000001"]

        await h.c.stop()
        await h.settle()

        stored = await h.stored()
        assert stored.stop_finalized
        progress = stored.progress
        assert (progress.successful_steps, progress.failed_steps) == (1, 1)
        assert progress.stopped_steps == 0
        assert (await h.steps())["000001"].status is StepStatus.FAILED

    activations.run(scenario)


def test_stop__a_retry_whose_host_stored_it_running_then_died_counts_once_as_stopped(
    activations: Activations,
) -> None:
    """Found by the chaos soak (seed 3910001): a retry's start operation, answered during the
    stop, threw because its host died after storing the attempt RUNNING. The failed start was
    counted as a never-started retry (failed), and the stop's sweep then found the attempt
    RUNNING on no host and counted it stopped too."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]), max_step_attempts=2)
        await h.c.start()
        await h.hosts.finish("000000")
        h.hosts.start_gate = asyncio.Event()  # the retry's start operation waits
        await h.hosts.finish("000001", FAILED, "attempt 1")
        await h.settle()
        stopping = asyncio.create_task(h.c.stop())
        await h.settle()
        h.hosts.die_after_running = 1
        h.hosts.start_gate.set()
        await stopping
        await h.settle()

        stored = await h.stored()
        assert stored.stop_finalized
        progress = stored.progress
        assert (progress.successful_steps, progress.failed_steps, progress.stopped_steps) == (
            1, 0, 1,
        )  # fmt: skip
        step = (await h.steps())["000001"]
        assert (step.status, step.attempt) == (StepStatus.STOPPED, 2)

    activations.run(scenario)


def test_stop__a_failed_save_leaves_the_job_running_and_a_later_stop_works(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[2]), storage=storage)
        await h.c.start()
        storage.fail("save_job", 1)

        with pytest.raises(JobOperationError) as raised:
            await h.c.stop()
        assert raised.value.error is StopJobError.COULD_NOT_PERSIST_STOP
        assert h.c.job_state.status is JobStatus.RUNNING
        assert (await h.status()) is JobStatus.RUNNING
        assert h.hosts.cancels == []
        assert h.c.live

        await h.c.stop()
        await h.hosts.stop_cancelled()
        await h.settle()
        assert (await h.stored()).stop_finalized

    activations.run(scenario)


# -- item 9: a failed removal finish --------------------------------------------------------------


async def removal_whose_finish_fails(
    activations: Activations, failures: int
) -> tuple[Harness, FaultyStorage]:
    """A job of 3 running steps removed; its finish (`remove_job_steps`) fails `failures`
    times on purpose. Every step reports its stop; the last report is answered an error and
    delivered again, as a real host does."""
    storage = FaultyStorage()
    h = await activations.new(StagedJob, Plan(sizes=[3]), storage=storage)
    await h.c.start()
    await h.c.remove()
    storage.fail("remove_job_steps", failures)
    await h.hosts.finish("000000")
    await h.hosts.finish("000001")
    last = await h.hosts.finish("000002")
    assert last.status is STOPPED
    assert h.hosts.reports[-1][1] is not None  # the last report is answered an error
    assert not await h.hosts.report(last)  # delivered again: the finish runs again, fails
    await eventually(lambda: h.job_id not in storage.jobs, what="the removal finished")
    return h, storage


def test_remove__a_failing_finish_runs_one_retry_chain(
    activations: Activations, fast_backoff: object
) -> None:
    async def scenario() -> None:
        h, storage = await removal_whose_finish_fails(activations, 3)

        # Each failure was retried once, by the report or by the one timer: 3 failures, then
        # the success, and nothing after it.
        assert storage.calls["remove_job_steps"] == 4
        await asyncio.sleep(4 * FAST.longest)
        assert storage.calls["remove_job_steps"] == 4
        assert h.c.tasks.failures == {}

    activations.run(scenario)


def test_remove__a_failing_finish_runs_on_stopped_once(
    activations: Activations, fast_backoff: object
) -> None:
    async def scenario() -> None:
        h, _storage = await removal_whose_finish_fails(activations, 3)
        assert h.calls["on_stopped"] == 1

    activations.run(scenario)


def test_remove__a_failing_finish_never_runs_on_stopped_beside_itself(
    activations: Activations, fast_backoff: object
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[1]), storage=storage)
        stopped = h.control("on_stopped", gate=asyncio.Event())
        await h.c.start()
        await h.c.remove()
        storage.fail("remove_job_steps", 1)

        report = asyncio.create_task(h.hosts.finish("000000"))
        await stopped.entered.wait()
        again = [asyncio.create_task(h.c.remove()) for _ in range(2)]
        await h.settle()
        assert stopped.running == 1
        assert stopped.gate is not None
        stopped.gate.set()
        await report
        await asyncio.gather(*again, return_exceptions=True)
        await eventually(lambda: h.job_id not in storage.jobs)
        assert stopped.peak == 1

    activations.run(scenario)


# -- item 14: the watchdog settles lost reports ---------------------------------------------------


def test_watchdog__settles_a_lost_success_and_a_lost_failure(activations: Activations) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        await h.c.start()
        await h.hosts.finish("000000", deliver=0)
        await h.hosts.finish("000001", FAILED, "boom", deliver=0)
        await h.settle()
        assert (await h.status()) is JobStatus.RUNNING

        await h.c.watchdog_tick()
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_WITH_FAILURES
        assert (stored.progress.successful_steps, stored.progress.failed_steps) == (1, 1)

    activations.run(scenario)


def test_watchdog__every_tick_looks_for_lost_reports(activations: Activations) -> None:
    """No tick is skipped by a heuristic: a report lost after one tick is settled by the next."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[3]))
        await h.c.start()
        for step_id in ("000000", "000001", "000002"):
            await h.c.watchdog_tick()
            await h.hosts.finish(step_id, deliver=0)
            await h.c.watchdog_tick()
            await h.settle()
            assert step_id not in h.c.window.active()
        assert (await h.status()) is JobStatus.COMPLETED_SUCCESSFULLY

    activations.run(scenario)


def test_watchdog__settles_a_lost_stopped_report(activations: Activations) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        await h.c.start()
        await h.c.stop()
        await h.hosts.finish("000000", STOPPED)
        await h.hosts.finish("000001", STOPPED, deliver=0)  # persisted, the report lost

        await h.c.watchdog_tick()
        await h.settle()
        stored = await h.stored()
        assert stored.stop_finalized
        assert stored.progress.stopped_steps == 2
        assert h.calls["on_stopped"] == 1

    activations.run(scenario)


def test_watchdog__settles_a_lost_report_of_a_removal(activations: Activations) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1]))
        await h.c.start()
        await h.c.remove()
        await h.hosts.finish("000000", deliver=0)

        await h.c.watchdog_tick()
        await h.settle()
        assert h.job_id not in h.storage.jobs

    activations.run(scenario)


def test_recover__a_stop_left_unfinished_by_a_lost_activation_is_finished(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[3]), max_active_steps_per_job=2)
        await h.c.start()
        await h.c.stop()
        await h.hosts.finish("000000", STOPPED, deliver=0)
        await h.activate(reconstructed=True)  # the new activation finishes the stop
        await h.hosts.finish("000001", STOPPED)
        await h.settle()

        stored = await h.stored()
        assert (stored.status, stored.stop_finalized) == (JobStatus.STOPPED, True)
        assert stored.progress.stopped_steps == 3
        assert h.calls["on_stopped"] == 1
        assert (await h.steps())["000002"].status is StepStatus.SCHEDULED

    activations.run(scenario)


def test_remove__a_duplicate_report_after_the_removal_finished_is_not_an_error(
    activations: Activations, fast_backoff: object
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[1]), storage=storage)
        await h.c.start()
        await h.c.remove()
        await h.hosts.finish("000000", deliver=2)
        assert h.job_id not in storage.jobs
        saves = storage.calls["save_job"]
        await asyncio.sleep(4 * FAST.longest)

        assert [error for _, error in h.hosts.reports] == [None, None]
        assert storage.calls["save_job"] == saves

    activations.run(scenario)


def test_stop__a_dead_hosts_step_whose_outcome_is_stored_counts_that_outcome(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[3]))
        await h.c.start()
        assert {r.host for r in h.hosts.running_steps()} == {"host-0"}
        await h.hosts.finish("000000", deliver=0)  # persisted (deleted), the report lost
        await h.hosts.finish("000001", FAILED, "boom", deliver=0)
        await h.c.stop()
        h.hosts.kill("host-0")  # step 000002 dies with it
        await h.settle()

        stored = await h.stored()
        assert stored.stop_finalized
        progress = stored.progress
        assert (progress.successful_steps, progress.failed_steps) == (1, 1)
        assert progress.stopped_steps == 1
        # The step that died with its host is stored as the stop counted it (soak 4023: it
        # stayed RUNNING in the stopped job).
        steps = await h.steps()
        assert {s: (r.status, r.attempt) for s, r in steps.items()} == {
            "000001": (FAILED, 1),
            "000002": (STOPPED, 1),
        }

    activations.run(scenario)


def test_host__a_dead_hosts_step_whose_success_is_stored_is_not_run_again(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        await h.c.start()
        await h.hosts.finish("000000", deliver=0)  # persisted (deleted), the report lost
        h.hosts.kill("host-0")
        await h.settle()

        assert [s.step_id for s in h.hosts.started].count("000000") == 1
        assert h.c.stages[0].successful == 1
        await h.hosts.finish_all()
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert stored.progress.successful_steps == 2

    activations.run(scenario)


@pytest.mark.parametrize("how", ["new activation", "rehydration of the live one"])
def test_recover__a_stop_finished_by_recovery_counts_a_step_stopped_twice(
    activations: Activations, how: str
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1]))
        await h.c.start()
        await h.c.stop()
        await h.hosts.stop_cancelled()  # its stop is counted (and recorded)
        await h.c.resume()
        await h.settle()
        await h.c.stop()  # the step runs again, told to stop
        if how == "new activation":
            await h.activate(reconstructed=True)  # the actor is lost; the new one recovers
        else:
            await h.c.recover()
        await h.hosts.stop_cancelled()
        await h.settle()

        stored = await h.stored()
        assert stored.stop_finalized
        assert stored.progress.stopped_steps == 1
        assert stored.progress.is_stopped

    activations.run(scenario)


def test_recover__finishing_a_stop_does_not_count_a_recounted_step_again(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        await h.c.start()
        late = await h.hosts.finish("000000", deliver=0)  # persisted, the report lost
        await h.c.stop()
        await h.c.recover()  # a rehydration reaches the stopping job
        await h.hosts.report(late)  # the lost report arrives after all
        await h.hosts.stop_cancelled()
        await h.settle()

        stored = await h.stored()
        assert stored.stop_finalized
        progress = stored.progress
        assert (progress.successful_steps, progress.stopped_steps) == (1, 1)

    activations.run(scenario)
