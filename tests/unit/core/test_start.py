"""Start: a stop or a recover while `prepare_steps` runs (issue 9, item 5), the start throttle
(item 17) and start failures and `start`'s error (item 18)."""

from __future__ import annotations

import asyncio

import pytest

from choreography_ray.core.messages import Outcome
from choreography_ray.core.mode import Mode
from choreography_ray.errors import StartJobError
from choreography_ray.status import JobStatus, StepStatus
from choreography_ray.storage.memory import MemoryStorage
from choreography_ray.types import type_path
from tests.unit.core.conftest import FAST, Activations
from tests.unit.core.fakes import FAILED, FakeHosts
from tests.unit.core.harness import eventually
from tests.unit.core.jobs import ContinuingJob, Plan, StagedJob

pytestmark = pytest.mark.timeout(30)


# -- item 5: operations while prepare_steps runs --------------------------------------------------


def test_start__a_stop_while_prepare_steps_blocks_leaves_the_job_stopped_with_no_step_started(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[3, 2]))
        prepare = h.control("prepare_steps", gate=asyncio.Event())
        start = asyncio.create_task(h.c.start())
        await prepare.entered.wait()
        stop = asyncio.create_task(h.c.stop())
        await h.settle()
        assert not stop.done(), "the stop waits for the turn that prepares"
        assert prepare.gate is not None
        prepare.gate.set()
        await start
        await stop
        await h.settle()

        stored = await h.stored()
        assert stored.status is JobStatus.STOPPED
        assert stored.stop_finalized
        assert h.hosts.calls == []
        assert h.calls["admit_stage"] == 0
        assert h.calls["on_stopped"] == 1
        assert stored.progress.is_stopped
        # Nothing later starts the steps either.
        await h.c.watchdog_tick()
        await h.settle()
        assert h.hosts.calls == []
        assert (await h.status()) is JobStatus.STOPPED

    activations.run(scenario)


def test_start__a_remove_while_prepare_steps_blocks_removes_the_job_with_no_step_started(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[3]))
        prepare = h.control("prepare_steps", gate=asyncio.Event())
        start = asyncio.create_task(h.c.start())
        await prepare.entered.wait()
        remove = asyncio.create_task(h.c.remove())
        await h.settle()
        assert prepare.gate is not None
        prepare.gate.set()
        await start
        await remove
        await h.settle()

        assert await h.storage.get_job(h.job_id) is None
        assert await h.steps() == {}
        assert h.hosts.calls == []
        assert h.calls["on_stopped"] == 1

    activations.run(scenario)


