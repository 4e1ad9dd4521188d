"""The job activation (issue 23), one test per defect, each failing before its fix: no call is
served before a restarted activation has recovered (1); a save whose answer was lost and whose
read-back failed does not wedge the record (2); a start whose last save fails is finished by
the watchdog (3); a final stop leaves no step running or stored RUNNING (4); a start that fails
after a stop does not keep the stop from its end (5); a host is gone by its incarnation: a watch
error is not a death (6), a restarted host is (8); a host that does not answer is unknown, not
empty (7); the lease check asks the job type's active silos (9); a stop or removal while a
terminal status is owed does not wedge the pump (10); a resume whose save fails changes nothing
(11); a restarted activation that cannot load leaves its steps running (12)."""

from __future__ import annotations

import asyncio

import pytest

from choreography_ray.core.mode import Exit, Mode
from choreography_ray.errors import (
    JobOperationError,
    StepHostUnknownError,
    StopJobError,
    StorageError,
)
from choreography_ray.model import JobState
from choreography_ray.status import JobStatus
from tests.unit.core.conftest import Activations
from tests.unit.core.fakes import STOPPED, FaultyStorage
from tests.unit.core.harness import Harness, eventually
from tests.unit.core.jobs import SILOS, Plan, StagedJob

pytestmark = pytest.mark.timeout(30)


# -- item 1: calls wait for the recovery -----------------------------------------------------------


