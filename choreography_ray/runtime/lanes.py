"""A step type on one host, run through one instance of it (`Lane`): set up once before its
first step, at most `concurrency` performs (or batches) at once (a type of the shared hosts
that sets no `concurrency` of its own: as many as the host's capacity), and a batched type's
steps gathered per job into batches. Used by a pool's types and by any type that overrides
`setup` or `perform_batch`, or is limited (`core.placement.uses_lane`); other types get an
instance per step.

Waiting steps go in `core.sharing` order (`core.lane_queue`); a batch holds one job's steps. A
limited type's steps first wait for a permit (`core.gate.Gate`): the lane asks for as many as
it could start now and in one round more, and a step whose key is at its limit holds up no
other key's.

A lane sets its instance up before any step leaves its queue: `setup` runs as a task of its
own while the steps wait queued, so a stop of their job ends them at once (STOPPED), even while
`setup` hangs. A `setup` that raises fails one batch's worth of steps (those the lane would run
next) with `SetupError`, and is called again for the next steps. A coroutine `setup` that
blocks the event loop longer than `step_event_loop_block_limit` fails them too (its instance is
kept), as a blocking perform or batch fails its steps (`runtime.outcomes`).

A lane whose performs (or batches) fail `FAILURES_BEFORE_SETUP` times in a row makes a new
instance and sets it up again before its next step (every third failure in a row); a pool's lane
whose failures in a row reach `FAILURES_BEFORE_REPLACE` asks its host to be replaced (`Replace`)
and takes no more steps (they start again elsewhere once the host has ended). A perform fails
when it raises (not after a stop of its job) or returns a failed `StepResult`; a batch, when it
raises, returns the wrong number of results, or every result is a failed `StepResult`; a
`setup` that raises counts too. Any success starts the count again; results that are no
`StepResult` (the type's own bug) are not counted.

No Ray here: the step host gives a lane its thread pool, the call that ends a step (`Finish`),
the one that runs a named task (`Spawn`) and, for a pool's type, the one that replaces the host
(`Replace`); the lane's rules are tested without a cluster.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from pydantic import BaseModel

from choreography_ray.core.gate import Gate
from choreography_ray.core.lane_queue import Item, LaneQueue
from choreography_ray.core.messages import StepStart, describe
from choreography_ray.core.placement import is_batched
from choreography_ray.core.sharing import Share
from choreography_ray.logs import get_logger
from choreography_ray.runtime.driver import PerformExit, SliceDriver
from choreography_ray.runtime.threads import FairThreads
from choreography_ray.step import BatchContext, JobStep, StepContext, StepResult

log = get_logger(__name__)

#: Performs (or batches) of a lane failing in a row before it sets a new instance up: a few,
#: so one bad input does not reload a model, while a broken instance (a GPU context gone bad
#: after `setup`) stops failing every step it gets.
FAILURES_BEFORE_SETUP = 3
#: Failures in a row, counted from the last success, before a pool's lane asks its host to be
#: replaced: the 3 after the new instance's `setup` failed too, so the fault is the process or
#: its device, and a new process (another incarnation: its steps start again elsewhere) is next.
FAILURES_BEFORE_REPLACE = 6
#: Rounds of performs (`concurrency` of them) a limited lane asks permits for beyond those it
#: could start now: a perform that ends finds the next one's permits in hand, not a round trip
#: to the limiter away.
ROUNDS_AHEAD = 1


class Finish(Protocol):
    def __call__(
        self,
        job_id: str,
        step: StepStart,
        result: Any,
        error: BaseException | None,
        driver: SliceDriver | None,
    ) -> None: ...


Spawn = Callable[[Coroutine[Any, Any, None], str, str | None], Any]
#: Ends the host's process so Ray starts it again (a pool's lane only).
Replace = Callable[[], None]


class SetupError(Exception):
    """A step type's `setup` raised: the steps it was called for fail with this."""


