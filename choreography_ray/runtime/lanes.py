"""A step type on one host, run through one instance of it (`Lane`): set up once before its
first step, at most `concurrency` performs (or batches) at once, and a batched type's steps
gathered per job into batches. Used by a pool's types and by any type that overrides `setup` or
`perform_batch` (`core.placement.uses_lane`); other types get an instance per step.

No Ray here: the step host gives a lane its thread pool, the call that ends a step (`Finish`)
and the one that runs a named task (`Spawn`), and the lane's rules are tested without a cluster.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, NamedTuple, Protocol

from pydantic import BaseModel

from choreography_ray.core.limits import Gate
from choreography_ray.core.messages import StepStart, describe
from choreography_ray.core.placement import is_batched
from choreography_ray.runtime.driver import PerformExit, SliceDriver
from choreography_ray.step import BatchContext, JobStep, StepContext


class Item(NamedTuple):
    """A step waiting in a lane, since `arrived` (monotonic seconds)."""

    job_id: str
    start: StepStart
    request: BaseModel
    context: StepContext
    arrived: float


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


class SetupError(Exception):
    """A step type's `setup` raised: the steps it was called for fail with this."""


class Lane:
    def __init__(
        self, step_type: type[JobStep[Any]], pool: Executor, finish: Finish, spawn: Spawn
    ) -> None:
        self.step_type = step_type
        self.instance = step_type()
        self.batched = is_batched(step_type)
        self.size = step_type.batch_size if self.batched else 1
        self._wait = step_type.batch_wait if self.batched else 0.0
        self.concurrency = step_type.concurrency
        #: Performs (or batches) running now, and their steps.
        self.busy = 0
        self.performing = 0
        #: Per job, its steps waiting; jobs take turns.
        self.queued: OrderedDict[str, deque[Item]] = OrderedDict()
        #: The contexts of the batches running now (a stop cancels them).
        self.batches: set[BatchContext] = set()
        self.ready = False
        #: The type's share of its cluster-wide limits on this host (`core.limits`), if any.
        self.gate: Gate | None = None
        self._setting_up = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._pool = pool
        self._finish = finish
        self._spawn = spawn
        self._name = step_type.__qualname__

    def add(self, job_id: str, start: StepStart, request: BaseModel, context: StepContext) -> None:
        queue = self.queued.setdefault(job_id, deque())
        queue.append(Item(job_id, start, request, context, time.monotonic()))
        if self.busy < self.concurrency:
            self.pump()

    @property
    def waiting(self) -> int:
        return sum(map(len, self.queued.values()))

    def pump(self) -> None:
        """Starts performs (or batches) while fewer than `concurrency` run, jobs in turn. A
        job's batch that is not full waits until its oldest step has waited `batch_wait`."""
        while self.busy < self.concurrency and (job_id := self._next_job()) is not None:
            queue = self.queued[job_id]
            take = min(self.size, len(queue))
            if self.gate is not None and not (take := self.gate.take(take)):
                return  # the gate pumps again once the limiter grants more
            items = [queue.popleft() for _ in range(take)]
            if queue:
                self.queued.move_to_end(job_id)  # the next job's turn
            else:
                del self.queued[job_id]
            self.busy += 1
            self.performing += len(items)
            kind = "batch" if self.batched else "step"
            self._spawn(self._run(items), f"{kind} {self._name} {job_id}", job_id)
        if self.gate is not None and not self.queued:
            self.gate.idle()
        if self.busy < self.concurrency and self.queued and self._timer is None:
            # Armed once: later steps only make the oldest batch's wait end later.
            due = min(queue[0].arrived for queue in self.queued.values()) + self._wait
            self._timer = asyncio.get_running_loop().call_later(due - time.monotonic(), self._due)

    def _due(self) -> None:
        self._timer = None
        self.pump()

    def _next_job(self) -> str | None:
        """The first job, in turn, with a full batch or one that waited long enough."""
        now = time.monotonic()
        for job_id, queue in self.queued.items():
            if len(queue) >= self.size or queue[0].arrived + self._wait <= now:
                return job_id
        return None

    def cancel(self, job_id: str) -> int:
        """A stop of the job: its waiting steps end stopped (their contexts are cancelled
        already), and its running batches are told. Returns how many steps were waiting."""
        for context in self.batches:
            if context.job_id == job_id:
                context.cancel()
        queue = self.queued.pop(job_id, ())
        for item in queue:
            self._finish(job_id, item.start, None, asyncio.CancelledError(), None)
        self.pump()  # the other jobs' batches need not wait for this one's
        return len(queue)

    async def _run(self, items: list[Item]) -> None:
        try:
            if await self._set_up(items):
                await (self._perform_batch(items) if self.batched else self._perform(items[0]))
        finally:
            self.busy -= 1
            self.performing -= len(items)
            if self.gate is not None:
                self.gate.done(len(items))
            self.pump()

    async def _set_up(self, items: list[Item]) -> bool:
        """Sets the instance up once; when `setup` raises, `items` fail with its error, and the
        next steps call it again."""
        if self.ready:
            return True
        async with self._setting_up:
            if not self.ready:
                try:
                    await self._call(self.instance.setup)
                except BaseException as error:
                    if isinstance(error, PerformExit):
                        error = error.error
                    failure = SetupError(f"{self._name}.setup failed: {describe(error)}")
                    for item in items:
                        self._finish(item.job_id, item.start, None, failure, None)
                    return False
                self.ready = True
        return True

    async def _perform(self, item: Item) -> None:
        driver: SliceDriver | None = None
        try:
            result, driver = await self._call(self.instance.perform, item.request, item.context)
        except BaseException as error:
            self._finish(item.job_id, item.start, None, _original(error), driver)
        else:
            self._finish(item.job_id, item.start, result, None, driver)

    async def _perform_batch(self, items: list[Item]) -> None:
        context = BatchContext([item.context for item in items])
        if any(item.context.is_cancelled for item in items):
            context.cancel()
        self.batches.add(context)
        driver: SliceDriver | None = None
        try:
            requests = [item.request for item in items]
            results, driver = await self._call(self.instance.perform_batch, requests, context)
        except BaseException as error:
            self._end(items, _original(error), driver)
            return
        finally:
            self.batches.discard(context)
        if not isinstance(results, list | tuple) or len(results) != len(items):
            got = (
                f"{len(results)} results"
                if isinstance(results, list | tuple)
                else (type(results).__name__)
            )
            wrong = TypeError(f"perform_batch returned {got} for {len(items)} requests")
            self._end(items, wrong, driver)
            return
        for item, result in zip(items, results, strict=True):
            self._finish(item.job_id, item.start, result, None, driver)

    def _end(self, items: list[Item], error: BaseException, driver: SliceDriver | None) -> None:
        for item in items:
            self._finish(item.job_id, item.start, None, error, driver)

    async def _call(self, method: Callable[..., Any], *args: Any) -> tuple[Any, SliceDriver | None]:
        """Runs a method of the instance: a coroutine function slice by slice on this loop (its
        slices timed), else in the thread pool. `KeyboardInterrupt` and `SystemExit` come out
        as `PerformExit`, never into the event loop."""
        if inspect.iscoroutinefunction(method):
            driver = SliceDriver(method(*args))
            try:
                done, out = driver.step()
            except (KeyboardInterrupt, SystemExit) as exit_:
                raise PerformExit(exit_) from exit_
            return (out if done else await driver.finish(out)), driver
        loop = asyncio.get_running_loop()
        call = functools.partial(_guarded, method, *args)
        return await loop.run_in_executor(self._pool, call), None


def _guarded(method: Callable[..., Any], *args: Any) -> Any:
    try:
        return method(*args)
    except (KeyboardInterrupt, SystemExit) as exit_:
        raise PerformExit(exit_) from exit_


def _original(error: BaseException) -> BaseException:
    return error.error if isinstance(error, PerformExit) else error
