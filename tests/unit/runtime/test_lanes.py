"""Lanes (no Ray): a step type run through one instance of it, set up once, at most
`concurrency` performs (or batches) at once, a batched type's steps gathered per job into
batches, a job's waiting steps stopped (also while `setup` runs), whatever a perform raises kept
to its step, and a lane that keeps failing set up again, then its pool's host replaced."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar, TypeVar

import pytest
from pydantic import BaseModel

from choreography_ray import JobsOptions, JobStep, StepStatus
from choreography_ray.core.gate import Gate
from choreography_ray.core.limits import Holding, Key, LimitCore, TypeLimits, Want
from choreography_ray.core.messages import StepStart
from choreography_ray.core.sharing import Share
from choreography_ray.runtime.driver import SliceDriver
from choreography_ray.runtime.lanes import Lane, SetupError, lane_concurrency
from choreography_ray.runtime.outcomes import outcome_of
from choreography_ray.runtime.threads import FairThreads
from choreography_ray.step import BatchContext, StepContext, StepResult
from tests.unit.core.harness import eventually

pytestmark = pytest.mark.timeout(10)

#: Seconds a scenario may take before it fails.
SCENARIO_TIMEOUT = 5.0
#: The name of the lane's worker threads.
THREADS = "lane-test"

S = TypeVar("S", bound=JobStep[Any])


class Number(BaseModel):
    value: int


class Host:
    """What a step host gives a lane, recording what the lane does: each step's end as
    (job_id, step_id, result, error) and its driver, the tasks it spawned, and how often it
    asked for the host to be replaced (a pool's type only, as the step host does). `shares`
    are the jobs' shares (default `Share()`), `capacity` the host's and `block_limit` every
    job's `step_event_loop_block_limit` (seconds)."""

    def __init__(
        self,
        step_type: type[JobStep[Any]],
        threads: FairThreads,
        shares: dict[str, Share] | None = None,
        capacity: int | None = None,
        block_limit: float = 0.0,
    ) -> None:
        self.finished: list[tuple[str, str, Any, BaseException | None]] = []
        self.drivers: dict[str, SliceDriver | None] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.replaced = 0
        self.shares = shares or {}
        replace = self.replace if step_type.resources is not None else None
        self.lane = Lane(
            step_type,
            threads,
            lambda job_id: self.shares.get(job_id, Share()),
            self.finish,
            self.spawn,
            replace,
            capacity,
            lambda _job_id: block_limit,
        )

    def replace(self) -> None:
        self.replaced += 1

    def finish(
        self,
        job_id: str,
        step: StepStart,
        result: Any,
        error: BaseException | None,
        driver: SliceDriver | None,
    ) -> None:
        self.finished.append((job_id, step.step_id, result, error))
        self.drivers[step.step_id] = driver

    def spawn(self, coro: Coroutine[Any, Any, None], name: str, job_id: str | None) -> Any:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.append(task)
        return task

    def add(self, job_id: str, *values: int) -> None:
        """A step `{job_id}-{value}` of the job for each value, its request `Number(value)`."""
        for value in values:
            step_id = f"{job_id}-{value}"
            request = Number(value=value)
            start = StepStart(
                step_id, "tests.unit.runtime.test_lanes", 0, 1, request.model_dump_json()
            )
            self.lane.add(job_id, start, request, StepContext(job_id, step_id, 0, 1))

    def instance(self, step_type: type[S]) -> S:
        instance = self.lane.instance
        assert isinstance(instance, step_type)
        return instance

    @property
    def results(self) -> dict[str, Any]:
        return {step_id: result for _, step_id, result, error in self.finished if error is None}

    @property
    def errors(self) -> dict[str, BaseException]:
        return {step_id: error for _, step_id, _, error in self.finished if error is not None}

    async def settled(self, steps: int) -> None:
        """Waits until `steps` steps have ended and every task of the lane is done; none of
        them may have raised (the lane keeps every error to its steps)."""
        await eventually(lambda: len(self.finished) >= steps, what=f"{steps} steps ended")
        while not all(task.done() for task in self.tasks):
            await asyncio.gather(*self.tasks)
        assert [t.exception() for t in self.tasks] == [None] * len(self.tasks)
        assert len(self.finished) == steps


def run(
    step_type: type[JobStep[Any]],
    scenario: Callable[[Host], Coroutine[Any, Any, None]],
    threads: Callable[[], FairThreads] = lambda: FairThreads(4, prefix=THREADS),
    **host: Any,
) -> None:
    """Runs `scenario` with a lane of `step_type` on a loop of its own, with a pool of four
    threads (or those `threads` makes) and the `Host` options `host`; what the lane spawned is
    cancelled before the loop ends."""

    async def main() -> None:
        pool = threads()
        host_ = Host(step_type, pool, **host)
        try:
            await asyncio.wait_for(scenario(host_), SCENARIO_TIMEOUT)
        finally:
            for task in host_.tasks:
                task.cancel()
            await asyncio.gather(*host_.tasks, return_exceptions=True)
            pool.shutdown()

    asyncio.run(main())


# Setup


class AsyncSetup(JobStep[Number]):
    concurrency = 2

    def __init__(self) -> None:
        self.log: list[str] = []

    async def setup(self) -> None:
        self.log.append("setup")
        await asyncio.sleep(0.01)  # the other performs' turn to find it not done yet

    async def perform(self, request: Number, context: StepContext) -> int:
        self.log.append(f"perform {request.value}")
        await asyncio.sleep(0)
        return request.value


class SyncSetup(AsyncSetup):
    def setup(self) -> None:  # type: ignore[override]
        time.sleep(0.01)
        self.log.append("setup")


@pytest.mark.parametrize("step_type", [AsyncSetup, SyncSetup])
def test_setup__runs_once_for_many_steps_before_the_first_perform(
    step_type: type[AsyncSetup],
) -> None:
    async def scenario(host: Host) -> None:
        host.add("a", *range(6))
        await host.settled(6)

        log = host.instance(step_type).log
        assert log[0] == "setup" and log.count("setup") == 1
        assert sorted(log[1:]) == sorted(f"perform {n}" for n in range(6))
        assert host.results == {f"a-{n}": n for n in range(6)}

    run(step_type, scenario)


class FlakySetup(JobStep[Number]):
    """Its first setup raises, the next succeeds."""

    batch_wait = 0.01

    def __init__(self) -> None:
        self.setups = 0

    async def setup(self) -> None:
        self.setups += 1
        if self.setups == 1:
            raise ValueError("no model yet")

    async def perform(self, request: Number, context: StepContext) -> int:
        return request.value


class FlakyBatchSetup(FlakySetup):
    batch_size = 2

    async def perform_batch(self, requests: list[Number], context: BatchContext) -> list[int]:
        return [request.value for request in requests]


def test_setup__raising_fails_the_step_it_was_called_for_and_the_next_step_sets_up_again() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", 1, 2)
        await host.settled(2)

        failure = host.errors["a-1"]
        assert isinstance(failure, SetupError)
        assert "FlakySetup.setup failed: ValueError: no model yet" in str(failure)
        assert host.results == {"a-2": 2}
        assert host.instance(FlakySetup).setups == 2

    run(FlakySetup, scenario)


def test_setup__raising_fails_exactly_the_batch_it_was_called_for() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", 1, 2, 3)
        await host.settled(3)

        assert set(host.errors) == {"a-1", "a-2"}
        assert all(isinstance(e, SetupError) for e in host.errors.values())
        assert "FlakyBatchSetup.setup failed: ValueError: no model yet" in str(host.errors["a-1"])
        assert host.results == {"a-3": 3}
        assert host.instance(FlakyBatchSetup).setups == 2

    run(FlakyBatchSetup, scenario)


class HangingSetup(JobStep[Number]):
    """Its `setup` never returns."""

    def __init__(self) -> None:
        self.setting_up = asyncio.Event()

    async def setup(self) -> None:
        self.setting_up.set()
        await asyncio.Event().wait()

    async def perform(self, request: Number, context: StepContext) -> int:
        return request.value


def test_setup__a_stop_while_it_hangs_ends_the_jobs_queued_steps_stopped_at_once() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", 1, 2)
        host.add("b", 1)
        await host.instance(HangingSetup).setting_up.wait()

        assert host.lane.cancel("a") == 2
        assert [(job, step, result) for job, step, result, _ in host.finished] == [
            ("a", "a-1", None),
            ("a", "a-2", None),
        ]
        assert all(isinstance(e, asyncio.CancelledError) for e in host.errors.values())
        assert list(host.lane.queue.queued) == ["b"] and not host.lane.ready
        assert host.lane.cancel("b") == 1

    run(HangingSetup, scenario)


class Failing(JobStep[Number]):
    """A step fails when its value is positive, and succeeds otherwise. Each instance records
    its setups in `setups`, shared by the instances of the type (`instances` made)."""

    setups: ClassVar[list[int]]
    instances: ClassVar[int]

    def __init__(self) -> None:
        type(self).instances += 1
        self.number = type(self).instances

    def setup(self) -> None:
        type(self).setups.append(self.number)

    async def perform(self, request: Number, context: StepContext) -> StepResult:
        if request.value > 0:
            return StepResult.failed(f"no GPU for {request.value}")
        return StepResult.succeeded()


class FailingOnAPool(Failing):
    resources: ClassVar[dict[str, float] | None] = {}


class FailingBatches(Failing):
    """A pool's batched type whose batches raise while any request is positive."""

    resources: ClassVar[dict[str, float] | None] = {}
    batch_size = 2
    batch_wait = 0.0

    async def perform_batch(self, requests: list[Number], context: BatchContext) -> list[Any]:
        if any(request.value > 0 for request in requests):
            raise RuntimeError("CUDA error: an illegal memory access")
        return [StepResult.succeeded() for _ in requests]


def fresh(step_type: type[Failing]) -> type[Failing]:
    step_type.setups, step_type.instances = [], 0
    return step_type


def test_failures__three_in_a_row_set_a_new_instance_up_before_the_next_step() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", 1, 2, 3, -4)
        await host.settled(4)

        assert Failing.setups == [1, 2]  # the first instance, then a new one
        assert host.instance(Failing).number == 2 and host.lane.failures == 0
        assert host.replaced == 0

    run(fresh(Failing), scenario)


@pytest.mark.parametrize(("step_type", "replaced"), [(Failing, 0), (FailingOnAPool, 1)])
def test_failures__six_in_a_row_replace_a_pools_host_once_and_other_lanes_set_up_again(
    step_type: type[Failing], replaced: int
) -> None:
    async def scenario(host: Host) -> None:
        host.add("a", *range(1, 9))
        # A pool's lane, set up twice, asks for a new host and takes no more steps: they wait
        # for the host's end. Another lane sets a new instance up every third failure.
        await host.settled(6 if replaced else 8)

        assert host.replaced == replaced
        assert step_type.setups == ([1, 2] if replaced else [1, 2, 3])
        assert host.lane.waiting == (2 if replaced else 0)

    run(fresh(step_type), scenario)


def test_failures__a_success_in_between_starts_the_count_again() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", 1, 2, -3, 4, 5, -6, 7, 8)
        await host.settled(8)

        assert FailingOnAPool.setups == [1] and host.replaced == 0
        assert host.lane.failures == 2

    run(fresh(FailingOnAPool), scenario)


def test_failures__batches_that_raise_count_as_failures_of_a_pools_lane() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", *range(1, 15))  # 7 batches of 2, one at a time: the 7th waits
        await host.settled(12)
        assert host.lane.waiting == 2

        assert FailingBatches.setups == [1, 2] and host.replaced == 1
        assert all(isinstance(e, RuntimeError) for e in host.errors.values())

    run(fresh(FailingBatches), scenario)


def test_failures__a_failing_setup_counts_and_fails_one_batch_each_time() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", *range(1, 9))
        await host.settled(6)

        assert host.replaced == 1 and len(AlwaysFailingSetup.calls) == 6
        assert all(isinstance(e, SetupError) for e in host.errors.values())
        assert host.lane.waiting == 2

    AlwaysFailingSetup.calls = []
    run(AlwaysFailingSetup, scenario)


class AlwaysFailingSetup(JobStep[Number]):
    resources: ClassVar[dict[str, float] | None] = {}
    calls: ClassVar[list[int]]

    def setup(self) -> None:
        self.calls.append(1)
        raise OSError("no device")

    async def perform(self, request: Number, context: StepContext) -> int:
        return request.value


# Concurrency


class Gated(JobStep[Number]):
    """Performs wait for `release`; `most` is the most that ran at once."""

    concurrency = 2

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.now = 0
        self.most = 0

    async def perform(self, request: Number, context: StepContext) -> int:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await self.release.wait()
        finally:
            self.now -= 1
        return request.value


def test_concurrency__at_most_that_many_performs_run_at_once() -> None:
    async def scenario(host: Host) -> None:
        gated = host.instance(Gated)
        host.add("a", *range(5))
        await eventually(lambda: gated.now == 2, what="two performs running")
        await asyncio.sleep(0.05)  # room for a third, were it let through

        assert (gated.now, host.lane.busy, host.lane.waiting) == (2, 2, 3)
        gated.release.set()
        await host.settled(5)
        assert gated.most == 2
        assert host.results == {f"a-{n}": n for n in range(5)}

    run(Gated, scenario)


# Batches


class Batches(JobStep[Number]):
    """Records each batch: its requests' values and its context's job and steps' jobs."""

    batch_size = 4
    batch_wait = 0.05

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.jobs: list[tuple[str, set[str]]] = []

    async def perform_batch(self, requests: list[Number], context: BatchContext) -> list[int]:
        self.batches.append([request.value for request in requests])
        self.jobs.append((context.job_id, {step.job_id for step in context.steps}))
        await asyncio.sleep(0)
        return [request.value * 10 for request in requests]


class SlowBatches(Batches):
    batch_wait = 0.2


def test_batches__ten_steps_at_once_make_batches_of_four_four_and_two() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", *range(10))
        await host.settled(10)

        assert [len(batch) for batch in host.instance(Batches).batches] == [4, 4, 2]

    run(Batches, scenario)


def test_batches__requests_come_in_order_and_each_step_gets_its_own_result() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", *range(10))
        await host.settled(10)

        assert host.instance(Batches).batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        assert host.results == {f"a-{n}": n * 10 for n in range(10)}

    run(Batches, scenario)


def test_batches__a_batch_never_mixes_jobs() -> None:
    async def scenario(host: Host) -> None:
        for n in range(5):  # a's steps 0..4 and b's 100..102, one of each in turn
            host.add("a", n)
            if n < 3:
                host.add("b", 100 + n)
        await host.settled(8)

        batches = host.instance(Batches)
        for values, (job_id, step_jobs) in zip(batches.batches, batches.jobs, strict=True):
            assert step_jobs == {job_id}
            assert {"a" if value < 100 else "b" for value in values} == {job_id}
        assert sorted(v for batch in batches.batches for v in batch) == [
            0,
            1,
            2,
            3,
            4,
            100,
            101,
            102,
        ]
        assert host.results == {
            **{f"a-{n}": n * 10 for n in range(5)},
            **{f"b-{n}": n * 10 for n in range(100, 103)},
        }

    run(Batches, scenario)


def test_batch_wait__a_lone_step_waits_for_its_batch_to_fill_before_it_runs() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", 7)
        await asyncio.sleep(0.05)

        assert host.instance(SlowBatches).batches == [] and host.finished == []
        assert host.lane.waiting == 1
        await eventually(lambda: bool(host.finished), within=2.0, what="the lone step's batch")
        await host.settled(1)
        assert host.instance(SlowBatches).batches == [[7]]
        assert host.results == {"a-7": 70}

    run(SlowBatches, scenario)


class SlowerBatches(Batches):
    batch_wait = 2.0


def test_batch_wait__a_full_batch_of_one_job_runs_while_another_jobs_fills() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", 1)
        host.add("b", 100, 101, 102, 103)
        await eventually(lambda: len(host.finished) == 4, within=1.0, what="b's full batch")

        assert host.instance(SlowerBatches).batches == [[100, 101, 102, 103]]
        assert host.lane.waiting == 1  # a's lone step still waits for its batch to fill
        await host.settled(5)

    run(SlowerBatches, scenario)


def test_cancel__another_jobs_full_batch_runs_at_once() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", 1)
        host.add("b", 100)
        await asyncio.sleep(0.02)
        for n in range(101, 104):
            host.add("b", n)  # b's batch is full, behind a's (a has waited longest)
        host.lane.cancel("a")
        await eventually(lambda: len(host.finished) == 5, within=1.0, what="b's batch")

        assert host.instance(SlowerBatches).batches == [[100, 101, 102, 103]]

    run(SlowerBatches, scenario)


class RaisingBatch(Batches):
    async def perform_batch(self, requests: list[Number], context: BatchContext) -> list[int]:
        raise ValueError("the batch went wrong")


class ShortBatch(Batches):
    async def perform_batch(self, requests: list[Number], context: BatchContext) -> list[int]:
        return [request.value for request in requests[:-1]]


class NoListBatch(Batches):
    async def perform_batch(  # type: ignore[override]
        self, requests: list[Number], context: BatchContext
    ) -> dict[int, int]:
        return {request.value: request.value for request in requests}


def test_perform_batch__raising_fails_every_step_of_the_batch_with_its_error() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", *range(4))
        await host.settled(4)

        assert host.results == {}
        (error,) = set(host.errors.values())
        assert isinstance(error, ValueError) and str(error) == "the batch went wrong"
        assert sorted(host.errors) == [f"a-{n}" for n in range(4)]

    run(RaisingBatch, scenario)


def test_perform_batch__the_wrong_number_of_results_fails_each_step_with_a_type_error() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", *range(4))
        await host.settled(4)

        assert host.results == {} and len(host.errors) == 4
        for error in host.errors.values():
            assert isinstance(error, TypeError)
            assert "returned 3 results for 4 requests" in str(error)

    run(ShortBatch, scenario)


def test_perform_batch__results_that_are_no_list_fail_each_step_naming_their_type() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", *range(4))
        await host.settled(4)

        assert host.results == {} and len(host.errors) == 4
        for error in host.errors.values():
            assert isinstance(error, TypeError)
            assert "perform_batch returned dict for 4 requests" in str(error)

    run(NoListBatch, scenario)


class SyncBatch(Batches):
    def __init__(self) -> None:
        super().__init__()
        self.threads: list[threading.Thread] = []

    def perform_batch(self, requests: list[Number], context: BatchContext) -> list[int]:  # type: ignore[override]
        self.threads.append(threading.current_thread())
        return [request.value for request in requests]


def test_perform_batch__a_sync_one_runs_in_a_worker_thread() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", *range(4))
        await host.settled(4)

        (thread,) = host.instance(SyncBatch).threads
        assert thread is not threading.main_thread() and thread is not threading.current_thread()
        assert thread.name.startswith(THREADS)
        assert host.results == {f"a-{n}": n for n in range(4)}

    run(SyncBatch, scenario)


# Cancel


class HeldBatches(JobStep[Number]):
    """Batches of two that wait for `release`, each one's context kept."""

    batch_size = 2
    batch_wait = 0.01
    concurrency = 2

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.contexts: list[BatchContext] = []

    async def perform_batch(self, requests: list[Number], context: BatchContext) -> list[int]:
        self.contexts.append(context)
        await self.release.wait()
        return [request.value for request in requests]


def test_cancel__the_jobs_waiting_steps_end_cancelled_at_once_and_other_jobs_stay() -> None:
    async def scenario(host: Host) -> None:
        held = host.instance(HeldBatches)
        host.add("a", 1, 2)
        host.add("b", 1, 2)
        await eventually(lambda: len(held.contexts) == 2, what="both lanes' batches running")
        host.add("a", 3, 4)
        host.add("b", 3)

        assert host.lane.cancel("a") == 2
        assert [(job, step, result) for job, step, result, _ in host.finished] == [
            ("a", "a-3", None),
            ("a", "a-4", None),
        ]
        assert all(isinstance(e, asyncio.CancelledError) for e in host.errors.values())
        assert list(host.lane.queue.queued) == ["b"] and host.lane.waiting == 1

        held.release.set()
        await host.settled(7)
        assert host.results == {"a-1": 1, "a-2": 2, "b-1": 1, "b-2": 2, "b-3": 3}

    run(HeldBatches, scenario)


def test_cancel__a_running_batch_of_the_job_is_told_and_others_are_not() -> None:
    async def scenario(host: Host) -> None:
        held = host.instance(HeldBatches)
        host.add("a", 1, 2)
        host.add("b", 1, 2)
        await eventually(lambda: len(held.contexts) == 2, what="both lanes' batches running")

        assert host.lane.cancel("a") == 0
        cancelled = {context.job_id: context.is_cancelled for context in held.contexts}
        assert cancelled == {"a": True, "b": False}
        held.release.set()
        await host.settled(4)

    run(HeldBatches, scenario)


# What a perform raises


class InterruptedAtOnce(JobStep[Number]):
    """Step 1 raises `KeyboardInterrupt` in its first slice; the others return their value."""

    async def perform(self, request: Number, context: StepContext) -> int:
        if request.value == 1:
            raise KeyboardInterrupt("ctrl-c")
        return request.value


class InterruptedUnderItsTask(JobStep[Number]):
    """Step 1 raises `KeyboardInterrupt` after an await: under its task."""

    async def perform(self, request: Number, context: StepContext) -> int:
        await asyncio.sleep(0)
        if request.value == 1:
            raise KeyboardInterrupt("ctrl-c")
        return request.value


class InterruptedInItsThread(JobStep[Number]):
    """A sync perform: step 1 raises `KeyboardInterrupt` in the worker thread."""

    def perform(self, request: Number, context: StepContext) -> int:
        if request.value == 1:
            raise KeyboardInterrupt("ctrl-c")
        return request.value


@pytest.mark.parametrize(
    "step_type", [InterruptedAtOnce, InterruptedUnderItsTask, InterruptedInItsThread]
)
def test_perform__keyboard_interrupt_is_its_steps_error_and_the_loop_lives_on(
    step_type: type[JobStep[Any]],
) -> None:
    async def scenario(host: Host) -> None:
        host.add("a", 1, 2)
        await host.settled(2)
        host.add("a", 3)
        await host.settled(3)

        error = host.errors["a-1"]
        assert isinstance(error, KeyboardInterrupt) and str(error) == "ctrl-c"
        assert host.results == {"a-2": 2, "a-3": 3}

    run(step_type, scenario)


# How many at once


class PlainSetup(JobStep[Number]):
    async def setup(self) -> None: ...


class OwnConcurrency(PlainSetup):
    concurrency = 2


class InheritsConcurrency(OwnConcurrency):
    pass


class PoolSetup(PlainSetup):
    resources: ClassVar[dict[str, float] | None] = {}


@pytest.mark.parametrize(
    ("step_type", "expected"),
    [(PlainSetup, 4096), (OwnConcurrency, 2), (InheritsConcurrency, 2), (PoolSetup, 1)],
)
def test_concurrency__a_shared_hosts_type_that_sets_none_runs_as_many_as_the_host_capacity(
    step_type: type[JobStep[Any]], expected: int
) -> None:
    assert lane_concurrency(step_type, 4096) == expected
    assert lane_concurrency(step_type, None) == step_type.concurrency


# The order of waiting steps


class Ordered(JobStep[Number]):
    """One perform at once, recording each step's job in the order they run."""

    concurrency = 1

    def __init__(self) -> None:
        self.order: list[str] = []

    async def setup(self) -> None:
        await asyncio.sleep(0)  # every step is queued before the first runs

    async def perform(self, request: Number, context: StepContext) -> int:
        self.order.append(context.job_id)
        await asyncio.sleep(0)
        return request.value


def test_order__steps_of_the_highest_priority_go_first() -> None:
    async def scenario(host: Host) -> None:
        host.add("low", *range(3))
        host.add("high", *range(3))
        await host.settled(6)

        assert host.instance(Ordered).order == ["high"] * 3 + ["low"] * 3

    run(Ordered, scenario, shares={"low": Share(priority=5), "high": Share(priority=1)})


def test_order__fairness_keys_share_by_weight_and_first_come_within_a_key() -> None:
    async def scenario(host: Host) -> None:
        host.add("a1", *range(20))
        host.add("a2", *range(20))
        host.add("b", *range(20))
        await host.settled(60)

        first = host.instance(Ordered).order[:24]
        assert first.count("a1") == 18 and first.count("b") == 6  # 3:1, a2 after a1
        assert "a2" not in first

    shares = {"a1": Share(3, "A", 3.0), "a2": Share(3, "A", 3.0), "b": Share(3, "B", 1.0)}
    run(Ordered, scenario, shares=shares)


class RecordingThreads(FairThreads):
    def __init__(self) -> None:
        super().__init__(2, prefix=THREADS)
        self.shares: list[Share] = []

    def run(self, share: Share, call: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        self.shares.append(share)
        return super().run(share, call, *args)


def test_order__a_sync_perform_waits_for_a_thread_with_its_jobs_share() -> None:
    threads = RecordingThreads()

    async def scenario(host: Host) -> None:
        host.add("a", 1, 2)
        await host.settled(2)

        assert threads.shares[-1:] == [Share(1, "tenant", 2.0)]  # setup's first: no job's

    run(SyncBatch, scenario, threads=lambda: threads, shares={"a": Share(1, "tenant", 2.0)})


# Limits


class PerKey(JobStep[Number]):
    """One step of a key at once over the cluster, its key `hot` below 4 and its own above;
    performs wait for `release`, recording the most of each key that ran at once."""

    max_concurrent_per_key = 1

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.now: Counter[str] = Counter()
        self.most: Counter[str] = Counter()

    def concurrency_key(self, request: Number) -> str | None:
        if request.value < 0:
            raise ValueError("no customer")
        return "hot" if request.value < 4 else f"k{request.value}"

    async def setup(self) -> None: ...

    async def perform(self, request: Number, context: StepContext) -> int:
        key = self.concurrency_key(request) or ""
        self.now[key] += 1
        self.most[key] = max(self.most[key], self.now[key])
        try:
            await self.release.wait()
        finally:
            self.now[key] -= 1
        return request.value


def gate(host: Host, core: LimitCore) -> Gate:
    """A real gate over a limiter in this process, set on the host's lane."""
    spec = TypeLimits.of(host.lane.step_type)

    async def ask(wants: dict[Want, int], held: dict[Key, int]) -> tuple[dict[Want, int], float]:
        return core.take("host", Holding("T", spec, {}, held, wants), time.monotonic())

    async def report(held: dict[Key, int], wants: dict[Want, int]) -> None:
        core.report("host", Holding("T", spec, {}, held, wants), time.monotonic())

    spawn = functools.partial(host.spawn, job_id=None)
    host.lane.gate = Gate("T", ask, report, host.lane.pump, spawn)
    return host.lane.gate


def test_limits__a_key_at_its_limit_holds_up_no_other_keys_steps() -> None:
    core = LimitCore(time.monotonic())

    async def scenario(host: Host) -> None:
        per_key = host.instance(PerKey)
        gate(host, core)
        host.add("a", 0, 1, 4, 2, 5, 3)
        await eventually(lambda: sum(per_key.now.values()) == 3, what="a step of each key")
        await asyncio.sleep(0.1)  # room for more, were they let through

        assert per_key.now == {"hot": 1, "k4": 1, "k5": 1} and host.lane.waiting == 3
        per_key.release.set()
        await host.settled(6)
        assert max(per_key.most.values()) == 1
        assert host.results == {f"a-{n}": n for n in range(6)}

    run(PerKey, scenario, capacity=4096)


def test_limits__a_concurrency_key_that_raises_fails_its_step_only() -> None:
    async def scenario(host: Host) -> None:
        with pytest.raises(ValueError, match="no customer"):
            host.add("a", -1)
        host.add("a", 4)
        host.instance(PerKey).release.set()
        await host.settled(1)

    run(PerKey, scenario)


def test_limits__a_stop_gives_back_the_permits_of_its_steps_that_had_one() -> None:
    core = LimitCore(time.monotonic())

    async def scenario(host: Host) -> None:
        per_key = host.instance(PerKey)
        the_gate = gate(host, core)
        host.add("a", 4, 5, 0)
        host.add("b", 1)
        await eventually(lambda: sum(per_key.now.values()) == 3, what="three running")

        assert host.lane.cancel("b") == 1
        per_key.release.set()
        await host.settled(4)
        await eventually(lambda: not the_gate.held, what="every permit back")

    run(PerKey, scenario, capacity=4096)


# Blocking the event loop


class BlockingSetup(JobStep[Number]):
    def __init__(self) -> None:
        self.setups = 0

    async def setup(self) -> None:
        self.setups += 1
        time.sleep(0.15)  # noqa: ASYNC251 (loads a model without awaiting)

    async def perform(self, request: Number, context: StepContext) -> int:
        return request.value


def test_blocking__a_setup_that_blocks_the_loop_fails_its_steps_and_keeps_its_instance() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", 1)
        await host.settled(1)
        host.add("a", 2)
        await host.settled(2)

        error = host.errors["a-1"]
        assert isinstance(error, SetupError)
        assert "BlockingSetup.setup blocked the event loop for 0.1" in str(error)
        assert "(limit 0.1 s): await instead of blocking, or make setup sync" in str(error)
        assert host.results == {"a-2": 2} and host.instance(BlockingSetup).setups == 1

    run(BlockingSetup, scenario, block_limit=0.1)


def test_blocking__a_setup_that_blocks_the_loop_is_not_caught_when_the_limit_is_off() -> None:
    async def scenario(host: Host) -> None:
        host.add("a", 1)
        await host.settled(1)

        assert host.results == {"a-1": 1}

    run(BlockingSetup, scenario, block_limit=0.0)


class BlockingBatch(Batches):
    batch_wait = 0.0

    async def perform_batch(self, requests: list[Number], context: BatchContext) -> list[int]:
        time.sleep(0.15)  # noqa: ASYNC251 (blocks the loop)
        if requests[0].value < 0:
            raise ValueError("and then it raised")
        return [request.value for request in requests]


@pytest.mark.parametrize("first", [1, -1], ids=["returns", "raises"])
def test_blocking__a_batch_that_blocks_the_loop_fails_its_steps_as_a_perform_does(
    first: int,
) -> None:
    options = JobsOptions(step_event_loop_block_limit=0.1)

    async def scenario(host: Host) -> None:
        host.add("a", first, 2)
        await host.settled(2)

        for step_id in ("a-2", f"a-{first}"):
            start = StepStart(step_id, "t", 0, 1, "{}")
            result = host.results.get(step_id)
            error = host.errors.get(step_id)
            outcome = outcome_of(start, result, error, False, host.drivers[step_id], options)
            assert outcome.status is StepStatus.FAILED
            assert "perform blocked the event loop for 0.1" in (outcome.message or "")

    run(BlockingBatch, scenario)