def test_start__a_recover_while_prepare_steps_blocks_lets_the_start_finish(
    activations: Activations,
) -> None:
    """A rehydration reaching the job while it prepares changes nothing (it used to save
    FAILED / MissingStepPlan, never cleared)."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        prepare = h.control("prepare_steps", gate=asyncio.Event())
        start = asyncio.create_task(h.c.start())
        await prepare.entered.wait()
        recover = asyncio.create_task(h.c.recover())
        tick = asyncio.create_task(h.c.watchdog_tick())
        await h.settle()
        assert prepare.gate is not None
        prepare.gate.set()
        assert await start is None
        await recover
        await tick
        await h.settle()

        stored = await h.stored()
        assert stored.status is JobStatus.RUNNING
        assert stored.error is None
        assert sorted(s.step_id for s in h.hosts.started) == ["000000", "000001"]
        assert h.calls["on_before_resuming_job_steps"] == 0
        await h.hosts.finish_all()
        await h.settle()
        assert (await h.status()) is JobStatus.COMPLETED_SUCCESSFULLY

    activations.run(scenario)


# -- item 17: the start throttle counts steps -----------------------------------------------------


def test_start_throttle__counts_steps_in_flight_not_start_operations(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(
            StagedJob, Plan(sizes=[10]), max_concurrent_step_starts=4, step_batch_size=3
        )
        h.hosts.start_gate = asyncio.Event()
        start = asyncio.create_task(h.c.start())
        await h.settle()

        # 4 steps in flight (a batch of 3 and one of 1), not 4 operations of 3.
        assert h.hosts.in_flight == 4
        assert [len(batch) for _, batch in h.hosts.calls] == [3, 1]
        h.hosts.start_gate.set()
        await start
        await eventually(lambda: len(h.hosts.started) == 10, what="every step started")
        assert h.hosts.peak_in_flight <= 4
        assert all(len(batch) <= 3 for _, batch in h.hosts.calls)

    activations.run(scenario)


def test_start_throttle__refills_as_operations_are_answered(activations: Activations) -> None:
    async def scenario() -> None:
        h = await activations.new(
            StagedJob, Plan(sizes=[6]), max_concurrent_step_starts=2, step_batch_size=1
        )
        gate = h.hosts.start_gate = asyncio.Event()
        start = asyncio.create_task(h.c.start())
        await h.settle()
        assert h.hosts.in_flight == 2
        gate.set()
        await start
        await h.settle()
        assert len(h.hosts.started) == 6
        assert h.hosts.peak_in_flight == 2

    activations.run(scenario)


# -- item 18: start failures and start's error ----------------------------------------------------


def test_start__a_continuing_first_stage_that_starts_no_step_is_some_and_the_next_stage_starts(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(ContinuingJob, Plan(sizes=[2, 1], missing=[0, 1]))

        assert await h.c.start() is StartJobError.FAILED_STARTING_SOME_JOB_STEPS
        await h.settle()

        steps = await h.steps()
        # A step whose type cannot be imported fails to start: recorded FAILED, counted.
        for step_id in ("000000", "000001"):
            assert steps[step_id].status is StepStatus.FAILED
            assert "MissingStep" in steps[step_id].status_changes[-1].exception_messages[0]
        assert h.c.stages[0].failed == 2
        assert [s.step_id for s in h.hosts.started] == ["000002"]
        await h.hosts.finish("000002")
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_WITH_FAILURES
        assert (stored.progress.failed_steps, stored.progress.successful_steps) == (2, 1)

    activations.run(scenario)


def test_start__a_barrier_first_stage_that_starts_no_step_is_all_and_later_stages_unreachable(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2, 1], missing=[0, 1]))

        assert await h.c.start() is StartJobError.FAILED_STARTING_ALL_JOB_STEPS
        await h.settle()

        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_WITH_FAILURES
        assert stored.progress.failed_steps == 2
        assert stored.progress.unreachable_steps == 1
        assert (await h.steps())["000002"].status is StepStatus.UNREACHABLE
        assert h.hosts.calls == []
        assert h.calls["on_completed"] == 1

    activations.run(scenario)


def test_start__some_steps_of_the_first_stage_that_cannot_start_is_some(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[3], missing=[1]))

        assert await h.c.start() is StartJobError.FAILED_STARTING_SOME_JOB_STEPS
        await h.settle()

        assert (await h.steps())["000001"].status is StepStatus.FAILED
        assert h.hosts.running_ids() == {"000000", "000002"}
        await h.hosts.finish_all()
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_WITH_FAILURES
        assert (stored.progress.successful_steps, stored.progress.failed_steps) == (2, 1)

    activations.run(scenario)


def test_start__a_start_operation_that_throws_is_all_and_started_again(
    activations: Activations, fast_backoff: object
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        h.hosts.fail_starts = 1  # the first start operation raises, on purpose

        assert await h.c.start() is StartJobError.FAILED_STARTING_ALL_JOB_STEPS
        assert (await h.status()) is JobStatus.RUNNING
        await eventually(lambda: h.hosts.running_ids() == {"000000", "000001"})
        await h.hosts.finish_all()
        await h.settle()
        assert (await h.status()) is JobStatus.COMPLETED_SUCCESSFULLY

    activations.run(scenario)


def test_start__a_start_that_ran_though_it_threw_does_not_run_twice(
    activations: Activations, fast_backoff: object
) -> None:
    """Chaos seed ci 9: a start operation to a host Ray was restarting threw ("may or may not
    have been executed") after the host had started the steps; its retry started them again
    beside the first run. Before a retry the job asks the hosts and storage."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[3]))
        h.hosts.lose_start_answers = 1  # the steps start, the answer is lost, on purpose

        assert await h.c.start() is StartJobError.FAILED_STARTING_ALL_JOB_STEPS
        # One ends (stored and reported) while the job counts its start as failed; one ends
        # with its report lost; one still runs when the job looks.
        await h.hosts.finish("000000")
        await h.hosts.finish("000001", deliver=0)
        await asyncio.sleep(4 * FAST.longest)
        await h.settle()

        assert len(h.hosts.started) == 3, "a step started twice"
        assert h.hosts.running_ids() == {"000002"}
        await h.hosts.finish("000002")  # adopted: its report counts
        await eventually(lambda: h.c.state is not None and h.c.state.status.is_terminal)
        assert len(h.hosts.started) == 3, "a step started twice"
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert stored.progress.successful_steps == 3

    activations.run(scenario)


def test_start__a_retry_refused_while_its_host_persists_the_earlier_attempt_starts_later(
    activations: Activations, fast_backoff: object
) -> None:
    """Chaos seed ci 0: the job counted attempt 1's failure while its host still persisted it
    (lost acknowledgements); the host refused attempt 2. The refused start must not be taken
    for attempt 2 running there: it starts once the host has let attempt 1 go."""

    async def scenario() -> None:
        storage = MemoryStorage()
        hosts = FakeHosts(storage, shared_hosts=1)
        h = await activations.new(
            StagedJob, Plan(sizes=[1]), storage=storage, hosts=hosts, max_step_attempts=2
        )
        await h.c.start()
        # Attempt 1's failure reaches the job while the host still holds attempt 1.
        await hosts.report(Outcome("000000", 1, FAILED, "failed on purpose"))
        await asyncio.sleep(4 * FAST.longest)
        await h.settle()
        assert [s.attempt for s in hosts.started] == [1], "attempt 2 was refused"

        await hosts.finish("000000", FAILED, "failed on purpose", deliver=0)  # lets it go
        await eventually(lambda: [s.attempt for s in hosts.started] == [1, 2])
        await hosts.finish("000000")
        await eventually(lambda: h.c.state is not None and h.c.state.status.is_terminal)
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert (stored.progress.successful_steps, stored.progress.failed_steps) == (1, 0)

    activations.run(scenario)


def test_start__a_later_stage_step_that_cannot_start_is_recorded_failed_and_counted(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1, 2], missing=[2]))
        assert await h.c.start() is None
        await h.hosts.finish("000000")
        await h.settle()

        assert (await h.steps())["000002"].status is StepStatus.FAILED
        assert h.c.stages[1].failed == 1
        assert h.hosts.running_ids() == {"000001"}
        await h.hosts.finish("000001")
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_WITH_FAILURES
        assert (stored.progress.successful_steps, stored.progress.failed_steps) == (2, 1)

    activations.run(scenario)


