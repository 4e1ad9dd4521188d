"""Pool dispatch (no Ray): a job's steps of a pool wait QUEUED until a placed host has room
(`Placement.credit` per host per job), go to the host with the most room first, and what the
job holds of each pool is told to the pools' owner (`sync_pools`) while it holds any."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from choreography_ray.core import pool_dispatch
from choreography_ray.core.placement import MIN_CREDIT, placement_of, shape_name
from choreography_ray.core.pool_rules import PoolDemand
from choreography_ray.core.window import RunState
from choreography_ray.status import JobStatus
from choreography_ray.storage.memory import MemoryStorage
from choreography_ray.types import type_path
from tests.unit.core import pool_jobs
from tests.unit.core.conftest import Activations
from tests.unit.core.fakes import FakeHosts
from tests.unit.core.harness import Harness, eventually
from tests.unit.core.pool_jobs import GpuNoCpuStep, GpuStep, PoolJob, PoolPlan

pytestmark = pytest.mark.timeout(30)

SHAPE = shape_name((("num_gpus", 1.0),))
CREDIT = placement_of(GpuStep).credit
assert CREDIT == MIN_CREDIT
#: More steps than two hosts' credit.
MANY = 2 * CREDIT + 8
HOST_0 = f"pool/{SHAPE}/node-a/0"
HOST_1 = f"pool/{SHAPE}/node-b/0"
#: Seconds between syncs in these tests (1 s in the package).
SYNC = 0.02


@pytest.fixture(autouse=True)
def fast_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_dispatch, "SYNC_SECONDS", SYNC)
    monkeypatch.setattr(pool_dispatch, "SYNC_SOON_SECONDS", SYNC, raising=False)


async def pool_job(
    activations: Activations, plan: PoolPlan, *hosts: str, **options: object
) -> Harness:
    """A job of `plan` whose pool has these placed hosts (none: its steps wait)."""
    h = await activations.new(PoolJob, plan, **options)
    h.hosts.pools[SHAPE] = list(hosts)
    return h


def on_host(h: Harness) -> Counter[str]:
    """Steps running on each host now."""
    return Counter(run.host for run in h.hosts.running_steps())


def queued(h: Harness) -> int:
    return h.c.window.count(RunState.QUEUED)


def assert_within_credit(h: Harness) -> None:
    assert all(len(batch) <= CREDIT for _, batch in h.hosts.calls), [
        (host, len(batch)) for host, batch in h.hosts.calls
    ]
    assert all(n <= CREDIT for n in on_host(h).values()), on_host(h)


# -- no placed host: the steps wait as demand -----------------------------------------------------


def test_start__a_pool_with_no_placed_host_starts_the_job_with_its_steps_queued(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await pool_job(activations, PoolPlan(gpu=[MANY]))

        assert await h.c.start() is None
        await h.settle()

        assert (await h.status()) is JobStatus.RUNNING
        assert h.hosts.calls == []
        assert queued(h) == MANY
        assert h.c.window.queued(type_path(GpuStep)) == MANY
        await eventually(lambda: h.hosts.synced, what="a sync with the pools' owner")
        job_id, demands = h.hosts.synced[-1]
        assert job_id == h.job_id
        assert demands == [
            PoolDemand(SHAPE, (("num_gpus", 1.0),), CREDIT, MANY, 0, None, 60.0, waiting=MANY)
        ]
        # It says it again while it holds the steps.
        said = len(h.hosts.synced)
        await eventually(lambda: len(h.hosts.synced) > said + 2, what="the syncs going on")
        assert h.hosts.calls == []

    activations.run(scenario)


def test_demands__two_types_of_one_shape_are_one_demand(activations: Activations) -> None:
    """`{"num_gpus": 1}` and `{"num_gpus": 1, "num_cpus": 0}` are one pool."""

    async def scenario() -> None:
        h = await pool_job(activations, PoolPlan(gpu=[5], gpu_no_cpu=[7], plain=[3]))
        assert await h.c.start() is None
        await h.settle()

        # The plain steps do not wait behind the pool's.
        assert len(h.hosts.started) == 3
        assert queued(h) == 12
        assert [(d.shape, d.steps) for d in pool_dispatch.demands(h.c)] == [(SHAPE, 12)]
        await eventually(lambda: h.hosts.synced, what="a sync")
        assert [(d.shape, d.steps) for d in h.hosts.synced[-1][1]] == [(SHAPE, 12)]
        assert type_path(GpuNoCpuStep) in h.c.placements

    activations.run(scenario)


# -- hosts named: steps follow their room ---------------------------------------------------------


def test_dispatch__a_host_named_takes_steps_up_to_its_credit_and_more_as_they_end(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await pool_job(activations, PoolPlan(gpu=[MANY]))
        assert await h.c.start() is None
        await h.settle()
        assert h.hosts.calls == []

        h.hosts.pools[SHAPE] = [HOST_0]
        await eventually(lambda: len(h.hosts.started) == CREDIT, what="the host's credit")
        await h.settle()
        assert len(h.hosts.started) == CREDIT
        assert {host for host, _ in h.hosts.calls} == {HOST_0}
        assert queued(h) == MANY - CREDIT
        assert_within_credit(h)
        demand = pool_dispatch.demands(h.c)
        assert [d.steps for d in demand] == [MANY], "held: queued and on the host"

        # Five end: five more go to the host, never more than its credit at once.
        for step_id in sorted(h.hosts.running_ids())[:5]:
            await h.hosts.finish(step_id)
        await eventually(lambda: len(h.hosts.started) == CREDIT + 5, what="the refill")
        await h.settle()
        assert len(h.hosts.started) == CREDIT + 5
        assert on_host(h) == {HOST_0: CREDIT}
        assert_within_credit(h)

        while h.hosts.running_ids():
            await h.hosts.finish_all()
            await h.settle()
            await eventually(lambda: h.hosts.running_ids() or not queued(h), what="the next share")
            assert_within_credit(h)
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert stored.progress.successful_steps == MANY
        assert len(h.hosts.started) == MANY
        assert len({s.step_id for s in h.hosts.started}) == MANY

    activations.run(scenario)


def test_dispatch__a_second_host_named_later_takes_part_of_the_backlog(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await pool_job(activations, PoolPlan(gpu=[MANY]), HOST_0)
        assert await h.c.start() is None
        await h.settle()
        assert on_host(h) == {HOST_0: CREDIT}
        assert queued(h) == MANY - CREDIT

        h.hosts.pools[SHAPE] = [HOST_0, HOST_1]
        await eventually(lambda: on_host(h)[HOST_1] == CREDIT, what="the new host's share")
        await h.settle()
        assert on_host(h) == {HOST_0: CREDIT, HOST_1: CREDIT}
        assert queued(h) == MANY - 2 * CREDIT
        assert_within_credit(h)

        # The host with the most room gets the next steps first.
        for step_id in sorted(r.start.step_id for r in h.hosts.running_steps() if r.host == HOST_1)[
            :4
        ]:
            await h.hosts.finish(step_id)
        for step_id in sorted(r.start.step_id for r in h.hosts.running_steps() if r.host == HOST_0)[
            :2
        ]:
            await h.hosts.finish(step_id)
        await eventually(lambda: queued(h) == MANY - 2 * CREDIT - 6, what="the refill")
        await h.settle()
        assert on_host(h) == {HOST_0: CREDIT, HOST_1: CREDIT}
        assert_within_credit(h)

        while h.hosts.running_ids():
            await h.hosts.finish_all()
            await eventually(lambda: h.hosts.running_ids() or not queued(h), what="the next share")
            assert_within_credit(h)
        await h.settle()
        assert (await h.status()) is JobStatus.COMPLETED_SUCCESSFULLY
        ran = Counter(host for host, batch in h.hosts.calls for _ in batch)
        assert sum(ran.values()) == MANY
        assert ran[HOST_1] >= CREDIT

    activations.run(scenario)


def test_dispatch__room_is_shared_by_the_types_of_one_shape(activations: Activations) -> None:
    async def scenario() -> None:
        h = await pool_job(activations, PoolPlan(gpu=[CREDIT - 4], gpu_no_cpu=[CREDIT - 4]), HOST_0)
        assert await h.c.start() is None
        await h.settle()
        assert on_host(h) == {HOST_0: CREDIT}
        assert queued(h) == CREDIT - 8
        assert_within_credit(h)

    activations.run(scenario)


def test_dispatch__a_host_that_leaves_the_pool_gets_no_more_steps(activations: Activations) -> None:
    async def scenario() -> None:
        h = await pool_job(activations, PoolPlan(gpu=[MANY]), HOST_0, HOST_1)
        assert await h.c.start() is None
        await h.settle()
        assert on_host(h) == {HOST_0: CREDIT, HOST_1: CREDIT}

        h.hosts.pools[SHAPE] = [HOST_1]
        before = len(h.hosts.calls)
        await h.hosts.finish_all()
        await eventually(lambda: len(h.hosts.started) == MANY, what="the rest started")
        await h.settle()
        assert {host for host, _ in h.hosts.calls[before:]} == {HOST_1}
        assert_within_credit(h)

    activations.run(scenario)


# -- the owner learns the demand ------------------------------------------------------------------


def test_sync__says_what_the_job_holds_while_it_holds_any_then_stops(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await pool_job(activations, PoolPlan(gpu=[CREDIT + 5], plain=[2]), HOST_0)
        assert await h.c.start() is None
        await h.settle()
        assert on_host(h)[HOST_0] == CREDIT
        await eventually(lambda: h.hosts.synced, what="a sync")
        assert [d.steps for d in h.hosts.synced[-1][1]] == [CREDIT + 5]

        # The waiting ones start: the steps on the host are still said.
        await h.hosts.finish_all()
        await h.settle()
        assert on_host(h)[HOST_0] == 5
        said = len(h.hosts.synced)
        await eventually(lambda: len(h.hosts.synced) > said, what="the next sync")
        assert [d.steps for d in h.hosts.synced[-1][1]] == [5]

        await h.hosts.finish_all()
        await h.settle()
        assert (await h.status()) is JobStatus.COMPLETED_SUCCESSFULLY
        said = len(h.hosts.synced)
        await asyncio.sleep(10 * SYNC)
        await h.settle()
        assert len(h.hosts.synced) <= said + 1

    activations.run(scenario)


def test_sync__a_later_stage_whose_steps_all_fit_on_known_hosts_is_said(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await pool_job(activations, PoolPlan(gpu=[CREDIT + 5, 3]), HOST_0)
        pool_jobs.REFUSED[h.job_id] = {1}  # stage 1 waits for admission a while
        assert await h.c.start() is None
        await h.settle()
        await eventually(lambda: h.hosts.synced, what="a sync")
        await h.hosts.finish_all()
        await h.settle()
        await h.hosts.finish_all()
        await eventually(lambda: h.c.awaiting_admission == 1, what="stage 1 awaiting admission")
        # Meanwhile the job holds no step of the pool: it said so, and stopped saying.
        await eventually(lambda: h.hosts.synced[-1][1][0].steps == 0, what="a sync of none")
        await asyncio.sleep(5 * SYNC)
        del pool_jobs.REFUSED[h.job_id]
        await h.c.watchdog_tick()  # asks admission again
        await eventually(lambda: h.c.job_state.stage == 1, what="stage 1")
        await eventually(lambda: len(h.hosts.started) == CREDIT + 8, what="stage 1 started")
        await h.settle()
        assert on_host(h)[HOST_0] == 3
        # Stage 1's steps run on the pool's host: the owner learns it (else it counts the
        # host as unwanted: reclaimed for another shape, left out of the autoscaler's request).
        await asyncio.sleep(10 * SYNC)
        await h.settle()
        assert [d.steps for d in h.hosts.synced[-1][1]] == [3]

    activations.run(scenario)


# -- a stop while the steps wait ------------------------------------------------------------------


def test_stop__a_job_whose_pool_steps_all_wait_counts_them_stopped_and_finalizes(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await pool_job(activations, PoolPlan(gpu=[MANY]))
        assert await h.c.start() is None
        await h.settle()
        assert queued(h) == MANY

        await h.c.stop()
        await h.settle()

        stored = await h.stored()
        assert stored.status is JobStatus.STOPPED
        assert stored.stop_finalized
        assert stored.progress.stopped_steps == MANY
        assert stored.progress.is_stopped
        assert h.hosts.calls == []
        assert queued(h) == 0
        # A host named now gets nothing.
        h.hosts.pools[SHAPE] = [HOST_0]
        h.c.kick()
        await h.settle()
        assert h.hosts.calls == []

    activations.run(scenario)


def test_stop__pool_steps_on_a_host_are_told_to_stop_and_those_waiting_count_stopped(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await pool_job(activations, PoolPlan(gpu=[CREDIT + 10]), HOST_0)
        assert await h.c.start() is None
        await h.settle()
        assert on_host(h) == {HOST_0: CREDIT}

        stop = asyncio.create_task(h.c.stop())
        await h.settle()
        assert any(HOST_0 in hosts for hosts, _removing in h.hosts.cancels)
        await h.hosts.stop_cancelled()
        await stop
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.STOPPED
        assert stored.stop_finalized
        assert stored.progress.stopped_steps == CREDIT + 10
        assert len(h.hosts.started) == CREDIT

    activations.run(scenario)


# -- an owner that does not answer ----------------------------------------------------------------


class OwnerAway(FakeHosts):
    """The pools' owner never answers: the pool's hosts stay not known (None)."""

    def pool_hosts(self, shape: str) -> list[str] | None:
        return None if shape == SHAPE else super().pool_hosts(shape)


def test_sync__an_owner_that_does_not_answer_is_asked_again_at_a_pace(
    activations: Activations, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_dispatch, "SYNC_SECONDS", 1.0)
    monkeypatch.setattr(pool_dispatch, "SYNC_SOON_SECONDS", 0.2, raising=False)

    async def scenario() -> None:
        storage = MemoryStorage()
        h = await activations.new(
            PoolJob, PoolPlan(gpu=[5]), hosts=OwnerAway(storage), storage=storage
        )
        assert await h.c.start() is None
        await asyncio.sleep(1.0)
        assert h.hosts.calls == []
        assert 1 <= len(h.hosts.synced) <= 10, f"{len(h.hosts.synced)} syncs in 1 s"

    activations.run(scenario)
