"""Stages and the pump: a failing admission or hook does not stall the job (issue 9, item 1);
the watchdog and the pump finishing one stage at once finish it once (item 3)."""

from __future__ import annotations

import asyncio
import time

import pytest

from choreography_ray.errors import StartJobError
from choreography_ray.status import JobStatus, StepStatus
from tests.unit.core.conftest import Activations
from tests.unit.core.fakes import FAILED, FaultyStorage
from tests.unit.core.harness import eventually
from tests.unit.core.jobs import Plan, StagedJob

pytestmark = pytest.mark.timeout(30)


# -- item 1: nothing the pump runs stalls the job -------------------------------------------------


def test_admission__raising_once_is_asked_again_after_a_second_and_the_job_moves_on(
    activations: Activations,
) -> None:
    """The issue's reproduction: `admit_stage` raises ConnectionError once for the second
    stage. The core asks again on its 1 s backoff timer (real time: no shrinking here)."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1, 1]))
        h.control("admit_stage", raises=1, error=ConnectionError, stages=frozenset({1}))
        await h.c.start()
        failed_at = time.monotonic()
        await h.hosts.finish("000000")
        await h.settle()
        assert h.calls["admit_stage:1"] == 1
        assert h.hosts.running_ids() == set()
        assert (await h.status()) is JobStatus.RUNNING

        await eventually(lambda: h.hosts.running_ids() == {"000001"}, within=5.0)
        assert time.monotonic() - failed_at >= 0.9
        assert h.calls["admit_stage:1"] == 2
        await h.hosts.finish("000001")
        await h.settle()
        assert (await h.status()) is JobStatus.COMPLETED_SUCCESSFULLY
        assert h.c.tasks.failures == {}

    activations.run(scenario)


def test_admission__a_refusal_waits_for_the_watchdog(activations: Activations) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1, 1]))
        refusal = h.control("admit_stage", admit=False, stages=frozenset({1}))
        await h.c.start()
        await h.hosts.finish("000000")
        await h.settle()
        assert h.hosts.running_ids() == set()
        refusal.admit = True
        await h.c.watchdog_tick()
        await h.settle()
        assert h.hosts.running_ids() == {"000001"}
        assert h.calls["admit_stage:1"] == 2

    activations.run(scenario)


def test_pump__a_hook_raising_at_a_stage_change_is_retried_not_fatal(
    activations: Activations, fast_backoff: object
) -> None:
    """`get_failure_behavior_for` raises once when the failed first stage is done: the pump's
    step fails, is logged by name and runs again; the job ends."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1, 1]))
        h.control("get_failure_behavior_for", raises=1)
        await h.c.start()
        await h.hosts.finish("000000", FAILED, "boom")

        await eventually(lambda: h.storage.jobs[h.job_id].status.is_terminal)
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_WITH_FAILURES
        assert stored.progress.unreachable_steps == 1
        assert "pump" in h.c.tasks.failures
        assert h.calls["on_completed"] == 1

    activations.run(scenario)


def test_pump__a_storage_error_while_checking_the_stage_is_retried_not_fatal(
    activations: Activations, fast_backoff: object
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[1, 1]), storage=storage)
        await h.c.start()
        # The report is lost and refused nowhere: the stage is decided from storage, whose
        # count fails once (on purpose).
        await h.hosts.finish("000000", deliver=0)
        h.c.window.clear()  # as after a reactivation that adopted nothing
        storage.fail("count_by_status", 1)
        h.c.kick()

        await eventually(lambda: h.hosts.running_ids() == {"000001"})
        assert "pump" in h.c.tasks.failures

    activations.run(scenario)