def test_reactivation__a_report_delivered_before_the_recovery_waits_for_it(
    activations: Activations,
) -> None:
    """A stop with one step winding down; the actor dies and restarts. A report delivered to
    the new activation before its recovery (here the first step's stop, delivered again) is
    served after it: the running step is adopted, so the stop is not finished under it."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        await h.c.start()
        await h.c.stop()
        first = await h.hosts.finish("000000", STOPPED)

        core = h.build()  # the restarted actor
        assert core.mode is Mode.LOADING
        activation = asyncio.create_task(core.activate(reconstructed=True))
        report = asyncio.create_task(core.report_outcomes([first]))
        await asyncio.gather(activation, report)
        await h.settle()

        mode: Mode = core.mode  # (read again: mypy narrowed it at LOADING)
        assert mode is Mode.STOPPING  # recovered: the stop waits for the running step
        stored = await h.stored()
        assert (stored.status, stored.stop_finalized) == (JobStatus.STOPPED, False)
        assert h.calls["on_stopped"] == 0
        await h.hosts.finish("000001", STOPPED)
        await h.settle()
        stored = await h.stored()
        assert stored.stop_finalized
        assert stored.progress.stopped_steps == 2
        assert h.calls["on_stopped"] == 1

    activations.run(scenario)


def test_reactivation__the_watchdog_does_nothing_before_the_recovery(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        await h.c.start()
        await h.c.stop()
        await h.hosts.finish("000000", STOPPED)

        core = h.build()
        activation = asyncio.create_task(core.activate(reconstructed=True))
        tick = asyncio.create_task(core.watchdog_tick())
        await asyncio.gather(activation, tick)
        await h.settle()

        assert not (await h.stored()).stop_finalized
        assert h.calls["on_stopped"] == 0

    activations.run(scenario)


# -- item 2: a reconcile adopts the stored version -------------------------------------------------


def test_save__a_lost_acknowledgement_and_a_failed_read_back_leave_the_job_able_to_save(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[2]), storage=storage)
        await h.c.start()
        await h.hosts.finish("000000")
        await h.settle()
        storage.ack_lost("save_job")  # written, its answer lost...
        storage.fail("get_job")  # ...and the read-back fails too
        with pytest.raises(StorageError):
            await h.save_progress()

        await h.c.watchdog_tick()  # reconciles with storage
        await h.hosts.finish("000001")
        await h.settle()

        stored = await h.stored()
        assert (stored.status, stored.progress.successful_steps) == (
            JobStatus.COMPLETED_SUCCESSFULLY,
            2,
        )
        assert h.calls["on_completed"] == 1

    activations.run(scenario)


# -- item 3: a start whose RUNNING save fails ------------------------------------------------------


class RefusesRunning(FaultyStorage):
    """Refuses the next `refusals` saves of a RUNNING record."""

    def __init__(self) -> None:
        super().__init__()
        self.refusals = 0

    async def save_job(self, job: JobState) -> JobState:
        if job.status is JobStatus.RUNNING and self.refusals > 0:
            self.refusals -= 1
            raise self.error("saving RUNNING failed (fault injected on purpose)")
        return await super().save_job(job)


def test_start__a_failed_running_save_is_finished_by_the_watchdog(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        storage = RefusesRunning()
        h = await activations.new(StagedJob, Plan(sizes=[2]), storage=storage)
        storage.refusals = 1
        with pytest.raises(StorageError):
            await h.c.start()
        assert (await h.status()) is JobStatus.STARTING_STEPS

        await h.c.watchdog_tick()
        await h.settle()
        assert (await h.status()) is JobStatus.RUNNING
        await h.hosts.finish_all()
        await h.settle()

        stored = await h.stored()
        assert (stored.status, stored.progress.successful_steps) == (
            JobStatus.COMPLETED_SUCCESSFULLY,
            2,
        )
        assert len(h.hosts.started) == 2, "the running steps were adopted, not started again"

    activations.run(scenario)


# -- item 10: a terminal status owed ---------------------------------------------------------------


async def completed_with_its_save_owed(activations: Activations, storage: FaultyStorage) -> Harness:
    """A job whose one step succeeded: on_completed ran and its COMPLETED save failed, so the
    pump saves it again after its backoff (1 s)."""
    h = await activations.new(StagedJob, Plan(sizes=[1]), storage=storage)
    await h.c.start()
    storage.fail("save_job", 1)
    await h.hosts.finish("000000")
    await h.settle()
    assert storage.failures["save_job"] == 0, "the COMPLETED save was tried"
    assert (await h.status()) is JobStatus.RUNNING
    assert h.calls["on_completed"] == 1
    return h


def test_stop__refused_while_the_completed_status_is_owed_and_the_job_completes(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await completed_with_its_save_owed(activations, storage)

        with pytest.raises(JobOperationError) as refused:
            await h.c.stop()
        assert refused.value.error is StopJobError.JOB_IS_NOT_RUNNING

        await eventually(lambda: storage.jobs[h.job_id].status.is_terminal, what="the save")
        assert (await h.status()) is JobStatus.COMPLETED_SUCCESSFULLY
        assert h.calls["on_completed"] == 1
        assert h.calls["on_stopped"] == 0

    activations.run(scenario)


def test_remove__while_the_completed_status_is_owed_saves_it_then_removes_the_job(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await completed_with_its_save_owed(activations, storage)

        await h.c.remove()
        await h.settle()

        assert h.job_id not in storage.jobs
        assert h.calls["on_completed"] == 1

    activations.run(scenario)


# -- item 5: a start that fails after a stop -------------------------------------------------------


async def stopped_while_its_start_waits(
    activations: Activations,
) -> tuple[Harness, asyncio.Task[object]]:
    """A job of two steps whose first start operation waits for its host; a stop meanwhile."""
    h = await activations.new(StagedJob, Plan(sizes=[2]))
    h.hosts.start_gate = asyncio.Event()
    starting = asyncio.create_task(h.c.start())
    await h.settle()
    await h.c.stop()
    return h, starting


def test_stop__a_start_that_fails_after_it_counts_its_steps_stopped_and_the_stop_is_final(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h, starting = await stopped_while_its_start_waits(activations)
        h.hosts.fail_starts = len(h.hosts.calls)  # every start operation sent throws
        assert h.hosts.start_gate is not None
        h.hosts.start_gate.set()
        await starting
        await h.settle()

        stored = await h.stored()
        assert (stored.status, stored.stop_finalized) == (JobStatus.STOPPED, True)
        assert stored.progress.stopped_steps == 2
        assert h.calls["on_stopped"] == 1
        assert h.hosts.started == []

    activations.run(scenario)


def test_stop__a_start_that_ran_though_its_answer_was_lost_is_told_to_stop(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h, starting = await stopped_while_its_start_waits(activations)
        h.hosts.lose_start_answers = len(h.hosts.calls)  # they run; their answers are lost
        assert h.hosts.start_gate is not None
        h.hosts.start_gate.set()
        await starting
        await h.settle()
        assert not (await h.stored()).stop_finalized, "its steps run: the stop waits for them"

        assert len(await h.hosts.stop_cancelled()) == 2
        await h.settle()
        stored = await h.stored()
        assert (stored.status, stored.stop_finalized) == (JobStatus.STOPPED, True)
        assert stored.progress.stopped_steps == 2
        assert h.calls["on_stopped"] == 1

    activations.run(scenario)


# -- item 9: the lease check asks the job type which owners are alive ------------------------------


def test_leases__the_job_types_active_silos_decide_whether_an_owner_is_gone(
    activations: Activations,
) -> None:
    """`Job.get_active_silos` is the spec's override point: a step whose lease expired while its
    host lives is left alone until the job type no longer counts the host's node alive."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1]), step_lease_timeout=0.2)
        h.hosts.leases = True
        await h.c.start()
        await h.settle()
        await asyncio.sleep(0.3)  # its lease expires: its host never renews it
        await h.c.watchdog_tick()
        await h.settle()
        assert len(h.hosts.calls) == 1, "its node is alive: left to its host"
        assert h.calls["get_active_silos"] >= 1

        SILOS[h.job_id] = {"node-elsewhere"}
        await h.c.watchdog_tick()
        await h.settle()
        assert len(h.hosts.calls) == 2, "its node is gone as the job type sees it: started again"

    activations.run(scenario)