class Lane:
    def __init__(
        self,
        step_type: type[JobStep[Any]],
        threads: FairThreads,
        share_of: Callable[[str], Share],
        finish: Finish,
        spawn: Spawn,
        replace: Replace | None = None,
        capacity: int | None = None,
        block_limit: Callable[[str], float] = lambda _job_id: 0.0,
    ) -> None:
        """`capacity`: the steps the host runs at once, the lane's `concurrency` for a type of
        the shared hosts that sets none itself; `block_limit`: a job's
        `step_event_loop_block_limit` in seconds (0: off)."""
        self.step_type = step_type
        self.instance = step_type()
        self.batched = is_batched(step_type)
        self.size = step_type.batch_size if self.batched else 1
        self.concurrency = lane_concurrency(step_type, capacity)
        self._keyed = step_type.max_concurrent_per_key is not None
        #: Performs (or batches) running now, and their steps.
        self.busy = 0
        self.performing = 0
        #: The steps waiting, in the order they start (`core.lane_queue`).
        wait = step_type.batch_wait if self.batched else 0.0
        self.queue = LaneQueue(self.size, wait, share_of)
        #: The contexts of the batches running now (a stop cancels them).
        self.batches: set[BatchContext] = set()
        #: The instance is set up: steps leave the queue only then.
        self.ready = False
        #: The task calling `setup` now, if any.
        self._setting_up: asyncio.Future[None] | None = None
        #: A new instance is due before the next `setup` (its performs kept failing).
        self._stale = False
        #: Performs (or batches) failed in a row, and the instance's generation: a perform
        #: of an instance since replaced is not counted.
        self.failures = 0
        self._generation = 0
        self._replace = replace
        self._replaced = False
        #: The type's permits of its cluster-wide limits on this host (`core.gate`), if any.
        self.gate: Gate | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._pump_soon = False
        self._threads = threads
        #: A job's share of the lane and of the threads (`core.sharing`).
        self._share_of = share_of
        self._block_limit = block_limit
        self._finish = finish
        self._spawn = spawn
        self._name = step_type.__qualname__

    def add(self, job_id: str, start: StepStart, request: BaseModel, context: StepContext) -> None:
        """Queues a step; raises what its type's `concurrency_key` raised (the step fails)."""
        key = self._key(request) if self._keyed else None
        item = Item(job_id, start, request, context, time.monotonic(), key)
        if self.gate is None:
            self.queue.stage(item)
            self.pump()
            return
        self.queue.hold_back(item)
        if not self._pump_soon:  # once for a start batch's steps, not once a step
            self._pump_soon = True
            asyncio.get_running_loop().call_soon(self._pumped_soon)

    @property
    def waiting(self) -> int:
        return len(self.queue)

    def pump(self) -> None:
        """Starts performs (or batches) while fewer than `concurrency` run, in `core.sharing`
        order, and tells the gate what waits for a permit. A job's batch that is not full waits
        until its oldest step has waited `batch_wait`. No step leaves the queue before the
        instance is set up, nor after the lane asked for its host to be replaced: its steps wait
        for the host's end, and start again elsewhere."""
        if self._replaced:
            return
        if not self.ready:
            if self.waiting and self._setting_up is None:
                self._setting_up = self._spawn(self._set_up(), f"setup {self._name}", None)
            return
        if self.gate is not None:
            self.queue.admit(self.gate)
        now = time.monotonic()
        while self.busy < self.concurrency and (job_id := self.queue.next_job(now)) is not None:
            items = self.queue.take(job_id, self.size)
            self.busy += 1
            self.performing += len(items)
            kind = "batch" if self.batched else "step"
            self._spawn(self._run(items), f"{kind} {self._name} {job_id}", job_id)
        if self.gate is not None:
            # What could start now, and in one round more (`ROUNDS_AHEAD`).
            rounds = (1 + ROUNDS_AHEAD) * self.concurrency - self.busy
            self.gate.want(self.queue.wants(rounds * self.size - self.queue.staged))
        due = self.queue.due()
        if self.busy < self.concurrency and due is not None and self._timer is None:
            # Armed once: later steps only make the oldest batch's wait end later.
            self._timer = asyncio.get_running_loop().call_later(due - time.monotonic(), self._due)

    def _due(self) -> None:
        self._timer = None
        self.pump()

    def _pumped_soon(self) -> None:
        self._pump_soon = False
        self.pump()

    def _key(self, request: BaseModel) -> str | None:
        key = self.instance.concurrency_key(request)
        if key is not None and not isinstance(key, str):
            raise TypeError(
                f"{self._name}.concurrency_key returned {type(key).__name__}, not a str or None"
            )
        return key

    def cancel(self, job_id: str) -> int:
        """A stop of the job: its waiting steps end stopped (their contexts are cancelled
        already), and its running batches are told. Returns how many steps were waiting."""
        for context in self.batches:
            if context.job_id == job_id:
                context.cancel()
        staged, held = self.queue.cancel(job_id)
        self._give_back(staged)
        items = staged + held
        for item in items:
            self._finish(job_id, item.start, None, asyncio.CancelledError(), None)
        self.pump()  # the other jobs' batches need not wait for this one's
        return len(items)

    def _give_back(self, items: list[Item]) -> None:
        """The permits of steps that took one go back (they ended, or never started)."""
        if self.gate is not None:
            for key, n in Counter(item.key for item in items).items():
                self.gate.done(key, n)

    async def _run(self, items: list[Item]) -> None:
        generation = self._generation
        try:
            failed = await (self._perform_batch(items) if self.batched else self._perform(items[0]))
            if failed is not None and generation == self._generation:
                self._count(failed)
        finally:
            self.busy -= 1
            self.performing -= len(items)
            self._give_back(items)
            self.pump()

    async def _set_up(self) -> None:
        """Sets the instance up (a new one first when its performs kept failing); when that
        raises, or blocks the event loop too long, the steps the lane would run next fail with
        its error, and the next steps call it again (not after blocking: the instance is set
        up). The steps wait queued meanwhile, where a stop reaches them."""
        driver: SliceDriver | None = None
        try:
            if self._stale:
                self.instance = self.step_type()
                self._stale = False
            _, error, driver = await self._call(Share(), self.instance.setup)
        except BaseException as raised:  # the new instance raised
            error = raised
        finally:
            self._setting_up = None
        task = asyncio.current_task()
        if isinstance(error, asyncio.CancelledError) and task and task.cancelling():
            raise error  # the host is going away: no step failed
        failure: SetupError | None = None
        if error is not None:
            failure = SetupError(f"{self._name}.setup failed: {describe(_original(error))}")
        elif driver is not None and (job_id := self.queue.next_waiting()) is not None:
            limit = self._block_limit(job_id)
            if 0 < limit < driver.longest_slice:
                failure = SetupError(
                    f"{self._name}.setup blocked the event loop for {driver.longest_slice:.2f} s "
                    f"(limit {limit:g} s): await instead of blocking, or make setup sync"
                )
        if failure is not None:
            staged, held = self.queue.take_next(time.monotonic())
            self._give_back(staged)
            items = staged + held
            for item in items:
                self._finish(item.job_id, item.start, None, failure, None)
            if items:
                self._count(True)
        self.ready = error is None
        self.pump()

    def _count(self, failed: bool) -> None:
        """Counts a perform (or batch, or `setup`) that failed or succeeded: after
        `FAILURES_BEFORE_SETUP` failures in a row a new instance is set up, and a pool's lane
        after `FAILURES_BEFORE_REPLACE` asks for its host to be replaced."""
        if not failed:
            self.failures = 0
            return
        self.failures += 1
        if self._replace is not None and self.failures >= FAILURES_BEFORE_REPLACE:
            if not self._replaced:
                self._replaced = True
                log.warning("%s: %d performs failed in a row, after a new setup too: replacing "
                            "this host", self._name, self.failures)  # fmt: skip
                self._replace()
        elif self.failures % FAILURES_BEFORE_SETUP == 0:
            log.warning("%s: %d performs failed in a row: setting a new instance up",
                        self._name, self.failures)  # fmt: skip
            self.ready, self._stale = False, True
            self._generation += 1

    async def _perform(self, item: Item) -> bool | None:
        """Performs one step: whether it failed (None: not counted, `_failed`)."""
        share = self._share_of(item.job_id)
        result, error, driver = await self._call(
            share, self.instance.perform, item.request, item.context
        )
        if error is not None:
            self._finish(item.job_id, item.start, None, _original(error), driver)
            return None if item.context.is_cancelled else True
        self._finish(item.job_id, item.start, result, None, driver)
        return _failed([result])

    async def _perform_batch(self, items: list[Item]) -> bool | None:
        """Performs a batch: whether it failed (None: not counted, `_failed`)."""
        context = BatchContext([item.context for item in items])
        if any(item.context.is_cancelled for item in items):
            context.cancel()
        self.batches.add(context)
        try:
            requests = [item.request for item in items]
            share = self._share_of(context.job_id)
            results, error, driver = await self._call(
                share, self.instance.perform_batch, requests, context
            )
        finally:
            self.batches.discard(context)
        if error is not None:
            self._end(items, _original(error), driver)
            return None if context.is_cancelled else True
        if not isinstance(results, list | tuple) or len(results) != len(items):
            got = (
                f"{len(results)} results"
                if isinstance(results, list | tuple)
                else (type(results).__name__)
            )
            wrong = TypeError(f"perform_batch returned {got} for {len(items)} requests")
            self._end(items, wrong, driver)
            return True
        for item, result in zip(items, results, strict=True):
            self._finish(item.job_id, item.start, result, None, driver)
        return _failed(results)

    def _end(self, items: list[Item], error: BaseException, driver: SliceDriver | None) -> None:
        for item in items:
            self._finish(item.job_id, item.start, None, error, driver)

    async def _call(
        self, share: Share, method: Callable[..., Any], *args: Any
    ) -> tuple[Any, BaseException | None, SliceDriver | None]:
        """Runs a method of the instance: a coroutine function slice by slice on this loop (its
        slices timed by the driver, so one that blocked the loop is found out even when it
        raised), else in the thread pool in its job's turn (`share`). Returns (result, error,
        driver): whatever the method raised is its steps' error, `KeyboardInterrupt` and
        `SystemExit` as `PerformExit`, never into the event loop."""
        driver: SliceDriver | None = None
        try:
            if inspect.iscoroutinefunction(method):
                driver = SliceDriver(method(*args))
                try:
                    done, out = driver.step()
                except (KeyboardInterrupt, SystemExit) as exit_:
                    raise PerformExit(exit_) from exit_
                return (out if done else await driver.finish(out)), None, driver
            call = functools.partial(_guarded, method, *args)
            return await self._threads.run(share, call), None, None
        except BaseException as error:
            return None, error, driver


def lane_concurrency(step_type: type[JobStep[Any]], capacity: int | None) -> int:
    """The performs (or batches) a lane runs at once: its type's `concurrency`, or, for a type
    of the shared hosts that sets none itself (nor a base of it below `JobStep`), the host's
    `capacity`."""
    if capacity is None or step_type.resources is not None:
        return step_type.concurrency
    own = any(
        "concurrency" in vars(base)
        for base in step_type.__mro__[: step_type.__mro__.index(JobStep)]
    )
    return step_type.concurrency if own else capacity


def _guarded(method: Callable[..., Any], *args: Any) -> Any:
    try:
        return method(*args)
    except (KeyboardInterrupt, SystemExit) as exit_:
        raise PerformExit(exit_) from exit_


def _failed(results: Sequence[Any]) -> bool | None:
    """Whether performs that returned `results` failed: every result a failed `StepResult`.
    Any success is not; results that are no `StepResult` (the type's own bug, which no new
    instance mends) are not counted (None)."""
    if any(isinstance(r, StepResult) and r.success for r in results):
        return False
    if all(isinstance(r, StepResult) for r in results):
        return True
    return None


def _original(error: BaseException) -> BaseException:
    return error.error if isinstance(error, PerformExit) else error
