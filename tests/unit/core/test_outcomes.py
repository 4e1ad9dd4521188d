"""Outcomes: each counts once per (step, attempt); a dead host's steps start again; retries."""

from __future__ import annotations

import asyncio

import pytest

from choreography_ray.status import JobStatus, StepStatus
from tests.unit.core.conftest import Activations
from tests.unit.core.fakes import FAILED, SUCCESS, FaultyStorage
from tests.unit.core.harness import eventually
from tests.unit.core.jobs import Plan, StagedJob

pytestmark = pytest.mark.timeout(30)


def test_outcome__a_duplicate_report_counts_once(activations: Activations) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[3]))
        await h.c.start()
        first = await h.hosts.finish("000000", deliver=2)
        await h.hosts.finish("000001", FAILED, "boom", deliver=2)
        await h.hosts.report(first, first)
        assert h.c.stages[0].successful == 1
        await h.hosts.finish("000002")
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_WITH_FAILURES
        assert (stored.progress.successful_steps, stored.progress.failed_steps) == (2, 1)
        assert h.calls["on_completed"] == 1

    activations.run(scenario)


def test_outcome__a_report_of_an_earlier_attempt_is_not_counted(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1]), max_step_attempts=2)
        await h.c.start()
        failure = await h.hosts.finish("000000", FAILED, "attempt 1")
        await h.settle()
        assert [(s.step_id, s.attempt) for s in h.hosts.started] == [
            ("000000", 1),
            ("000000", 2),
        ]
        await h.hosts.report(failure)  # attempt 1's report again, late
        assert h.c.stages[0].failed == 0
        await h.hosts.finish("000000")
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert (stored.progress.successful_steps, stored.progress.failed_steps) == (1, 0)

    activations.run(scenario)


def test_outcome__attempts_run_out_and_the_failure_counts(activations: Activations) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1]), max_step_attempts=2)
        await h.c.start()
        await h.hosts.finish("000000", FAILED, "attempt 1")
        await h.settle()
        await h.hosts.finish("000000", FAILED, "attempt 2")
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_WITH_FAILURES
        assert stored.progress.failed_steps == 1
        assert len(h.hosts.started) == 2

    activations.run(scenario)


def test_outcome__a_report_never_persisted_counts_once(activations: Activations) -> None:
    """A report is trusted (a host persists before it reports): delivered without its write,
    it counts, and once."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        await h.c.start()
        await h.hosts.finish("000000", SUCCESS, persist=False, deliver=2)
        await h.hosts.finish("000001")
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert stored.progress.successful_steps == 2

    activations.run(scenario)


def test_host__a_dead_hosts_steps_start_again_and_count_once(activations: Activations) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]), step_batch_size=1)
        await h.c.start()
        await h.settle()
        on_first = {r.start.step_id for r in h.hosts.running_steps() if r.host == "host-0"}
        assert on_first
        h.hosts.kill("host-0")
        await h.settle()

        assert on_first <= h.hosts.running_ids()
        await h.hosts.finish_all()
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert stored.progress.successful_steps == 2

    activations.run(scenario)


def test_stop__a_pending_retry_counts_as_failed(activations: Activations) -> None:
    async def scenario() -> None:
        h = await activations.new(
            StagedJob, Plan(sizes=[2]), max_step_attempts=2, step_retry_backoff=60
        )
        await h.c.start()
        await h.hosts.finish("000000", FAILED, "attempt 1")
        await h.c.stop()
        await h.hosts.stop_cancelled()
        await h.settle()
        stored = await h.stored()
        assert stored.stop_finalized
        assert (stored.progress.failed_steps, stored.progress.stopped_steps) == (1, 1)

    activations.run(scenario)


def test_host__a_storage_error_while_handling_a_dead_host_does_not_lose_its_steps(
    activations: Activations, fast_backoff: object
) -> None:
    """The 'host gone' turn reads storage before it requeues the host's steps: a storage error
    there is retried with the standard backoff, and the steps run again."""

    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[1]), storage=storage)
        await h.c.start()
        storage.fail("list_steps", 1)  # the dead host's turn meets a storage error, on purpose
        h.hosts.kill("host-0")

        await eventually(lambda: h.hosts.running_ids() == {"000000"}, within=2.0)
        await h.hosts.finish("000000")
        await h.settle()
        assert (await h.status()) is JobStatus.COMPLETED_SUCCESSFULLY

    activations.run(scenario)


def test_leases__a_step_whose_restart_is_in_flight_is_not_restarted_again(
    activations: Activations,
) -> None:
    """Chaos seeds ci 9 and soak 103: after its host died, a step's lease expired and it was
    started again; a watchdog tick while that start was in flight read the earlier run's record
    (its lease expired, its owner gone) and started it a second time, so it ran twice."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1]), step_lease_timeout=0.2)
        await h.c.start()
        h.hosts.kill("host-0")
        await h.settle()
        await asyncio.sleep(0.3)  # the lease of the dead host's step expires
        gate = h.hosts.start_gate = asyncio.Event()
        await h.c.watchdog_tick()  # restarts it: the start waits at the gate
        await h.settle()
        await h.c.watchdog_tick()  # the record is still the dead run's
        await h.settle()
        gate.set()
        await h.settle()

        assert len(h.hosts.calls) == 2, "one start, one restart"
        assert len(h.hosts.running_steps()) == 1
        await h.hosts.finish_all()
        await h.settle()
        assert (await h.status()) is JobStatus.COMPLETED_SUCCESSFULLY

    activations.run(scenario)


def test_leases__a_step_whose_running_write_never_landed_starts_again_once_its_host_is_gone(
    activations: Activations,
) -> None:
    """A host runs a step while its RUNNING write waits for a group-commit round; if that write
    fails and the host dies before it is written again, storage keeps the step SCHEDULED, with
    no lease that could expire: the job starts it again once it has seen the host go."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]), step_lease_timeout=0.2)
        h.hosts.unwritten_starts = 1
        await h.c.start()
        await h.settle()
        assert len(h.hosts.calls) == 1, "both steps in one start"
        assert {s.status for s in (await h.steps()).values()} == {StepStatus.SCHEDULED}
        await h.c.watchdog_tick()  # its host runs it: nothing to restart
        await h.settle()
        assert len(h.hosts.calls) == 1
        h.hosts.kill(h.hosts.calls[0][0])
        await h.settle()
        await h.c.watchdog_tick()
        await h.settle()
        assert len(h.hosts.calls) == 2, "started again at once, no lease to wait for"
        assert h.hosts.running_ids() == {"000000", "000001"}
        await h.hosts.finish_all()
        await h.settle()
        stored_job = await h.stored()
        assert stored_job.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert stored_job.progress.successful_steps == 2

    activations.run(scenario)


def test_leases__a_running_step_whose_running_write_never_landed_is_left_to_its_host(
    activations: Activations,
) -> None:
    """While its host lives, a step stored SCHEDULED but running there is not started again,
    and its outcome counts once."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1]), step_lease_timeout=0.2)
        h.hosts.unwritten_starts = 1
        await h.c.start()
        await h.settle()
        await asyncio.sleep(0.3)  # longer than a lease
        await h.c.watchdog_tick()
        await h.settle()
        assert len(h.hosts.calls) == 1
        await h.hosts.finish("000000")
        await h.settle()
        stored_job = await h.stored()
        assert stored_job.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert stored_job.progress.successful_steps == 1

    activations.run(scenario)