def test_start__the_error_covers_the_whole_first_stage_not_only_the_first_wave(
    activations: Activations,
) -> None:
    """Issue 9, item 18: "start's error describes only the first wave". With a throttle of one
    step, the first wave is one step; the third step of the first stage cannot start."""

    async def scenario() -> None:
        h = await activations.new(
            StagedJob,
            Plan(sizes=[3], missing=[2]),
            max_concurrent_step_starts=1,
            step_batch_size=1,
        )

        assert await h.c.start() is StartJobError.FAILED_STARTING_SOME_JOB_STEPS
        await h.settle()
        assert (await h.steps())["000002"].status is StepStatus.FAILED

    activations.run(scenario)


def test_start__a_failed_step_of_the_first_stage_is_not_counted_twice(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        await h.c.start()
        await h.hosts.finish("000000", FAILED, "boom", deliver=2)
        await h.hosts.finish("000001")
        await h.settle()
        stored = await h.stored()
        assert (stored.progress.failed_steps, stored.progress.successful_steps) == (1, 1)

    activations.run(scenario)


def test_warm__a_spare_reaches_hosts_and_imports_types_ahead_and_its_job_starts_as_any(
    activations: Activations, caplog: pytest.LogCaptureFixture
) -> None:
    """A spare's warm-up (`JobCore.warm`) activates nothing: the hosts are reached once, a type
    that cannot be imported is logged and left to the activation, and the job, once started,
    runs as any other."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        core = h.build()  # its actor, created ahead of the job's start
        await core.warm([type_path(StagedJob), "tests.unit.core.no_such_module.Job"])

        assert (core.mode, h.hosts.warmed) == (Mode.LOADING, 1)
        assert "importing tests.unit.core.no_such_module.Job ahead failed" in caplog.text
        assert await core.start() is None
        assert await h.all_succeed() == (JobStatus.COMPLETED_SUCCESSFULLY, 2)

    activations.run(scenario)
