"""What a final stop guarantees (docs/jobs.md), failing first (issue 35): each test injects the
fault of one defect the issue traced and asserts what the docs or the spec promise. A test marked
`xfail` fails on today's code, at its assertion, for its defect's reason; the fix removes the
mark (strict: the test passing while marked fails the suite)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Collection
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from choreography_ray.core.mode import Mode
from choreography_ray.core.planning import FEED_STATUSES
from choreography_ray.errors import StorageError
from choreography_ray.model import JobState
from choreography_ray.options import JobsOptions
from choreography_ray.runtime import manager as manager_module
from choreography_ray.status import JobStatus, StepStatus
from choreography_ray.storage import StoredStart
from choreography_ray.types import type_path
from tests.unit.core.conftest import Activations
from tests.unit.core.fakes import FAILED, FakeHosts, FaultyStorage
from tests.unit.core.harness import Harness, eventually
from tests.unit.core.jobs import Plan, StagedJob

pytestmark = pytest.mark.timeout(30)


def issue_35(defect: str, raises: type[BaseException] = AssertionError) -> pytest.MarkDecorator:
    """Fails today, at the test's promise (`raises`: any other error is a harness mistake
    and fails the suite), for `defect`."""
    return pytest.mark.xfail(strict=True, raises=raises, reason=f"issue 35: {defect}")


class Storage(FaultyStorage):
    """Faulty storage that can also fail the read of a stage's steps without an outcome (the
    feed's, and a stop's count of the steps it never started): the next `unread_failures`
    of them raise. Other `list_starts` (the running steps a resume or a stop adopts) pass."""

    def __init__(self) -> None:
        super().__init__()
        self.unread_failures = 0

    async def list_starts(
        self,
        job_id: str,
        *,
        statuses: Collection[StepStatus] | None = None,
        stage: int | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> list[StoredStart]:
        if statuses is not None and set(statuses) == FEED_STATUSES and self.unread_failures:
            self.unread_failures -= 1
            raise self.error("reading the steps without an outcome failed (fault injected)")
        return await super().list_starts(
            job_id, statuses=statuses, stage=stage, after=after, limit=limit
        )


class Hosts(FakeHosts):
    """Fake hosts with two more faults: watch calls wait for `watch_gate` when it is set (the
    job learns of a host's death late, or the call is in flight while its host restarts),
    and the next `refresh_errors` refreshes raise."""

    def __init__(self, storage: FaultyStorage, shared_hosts: int = 2) -> None:
        super().__init__(storage, shared_hosts)
        self.watch_gate: asyncio.Event | None = None
        self.refresh_errors = 0

    async def watch(self, host: str, incarnation: str | None) -> None:
        if self.watch_gate is not None:
            await self.watch_gate.wait()
        await super().watch(host, incarnation)

    async def refresh(self) -> None:
        await super().refresh()
        if self.refresh_errors > 0:
            self.refresh_errors -= 1
            raise ConnectionError("reading the node table failed (fault injected on purpose)")


async def new_job(
    activations: Activations, sizes: list[int], shared_hosts: int = 2, **options: Any
) -> tuple[Harness, Hosts, Storage]:
    """A job of `sizes` steps per stage on `shared_hosts` hosts, over faulty storage: activated,
    not started."""
    storage = Storage()
    hosts = Hosts(storage, shared_hosts)
    h = await activations.new(StagedJob, Plan(sizes=sizes), storage=storage, hosts=hosts,
                              **options)  # fmt: skip
    return h, hosts, storage


async def ticks(h: Harness, n: int = 3) -> None:
    """`n` watchdog ticks, each let settle; a tick that raises is logged and the next one comes,
    as the watchdog's task does."""
    for _ in range(n):
        with contextlib.suppress(Exception):
            await h.c.watchdog_tick()
        await h.settle()


async def ticks_until_final(h: Harness, within: float = 5.0) -> None:
    """Watchdog ticks until the stored stop is final, or `within` s (a finish retried on its
    timer: `fast_backoff`)."""
    deadline = asyncio.get_running_loop().time() + within
    while not (await h.stored()).stop_finalized and asyncio.get_running_loop().time() < deadline:
        await ticks(h, 1)
        await asyncio.sleep(0.05)


async def assert_stop_is_final(h: Harness) -> None:
    """What a final stop guarantees: the stop ends (STOPPED, `stop_finalized`), and `progress`
    counts every step once (successful, failed, stopped or unreachable)."""
    stored = await h.stored()
    assert (stored.status, stored.stop_finalized) == (JobStatus.STOPPED, True), (
        f"the stop never ended: {stored.status}, stop_finalized={stored.stop_finalized}, "
        f"run table {table(h)}"
    )
    p = stored.progress
    counted = p.successful_steps + p.failed_steps + p.stopped_steps + p.unreachable_steps
    assert p.is_stopped, (
        f"the stop finalized with {counted} of {p.total_steps} steps counted, run table "
        f"{table(h)}, stored {Counter(s.status.value for s in (await h.steps()).values())}"
    )


def table(h: Harness) -> dict[str, str]:
    """The run table: step id -> state."""
    return {step_id: run.state.value for step_id, run in h.c.window.runs.items()}


def starts_of(h: Harness, step_id: str) -> list[int]:
    """The attempts of `step_id` a host stored RUNNING and ran, in order."""
    return [s.attempt for s in h.hosts.started if s.step_id == step_id]


# -- the final stop -------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["hosts.running", "storage.get_steps"])
def test_stop__starts_that_threw_are_counted_when_reading_them_fails(
    activations: Activations, fault: str, fast_backoff: object
) -> None:
    """The stop comes while the first wave's start operation waits on its host; it then throws,
    and `stop_failed_starts` cannot read what became of its steps: `hosts.running` raises
    (StepHostUnknownError: a host restarting) or storage's `get_steps` does. The rows stay
    START_FAILED, which `in_flight()` leaves out and neither `finish_stop` nor `sweep_stop`
    counts: the next tick finalizes the stop with those steps counted nowhere."""

    async def scenario() -> None:
        h, hosts, storage = await new_job(activations, [4])
        gate = hosts.start_gate = asyncio.Event()
        start = asyncio.create_task(h.c.start())
        await h.settle()
        await h.c.stop()
        hosts.fail_starts = len(hosts.calls)
        if fault == "hosts.running":
            hosts.running_errors = 1
        else:
            storage.fail("get_steps", 1)
        gate.set()
        await start
        await h.settle()
        await ticks_until_final(h)

        await assert_stop_is_final(h)

    activations.run(scenario)


def test_stop__steps_the_feed_has_not_read_are_counted_when_reading_them_fails(
    activations: Activations,
) -> None:
    """Two of six steps run, two are queued, and the feed (a page of two) has not read the
    last two. The stop's read of them (`stop_unread`'s `list_starts`) fails once;
    `halt_and_tell` logs it and goes on, and the stop finalizes once the two running steps
    reported, the unread ones counted nowhere (and stored SCHEDULED)."""

    async def scenario() -> None:
        h, hosts, storage = await new_job(
            activations, [6], max_active_steps_per_job=2, plan_chunk_size=2
        )
        await h.c.start()
        storage.unread_failures = 1
        await h.c.stop()
        await hosts.stop_cancelled()
        await h.settle()
        await ticks(h)

        await assert_stop_is_final(h)

    activations.run(scenario)


def test_recover__a_stop_carried_on_counts_unread_steps_when_reading_them_fails(
    activations: Activations,
) -> None:
    """An activation stopped the job (two of six steps ran; they stored their stop, their
    reports lost) and was lost before it finished. The next activation's idle tick carries the
    stop on (`tell_stop_again`), whose read of the never-started steps fails once: it raises
    having entered STOPPING, so the next tick finishes the stop without reading them again,
    finalized with two of six steps counted and four stored SCHEDULED."""

    async def scenario() -> None:
        h, hosts, storage = await new_job(
            activations, [6], max_active_steps_per_job=2, plan_chunk_size=2
        )
        await h.c.start()
        await h.c.stop()
        for step_id in sorted(hosts.running_ids()):
            await hosts.finish(step_id, StepStatus.STOPPED, deliver=0)
        await h.activate()
        storage.unread_failures = 1
        await ticks(h)

        await assert_stop_is_final(h)

    activations.run(scenario)


def test_recover__adopted_steps_whose_host_restarts_while_watched_are_stopped(
    activations: Activations, fast_backoff: object
) -> None:
    """A reactivation adopts two steps running on host-0 and watches it (`stage_flow.adopt`).
    The watch call is in flight when host-0 restarts and raises (as Ray's
    ActorUnavailableError does for a restarting actor: the fake raises it once the call
    lands after the restart), and is asked again. Were it asked with incarnation None (it
    was, before issue 35), it would attach to the new incarnation and never fire: the steps
    gone, the job holding them ACTIVE, a stop with leases off waiting for them for ever. It
    names the incarnation that listed the steps, which is gone."""

    async def scenario() -> None:
        h, hosts, _storage = await new_job(activations, [2], shared_hosts=1)
        await h.c.start()
        gate = hosts.watch_gate = asyncio.Event()
        hosts.watch_errors = 1
        await h.activate(reconstructed=True)  # adopts both steps, watches host-0 (None)
        await h.settle()  # the watch call is on its way to host-0
        hosts.restart("host-0")
        gate.set()
        # The first activation's watch, this one's, and this one's asked again (the steps it
        # starts again may be watched on the new incarnation before this looks: a fourth).
        await eventually(lambda: [w[0] for w in hosts.watches].count("host-0") >= 3,
                         what="the watch asked again")  # fmt: skip
        assert hosts.watches[1:3] == [("host-0", "host-0#0")] * 2
        assert set(hosts.watches[3:]) <= {("host-0", "host-0#1")}
        await h.c.stop()
        await hosts.stop_cancelled()
        await h.settle()
        await ticks(h)

        await assert_stop_is_final(h)

    activations.run(scenario)


def test_stop__a_start_answered_by_a_restarted_host_is_settled_when_the_loss_fails(
    activations: Activations,
) -> None:
    """Steps 0 and 1 run on host-0; step 0 ends and step 2's start waits on host-0 while it
    restarts (step 1 dies with it) and the job stops. Step 2's start is answered by the new
    incarnation before the watch tells the job (the watch is late), and the handling of step
    1's loss fails (its read, `get_steps`). Before issue 35 `answered` ran that loss before
    it answered the batch, so step 2 stayed STARTING, never told to stop and outside the
    watchdog's lost-report settling: step 2 succeeding with its report lost, the stop waited
    for ever. Now the batch is answered first and the loss is handled again later."""

    async def scenario() -> None:
        h, hosts, storage = await new_job(
            activations, [3], shared_hosts=1, max_active_steps_per_job=2
        )
        watch = hosts.watch_gate = asyncio.Event()
        await h.c.start()
        start = hosts.start_gate = asyncio.Event()
        await hosts.finish("000000")
        await h.settle()  # step 2's start waits on host-0
        hosts.restart("host-0")
        await h.c.stop()
        storage.fail("get_steps", 1)
        start.set()
        await h.settle()
        watch.set()
        await h.settle()
        await hosts.finish("000002", deliver=0)
        await ticks(h)

        await assert_stop_is_final(h)

    activations.run(scenario)


# -- the smaller ones -----------------------------------------------------------------------------


def test_recover__of_a_stop_whose_final_save_failed_runs_on_stopped_once(
    activations: Activations,
) -> None:
    """`on_stopped` ran and the final save failed: the activation is in FINISHING_STOP, the
    save owed on the finish timer. A rehydration's `recover` reaches it first: `recover` has
    no guard for FINISHING_STOP (not `live`), so `tell_stop_again` goes back to STOPPING and
    the finish runs the hook again."""

    async def scenario() -> None:
        h, hosts, storage = await new_job(activations, [1])
        gate = asyncio.Event()
        hook = h.control("on_stopped", gate=gate)
        await h.c.start()
        await h.c.stop()
        reported = asyncio.create_task(hosts.stop_cancelled())
        await hook.entered.wait()
        storage.fail("save_job", 1)  # the save after the hook: stop_finalized
        gate.set()
        await reported
        await h.settle()
        assert h.c.mode is Mode.FINISHING_STOP

        await h.c.recover()
        await h.settle()

        assert h.calls["on_stopped"] == 1, f"on_stopped ran {h.calls['on_stopped']} times"
        await assert_stop_is_final(h)

    activations.run(scenario)


def test_recover__of_a_removed_job_does_nothing(activations: Activations) -> None:
    """The job was removed (records gone, the activation REMOVED, its actor about to exit);
    a rehydration's `recover` reaches it: `recover_action` reads the REMOVING status still in
    memory and `tell_stop_again` asks for STOPPING, which the table refuses."""

    async def scenario() -> None:
        h, hosts, storage = await new_job(activations, [1])
        await h.c.start()
        await h.c.remove()
        await hosts.stop_cancelled()
        await h.settle()
        assert h.c.mode is Mode.REMOVED
        assert h.job_id not in storage.jobs

        try:
            await h.c.recover()
        except Exception as error:
            raise AssertionError(f"recover on a removed job raised {error!r}") from error
        assert h.c.mode is Mode.REMOVED
        assert h.job_id not in storage.jobs

    activations.run(scenario)


def test_host__a_loss_whose_refresh_fails_is_handled_once_and_its_steps_start_again(
    activations: Activations, fast_backoff: object
) -> None:
    """A reactivation adopted two steps on host-0 (watched with incarnation None); host-0
    restarts. The loss is handled (the steps queued again) and the host forgotten, then the
    node table's refresh fails: `until_done` runs `gone()` again, which finds None == None,
    handles the loss again and deletes the forgotten host: KeyError, for ever, and the kick
    after it never comes, so the queued steps wait for a watchdog tick."""

    async def scenario() -> None:
        h, hosts, _storage = await new_job(activations, [2], shared_hosts=1)
        await h.c.start()
        await h.activate(reconstructed=True)  # adopts both steps, watches host-0 (None)
        await h.settle()  # the watch call has reached host-0
        hosts.refresh_errors = 1
        hosts.restart("host-0")
        await h.settle()

        await eventually(lambda: starts_of(h, "000000") == starts_of(h, "000001") == [1, 1],
                         within=2.0, what="the steps lost with host-0 to start again")  # fmt: skip

    activations.run(scenario)


def test_start__a_failure_with_attempts_left_is_retried_after_the_running_save_failed(
    activations: Activations,
) -> None:
    """The first wave started, then start's RUNNING save failed. Step 0 fails at attempt 1 of
    2. Before issue 35 the activation went IDLE (the watchdog finishing startup through a
    resume) while its steps ran, `settle` retried only when `live`, so the failure counted as
    final and the job completed with a failure it had an attempt left for. Now it keeps
    driving its steps in RUNNING, the save owed (the watchdog's tick saves it)."""

    async def scenario() -> None:
        h, hosts, storage = await new_job(activations, [2], max_step_attempts=2)
        gate = hosts.start_gate = asyncio.Event()
        start = asyncio.create_task(h.c.start())
        await h.settle()
        storage.fail("save_job", 1)  # start's last turn: RUNNING
        gate.set()
        with pytest.raises(StorageError):
            await start
        assert h.c.mode is Mode.RUNNING  # it drives its steps, the save owed

        await hosts.finish("000000", FAILED, "attempt 1")
        await h.settle()
        await ticks(h, 1)  # finishes startup through a resume
        await hosts.finish_all()
        await h.settle()
        await hosts.finish_all()
        await h.settle()

        status = await h.status()
        assert status is JobStatus.COMPLETED_SUCCESSFULLY, (
            f"{status}; step 000000 ran attempts {starts_of(h, '000000')}"
        )

    activations.run(scenario)


def test_stop__of_a_running_job_this_activation_never_resumed_counts_from_storage(
    activations: Activations,
) -> None:
    """Found by the soak (seed 936093: `stop_storage_read_fail` after a `restart_cluster`): the
    rehydration's `recover` of the new activation failed on a refused read, so it stayed IDLE
    with the job RUNNING; the stop then saved STOPPED and took `halt_and_tell`, the path of a
    job driven here: its window was empty and its feed None, so the final stop kept the record's
    last saved counts (a step that succeeded meanwhile uncounted) and counted none of the steps
    that never started. `tell_stop_again` (a stop an earlier activation left) recounts from
    storage; a stop in IDLE should go that way (a missing act of the table)."""

    async def scenario() -> None:
        h = await never_resumed_here(activations, FaultyStorage())
        await h.c.stop()
        await assert_stopped_counting_storage(h)

    activations.run(scenario)


async def never_resumed_here(activations: Activations, storage: FaultyStorage) -> Harness:
    """Six steps, two running, in a new activation its rehydration's recover has not reached
    (or failed in): one of the two succeeded meanwhile, its report never delivered."""
    h = await activations.new(
        StagedJob, Plan(sizes=[6]), storage=storage, max_active_steps_per_job=2
    )
    await h.c.start()
    await h.settle()
    await h.activate(reconstructed=False)
    running = sorted(h.hosts.running_ids())
    assert len(running) == 2
    await h.hosts.finish(running[0], deliver=0)
    return h


async def assert_stopped_counting_storage(h: Harness) -> None:
    """The stop is final with storage's counts: the success, and five steps stopped."""
    await h.hosts.stop_cancelled()
    await h.settle()
    stored = await h.stored()
    assert (stored.status, stored.stop_finalized) == (JobStatus.STOPPED, True)
    assert (stored.progress.successful_steps, stored.progress.stopped_steps) == (1, 5)


def test_stop__of_a_job_never_resumed_here_whose_reads_fail_is_carried_on_later(
    activations: Activations,
) -> None:
    """As above, and the stop's reads from storage fail: the stop is stored, so the stop
    answers; the activation stays idle with the stop owed, and the next tick carries it on from
    storage, every step counted."""

    async def scenario() -> None:
        storage = FaultyStorage()
        h = await never_resumed_here(activations, storage)
        storage.fail("count_by_status", 1)
        await h.c.stop()
        assert h.c.mode is Mode.IDLE
        await h.c.watchdog_tick()
        await assert_stopped_counting_storage(h)

    activations.run(scenario)


def test_manager__rehydration_passes_keep_what_they_drained_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rehydration pass (a restart's, recovery's, the reconciliation's) appends every job
    it dispatched to `ManagerCore.drained`, never trimmed: its size grows with the manager's
    history, not with what one pass holds. Read here as: it holds the last drain (what
    `drain_stats` reports); another bound would do. No Ray: the manager is built on SQLite
    and its actor lookup answers a fake actor whose `recover` does nothing."""

    async def recover() -> None:
        await asyncio.sleep(0)

    async def job_actor(job_id: str) -> Any:
        return SimpleNamespace(recover=SimpleNamespace(remote=recover))

    async def scenario() -> None:
        core = manager_module.ManagerCore("s", "n", f"sqlite:///{tmp_path / 'jobs.db'}",
                                          JobsOptions().model_dump_json(), "ns")  # fmt: skip
        monkeypatch.setattr(core, "job_actor", job_actor)
        try:
            job = JobState(id="interrupted", scope="s", namespace="n", type=type_path(StagedJob),
                           request=Plan().model_dump(mode="json"))  # fmt: skip
            await core.storage.create_job(job.with_status(JobStatus.RUNNING))
            for _ in range(5):
                assert await core.rehydrate() == ["interrupted"]
                assert core._drain is not None
                await core._drain
            assert core.drained == ["interrupted"], (
                f"5 passes over one job left {len(core.drained)} entries in `drained`"
            )
        finally:
            core.tasks.cancel_all()
            await core.storage.close()

    asyncio.run(asyncio.wait_for(scenario(), 20))