def test_start__a_hook_raising_when_the_first_stage_is_done_at_start_does_not_escape_start(
    activations: Activations, fast_backoff: object
) -> None:
    """No step of the barrier first stage can start, so `start` finishes the stage in its own
    turn, where `get_failure_behavior_for` raises once. `start` should answer its error code
    and the job still reach its outcome (the watchdog is off here)."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1, 1], missing=[0]))
        h.control("get_failure_behavior_for", raises=1)

        assert await h.c.start() is StartJobError.FAILED_STARTING_ALL_JOB_STEPS
        await eventually(lambda: h.storage.jobs[h.job_id].status.is_terminal, within=3.0)
        assert (await h.status()) is JobStatus.COMPLETED_WITH_FAILURES

    activations.run(scenario)


# -- item 3: one stage, finished once -------------------------------------------------------------


def test_stage_done__watchdog_ticks_and_the_pump_at_once_run_on_completed_once(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        completed = h.control("on_completed", gate=asyncio.Event())
        await h.c.start()
        await h.hosts.finish("000000")
        lost = await h.hosts.finish("000001", deliver=0)

        # The tick settles the lost report, finishes the stage and blocks in on_completed,
        # while more ticks and the late report arrive.
        first = asyncio.create_task(h.c.watchdog_tick())
        await completed.entered.wait()
        others = [first, *(asyncio.create_task(h.c.watchdog_tick()) for _ in range(3))]
        late = asyncio.create_task(h.hosts.report(lost))
        await h.settle()
        assert completed.gate is not None
        completed.gate.set()
        await asyncio.gather(*others, late)
        await h.settle()

        assert h.calls["on_completed"] == 1
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert stored.progress.successful_steps == 2

    activations.run(scenario)


def test_stage_done__watchdog_ticks_and_the_pump_at_once_begin_the_next_stage_once(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1, 2]))
        admission = h.control("admit_stage", gate=asyncio.Event(), stages=frozenset({1}))
        await h.c.start()
        lost = await h.hosts.finish("000000", deliver=0)

        first = asyncio.create_task(h.c.watchdog_tick())
        await admission.entered.wait()
        others = [first, *(asyncio.create_task(h.c.watchdog_tick()) for _ in range(3))]
        late = asyncio.create_task(h.hosts.report(lost))
        await h.settle()
        assert admission.gate is not None
        admission.gate.set()
        await asyncio.gather(*others, late)
        await h.settle()

        assert h.calls["admit_stage:1"] == 1
        assert sorted(s.step_id for s in h.hosts.started) == ["000000", "000001", "000002"]
        assert h.c.stages[0].successful == 1
        await h.hosts.finish_all()
        await h.settle()
        assert (await h.status()) is JobStatus.COMPLETED_SUCCESSFULLY
        assert h.calls["on_completed"] == 1

    activations.run(scenario)


def test_stage_done__a_tick_that_finds_the_stage_done_in_storage_moves_on_once(
    activations: Activations,
) -> None:
    """Every report of a barrier stage lost and no step active here (a reactivation adopted
    none): the tick recounts from storage, marks the later stage unreachable once."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2, 2]))
        await h.c.start()
        await h.hosts.finish("000000", FAILED, "boom", deliver=0)
        await h.hosts.finish("000001", deliver=0)
        h.c.window.clear()

        await asyncio.gather(h.c.watchdog_tick(), h.c.watchdog_tick())
        await h.settle()

        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_WITH_FAILURES
        progress = stored.progress
        assert (progress.successful_steps, progress.failed_steps) == (1, 1)
        assert progress.unreachable_steps == 2
        steps = await h.steps()
        assert steps["000002"].status is StepStatus.UNREACHABLE
        assert h.calls["on_completed"] == 1

    activations.run(scenario)


def test_stage_change__a_failed_save_of_the_new_stage_still_starts_its_steps(
    activations: Activations, fast_backoff: object
) -> None:
    """A failed save of a stage change leaves the stage unstarted: the pump's retry begins it."""

    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[1, 1]), storage=storage)
        await h.c.start()
        storage.fail("save_job", 1)  # the save of the stage change fails, on purpose
        await h.hosts.finish("000000")

        await eventually(lambda: h.hosts.running_ids() == {"000001"}, within=2.0)

    activations.run(scenario)


def test_stage_change__a_stop_after_a_failed_save_of_the_new_stage_is_final(
    activations: Activations,
) -> None:
    """The new stage never started (its save failed): a stop is final at once, the stage's
    steps are left alone as steps of a stage never started, and a resume runs them."""

    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[1, 1]), storage=storage)
        await h.c.start()
        await h.activate(reconstructed=True)  # adopts the running step; no plan in memory
        storage.fail("save_job", 1)  # the save of the stage change fails, on purpose
        await h.hosts.finish("000000")
        await h.settle()
        await h.c.stop()
        await h.settle()

        stored = await h.stored()
        assert stored.stop_finalized
        assert (stored.stage, stored.progress.stopped_steps) == (0, 0)
        assert stored.progress.is_stopped
        await h.c.resume()  # the pump starts it once its backoff after the failed save ends
        await eventually(lambda: h.hosts.running_ids() == {"000001"}, within=5.0)
        await h.hosts.finish("000001")
        await h.settle()
        assert (await h.status()) is JobStatus.COMPLETED_SUCCESSFULLY

    activations.run(scenario)