# -- item 4: a final stop leaves no step stored RUNNING --------------------------------------------


@pytest.mark.parametrize("lease", [0.0, 0.2], ids=["leases-off", "leases-on"])
def test_stop__steps_of_a_dead_host_are_stored_stopped_before_the_stop_is_final(
    activations: Activations, lease: float
) -> None:
    """The soak's finding: step hosts killed, then a stop. Their steps are stored RUNNING by
    the dead host and run nowhere (leases off: their restart failed; on: their lease has not
    expired yet, so they are still active, their owner lost): the final STOPPED job stores
    them STOPPED and counts each once."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[3]), step_lease_timeout=lease)
        await h.c.start()
        await h.settle()
        h.hosts.fail_starts = 100  # every restart throws
        for host in {host for host, _batch in h.hosts.calls}:
            h.hosts.kill(host)
        await h.settle()
        assert h.hosts.running_ids() == set()
        await h.c.stop()
        await h.settle()

        stored = await h.stored()
        assert (stored.status, stored.stop_finalized) == (JobStatus.STOPPED, True)
        assert {s.status for s in (await h.steps()).values()} == {STOPPED}
        assert stored.progress.stopped_steps == 3
        assert h.calls["on_stopped"] == 1

    activations.run(scenario)


# -- item 12: a restarted activation that cannot load leaves its steps running ---------------------


def test_reactivation__a_load_that_fails_exits_without_releasing_the_steps(
    activations: Activations,
) -> None:
    """A storage error while a restarted actor loads: its actor exits (`Exit.UNLOADED`), and
    the job actor releases dedicated step actors only at `Exit.AT_REST`: the running steps are
    the next activation's to adopt. A job whose record is gone is at rest."""

    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[1], dedicated=[0]), storage=storage)
        await h.c.start()
        storage.fail("get_job")
        core = await h.activate(reconstructed=True)
        assert (core.mode, core.exit) == (Mode.UNLOADED, Exit.UNLOADED)
        assert h.hosts.running_ids() == {"000000"}

        await h.storage.remove_job(h.job_id)
        core = await h.activate(reconstructed=True)
        assert (core.mode, core.exit) == (Mode.AT_REST, Exit.AT_REST)

    activations.run(scenario)


# -- item 11: a resume whose save fails changes nothing --------------------------------------------


def test_resume__a_failed_save_leaves_the_stop_waiting_for_its_running_step(
    activations: Activations,
) -> None:
    """A stopped job with a step winding down is resumed and the RUNNING save fails: nothing of
    the resume applies (its recount, its counted records), the step is still the stop's to
    wait for, and its report counts."""

    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[2]), storage=storage)
        await h.c.start()
        await h.hosts.finish("000000")
        await h.c.stop()
        await h.settle()
        before = (h.c.stages.progress(), h.c.counting.records, set(h.c.counting.stopped))
        storage.fail("save_job")
        with pytest.raises(StorageError):
            await h.c.resume()
        assert not (await h.stored()).stop_finalized
        assert set(h.c.window.active()) == {"000001"}, "the stop still waits for it"
        after = (h.c.stages.progress(), h.c.counting.records, set(h.c.counting.stopped))
        assert after == before, "the resume's recount and counted records are not applied"

        assert len(await h.hosts.stop_cancelled()) == 1
        await h.settle()
        stored = await h.stored()
        assert (stored.status, stored.stop_finalized) == (JobStatus.STOPPED, True)
        assert (stored.progress.successful_steps, stored.progress.stopped_steps) == (1, 1)
        assert h.calls["on_stopped"] == 1

    activations.run(scenario)


# -- items 6 and 8: a host is gone when its incarnation is -----------------------------------------


def test_watch__an_error_without_a_death_is_asked_again_and_starts_nothing_twice(
    activations: Activations,
) -> None:
    """A watch call that fails while its host lives (leases off) does not start the host's
    steps a second time elsewhere; the host's death, later, still does."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        h.hosts.watch_errors = 1
        await h.c.start()
        await h.settle()
        await eventually(lambda: len(h.hosts.watches) == 2, what="the watch asked again")
        await h.settle()
        assert len(h.hosts.calls) == 1, "the host lives: its steps are not started again"
        (host,) = {host for host, _batch in h.hosts.calls}

        h.hosts.kill(host)
        await h.settle()
        assert len(h.hosts.calls) == 2
        assert await h.all_succeed() == (JobStatus.COMPLETED_SUCCESSFULLY, 2)

    activations.run(scenario)


def test_watch__a_host_that_restarted_before_its_watch_is_gone_for_the_job(
    activations: Activations,
) -> None:
    """The host restarts between its answer and the watch: the watch of the answering
    incarnation returns at once, and the steps it ran start again."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        h.hosts.restart_after_answer = 1
        await h.c.start()
        await h.settle()
        assert len(h.hosts.calls) == 2, "started again on a live incarnation"
        assert h.hosts.running_ids() == {"000000", "000001"}
        assert await h.all_succeed() == (JobStatus.COMPLETED_SUCCESSFULLY, 2)

    activations.run(scenario)


def test_watch__a_host_restart_seen_in_a_later_answer_restarts_only_the_steps_it_lost(
    activations: Activations,
) -> None:
    """Two steps on one host in two start operations, the first of which throws; the host
    restarts; its watch cannot tell. The failed step's restart is answered by the new
    incarnation: that answer tells the job that the other step is gone, and it starts again,
    once."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]), step_batch_size=1)
        h.hosts.shared = ["host-0"]
        h.hosts.watch_errors = 1_000  # the watch never tells
        h.hosts.fail_starts = 1
        await h.c.start()
        await h.settle()
        assert h.hosts.running_ids() == {"000001"}
        h.hosts.restart("host-0")

        await h.c.watchdog_tick()  # restarts the step whose start threw
        await h.settle()
        assert [batch[0].step_id for _host, batch in h.hosts.calls] == [
            "000000", "000001", "000000", "000001"
        ]  # fmt: skip
        assert h.hosts.running_ids() == {"000000", "000001"}
        assert await h.all_succeed() == (JobStatus.COMPLETED_SUCCESSFULLY, 2)

    activations.run(scenario)


# -- item 7: a host that does not answer is unknown ------------------------------------------------


def test_resume__a_host_that_does_not_answer_fails_it_and_lifts_the_fence(
    activations: Activations,
) -> None:
    """A resume whose fenced read finds a host that does not answer fails (its steps are
    unknown, not none) and lifts the fence of the hosts that did answer; asked again, it
    resumes."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        await h.c.start()
        await h.c.stop()
        h.hosts.running_errors = 1
        with pytest.raises(StepHostUnknownError):
            await h.c.resume()
        assert h.hosts.fenced == {}, "the fence is lifted"
        assert (await h.stored()).status is JobStatus.STOPPED

        await h.c.resume()
        assert (await h.stored()).status is JobStatus.RUNNING

    activations.run(scenario)


def test_epochs__a_start_of_an_older_activation_is_refused_once_a_newer_one_asked(
    activations: Activations,
) -> None:
    """The actor restarts while its old activation still runs (a zombie, or its start still on
    the way): the new activation takes the next epoch, and the hosts it asked refuse the old
    one's starts, so a step is not started by both."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]), max_active_steps_per_job=1)
        await h.c.start()
        old = h.c
        assert h.hosts.running_ids() == {"000000"}  # 000001 waits for the window

        new = await h.activate(reconstructed=True)
        assert new.epoch > old.epoch > 0
        first = await h.hosts.finish("000000")  # reported to the new activation
        await old.report_outcomes([first])  # and heard by the old one, which fills its window
        await old._pump()
        await h.settle()

        assert [s.step_id for _epoch, batch in h.hosts.stale for s in batch] == ["000001"]
        assert [s.step_id for s in h.hosts.started].count("000001") == 1
        assert await h.all_succeed() == (JobStatus.COMPLETED_SUCCESSFULLY, 2)

    activations.run(scenario)


def test_epochs__each_activation_takes_a_newer_one_with_a_conditional_write(
    activations: Activations,
) -> None:
    """An activation of a job not at rest takes its epoch as it loads (the version of its first
    save); one of a job at rest takes one only when an operation reopens the job."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1]))
        assert h.c.epoch == (await h.stored()).version
        await h.c.start()
        again = await h.activate(reconstructed=True)
        assert again.epoch > h.activations[0].epoch
        assert await h.all_succeed() == (JobStatus.COMPLETED_SUCCESSFULLY, 1)

        at_rest = await h.activate()
        assert at_rest.epoch == 0 and at_rest.mode is Mode.AT_REST

    activations.run(scenario)


def test_remove__finished_when_its_last_step_is_counted_from_storage_after_its_host_died(
    activations: Activations,
) -> None:
    """A removal's last step: its host dies, and the job's STOPPED write for it lands but its
    answer is lost. The loss is handled again and finds the stop stored: it counts it, and the
    removal finishes there (found by exploring the storage-faults machine)."""

    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[1]), storage=storage)
        await h.c.start()
        await h.c.remove()
        storage.ack_lost("update_steps")
        (host,) = {run.host for run in h.hosts.running_steps()}
        h.hosts.kill(host)
        # The loss is handled again (after 1 s): it counts the stop it finds stored.
        await eventually(lambda: not h.c.window.runs, what="the stop counted")
        await h.settle()
        await h.c.watchdog_tick()

        assert h.job_id not in h.storage.jobs
        assert h.c.mode is Mode.REMOVED

    activations.run(scenario)
