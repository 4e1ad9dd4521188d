"""The step host: a named actor per node and CPU slot that activates many steps at once.

A step's flow here: `start_steps` writes RUNNING (+ lease) for the whole batch in one
group-commit round and answers once that round is flushed; each `perform` runs (coroutines on
this event loop, sync code in the thread pool); its outcome (`runtime.outcomes`) goes to the
outbox (`runtime.outbox`), persisted, then delivered. A batch of first attempts launches first
and its RUNNING write joins the round after, for the steps not done at launch; a step that ends
before the flush writes only its outcome (`GroupCommit`), and one done at launch writes no
RUNNING at all. Once launched, a first attempt is this host's until its outcome is stored: a
failed RUNNING write is written again in the background (while the step has no outcome yet),
never reported as a failed start, so the job never starts it elsewhere while it runs here. A
batch with a later attempt (a retry, a resumed stop) runs only once its RUNNING write is stored.
A resuming job fences the host while it reads storage (`runtime.fences`). A dedicated step actor
is the same class hosting one step.

The host's parts, each passed what it needs: a `Tenant` per (storage, options) with its leases
(`runtime.tenant`), the `Fences`, the `Outbox`, a `Lane` per type that runs through one instance
(`runtime.lanes`: a pool's type, or one that sets itself up, performs batches or is limited), and
a pool host's `Leaving` (`runtime.leaving`). Background tasks (`runtime.tasks`) are named and
watched: a failed one is logged with its name and job. A job's entries here are dropped once it
has no running step and no task (start, persist, delivery) in flight.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import ray
from pydantic import BaseModel

from choreography_ray.core.messages import (
    StartWire,
    StepStart,
    starts_from_wire,
)
from choreography_ray.core.metrics import UNKNOWN, Labels
from choreography_ray.core.placement import check_limits, is_limited, placement_of, uses_lane
from choreography_ray.core.sharing import NO_SHARE, FairQueue, Share
from choreography_ray.limit import Limit
from choreography_ray.logs import configure_actor, get_logger, ids
from choreography_ray.options import JobsOptions
from choreography_ray.runtime.driver import PerformExit, SliceDriver
from choreography_ray.runtime.fences import Fences
from choreography_ray.runtime.lanes import Lane
from choreography_ray.runtime.leaving import Leave, Leaving, end_actor, restart_actor
from choreography_ray.runtime.limits import gate_for
from choreography_ray.runtime.outbox import Outbox
from choreography_ray.runtime.outcomes import outcome_of
from choreography_ray.runtime.pools import record_pool_gauges
from choreography_ray.runtime.process import tune_gc
from choreography_ray.runtime.tasks import Tasks
from choreography_ray.runtime.tenant import Tenant
from choreography_ray.runtime.threads import FairThreads
from choreography_ray.runtime.waiting import record_waiting
from choreography_ray.status import StepStatus
from choreography_ray.step import JobStep, StepContext
from choreography_ray.types import import_type

log = get_logger(__name__)

#: Threads of a host's sync performs, batches and setups.
THREADS = 32


class StepHostCore:
    """Everything of the step host but the Ray actor shell."""

    def __init__(
        self,
        namespace: str,
        capacity: int,
        end: Leave = end_actor,
        restart: Leave = restart_actor,
    ) -> None:
        """`end` ends the host for good (it leaves), and `restart` ends its process so Ray
        starts it again (`_replace`)."""
        self.namespace = namespace
        self.capacity = capacity
        self.tenants: dict[tuple[str, str], Tenant] = {}
        self.job_tenant: dict[str, Tenant] = {}
        #: Each job's metric tags, as its start batches said them; dropped with `job_tenant`.
        self.job_labels: dict[str, Labels] = {}
        self.running: dict[tuple[str, str], tuple[StepContext, asyncio.Future[Any] | None]] = {}
        #: Later attempts waiting for their RUNNING write: not launched, dropped if it fails.
        self.unwritten: set[tuple[str, str]] = set()
        self.removing_jobs: set[str] = set()
        #: What keeps a job's entries (`job_tenant`, `removing_jobs`): its running steps, its
        #: `start_steps` calls and its tasks in flight. At zero the entries are dropped.
        self.holds: Counter[str] = Counter()
        self.drop_deliveries: set[str] = set()
        self._room = asyncio.Condition()
        #: Starts waiting for room, in the order they go (`core.sharing`): priority, then
        #: weighted fair shares between fairness keys, then first come.
        self.admission: FairQueue[object] = FairQueue()
        #: The host's background tasks, a job's holding its entries (`runtime.tasks`).
        self.tasks = Tasks(self._hold, self._release)
        self.spawn = self.tasks.spawn
        #: A resuming job's fences and each job's newest activation epoch (`runtime.fences`).
        self.fences = Fences(self._room, self.spawn)
        self.outbox = Outbox(
            self._room,
            self.fences,
            self.spawn,
            tenant_of=self.job_tenant.__getitem__,
            labels_of=self._labels,
            removing=self.removing_jobs.__contains__,
            stored=self._pop_running,
        )
        #: Each job's `Share` (priority, fairness key, weight), as its start batches said it.
        self.job_share: dict[str, Share] = {}
        #: The thread pool of sync performs, batches and setups, shared by `Share`.
        self.threads = FairThreads(THREADS)
        #: The step types that run through one instance here (`runtime.lanes`).
        self.lanes: dict[type[JobStep[Any]], Lane] = {}
        self._silo = ray.get_runtime_context().get_node_id()
        #: This process of the hosting actor: a restart is a new incarnation.
        self.incarnation = f"{ray.get_runtime_context().get_actor_id()}:{os.getpid()}"
        #: Whether this pool's host leaves (`runtime.leaving`).
        self.leave = Leaving(self.holds, self.spawn, end)
        self._restart = restart

    def tenant(self, job_id: str, context: tuple[str, str]) -> Tenant:
        tenant = self.tenants.get(context)
        if tenant is None:
            tenant = self.tenants[context] = Tenant(
                *context,
                self.namespace,
                silo=self._silo,
                activation=self.incarnation,
                labels_of=self._labels,
                spawn=self.spawn,
            )
            if self.drop_deliveries:
                tenant.delivery.drop = lambda job, _outcomes: job in self.drop_deliveries
        self.job_tenant[job_id] = tenant
        return tenant

    async def start_steps(
        self,
        job_id: str,
        context: tuple[str, str],
        steps: Sequence[StepStart],
        labels: Labels = UNKNOWN,
        epoch: int = 0,
        share: Share | None = None,
        reply_to: Any = None,
    ) -> int:
        """Persists RUNNING for the batch, starts every step, and returns how many started.
        Waits while the host is at capacity, which throttles the caller's start operations;
        the starts waiting go in the order of their jobs' `share` (`core.sharing`), and the
        job's sync steps wait for a thread in that order too. A step already running here is
        not started twice. `labels` are the job's metric tags; `reply_to` is the job actor's
        handle, which outcomes are delivered to (else it is looked up by name).
        A start of an activation older than one that asked this host already (`epoch`) is
        refused with `StaleActivationError`, also after waiting for room."""
        if self.leave.leaving:
            raise RuntimeError(
                "this pool host is leaving (idle, or replaced): start the steps elsewhere"
            )
        self.fences.see_epoch(job_id, epoch)
        self._hold(job_id)
        self.job_labels[job_id] = labels
        if share is not None:
            self.job_share[job_id] = share
        try:
            tenant = self.tenant(job_id, context)
            if reply_to is not None:
                tenant.delivery.know(job_id, reply_to)
            return await self._start_steps(job_id, tenant, steps, epoch)
        finally:
            self._release(job_id)

    def _admits(self, ticket: object, steps: int) -> bool:
        """Whether a start waiting for room goes now: it is the next in `admission`'s order,
        and its steps fit (or nothing runs here)."""
        return self.admission.peek() is ticket and (
            not self.running or len(self.running) + steps <= self.capacity
        )

    async def _start_steps(
        self, job_id: str, tenant: Tenant, steps: Sequence[StepStart], epoch: int
    ) -> int:
        fences = self.fences
        fence = fences.raised[job_id]
        ticket = object()
        self.admission.push(ticket, self.share_of(job_id), cost=len(steps))
        async with self._room:
            try:
                await self._room.wait_for(
                    lambda: (
                        fences.raised[job_id] != fence
                        or fences.superseded(job_id, epoch)
                        or self._admits(ticket, len(steps))
                    )
                )
            finally:
                # Served when admitted; else (refused, cancelled) out of the order. Either
                # way the next start in order may go now.
                if self.admission.peek() is ticket:
                    self.admission.pop()
                else:
                    self.admission.remove_if(lambda waiting: waiting is ticket)
                self._room.notify_all()
            fences.see_epoch(job_id, epoch)  # a newer activation asked while this one waited
            if fences.raised[job_id] != fence:
                raise RuntimeError(
                    f"job {job_id} reactivated while {len(steps)} of its steps waited for room "
                    "on this host: they were not started"
                )
            here = [(s, self.running.get((job_id, s.step_id))) for s in steps]
            earlier = [s.step_id for s, run in here if run and run[0].attempt != s.attempt]
            if earlier:
                # The job counted an earlier attempt from storage while this host still
                # persists it: the new attempt must not pass for running here.
                raise RuntimeError(
                    f"steps {earlier[:5]} of job {job_id} still finish an earlier attempt on "
                    "this host; start them again later"
                )
            steps = [s for s, run in here if run is None]
            keys = [(job_id, s.step_id) for s in steps]
            for key, step in zip(keys, steps, strict=True):
                context = StepContext(
                    job_id, step.step_id, step.stage, step.attempt, tenant.decisions, tenant.outputs
                )
                self.running[key] = (context, None)
                tenant.leased[key] = step.attempt
            self._hold(job_id, len(steps))
        labels = self.job_labels.get(job_id, UNKNOWN)
        if all(s.attempt == 1 for s in steps):
            # First attempts launch now: their records hold no outcome, so until RUNNING is
            # stored a reactivated job still finds them unfinished and adopts them from here.
            for step in steps:
                self._launch(job_id, step, tenant.options)
            # RUNNING of the steps not done at launch joins the round now, before any outcome
            # (outcomes are persisted from a callback run after this): it lands first. A step
            # done at launch writes only its outcome.
            written = tenant.commit.join(tenant.running_updates(job_id, steps), labels=labels)
            try:
                await written
            except Exception as error:
                log.warning("job %s: the RUNNING write of %d steps failed (%s); they run on, "
                            "and it is written again", job_id, len(steps), error,
                            extra=ids(job_id))  # fmt: skip
                self.spawn(
                    tenant.write_running(job_id, steps, labels), f"running-write {job_id}", job_id
                )
            return len(steps)
        # A later attempt's record holds its earlier outcome until RUNNING replaces it (a job
        # reactivated meanwhile would count that outcome): it runs only once RUNNING is stored,
        # and a failed write fails the start, which the job makes again.
        written = tenant.commit.join(tenant.running_updates(job_id, steps), labels=labels)
        self.unwritten.update(keys)
        try:
            await written
        except BaseException:
            for key in keys:
                tenant.leased.pop(key, None)
                self._pop_running(key)
            raise
        finally:
            # Wakes a fence waiting for these writes, and starts waiting for room.
            async with self._room:
                self.unwritten.difference_update(keys)
                self._room.notify_all()
        for step in steps:
            self._launch(job_id, step, tenant.options)
        return len(steps)

    def _launch(self, job_id: str, step: StepStart, options: JobsOptions) -> None:
        key = (job_id, step.step_id)
        context = self.running[key][0]
        driver: SliceDriver | None = None
        task: asyncio.Future[Any] | None = None
        out: Any = None
        try:
            step_type, request_type, is_async, lane = _step_type(
                step.type, options.allowed_type_prefixes
            )
            request = request_type.model_validate_json(step.request_json)
            if lane:
                self._lane(step_type, options).add(job_id, step, request, context)
                return
            perform = step_type().perform
            if is_async:
                driver = SliceDriver(perform(request, context))
                done, out = driver.step()
                if not done:
                    task = asyncio.ensure_future(driver.finish(out))
                    task.set_name(f"step {job_id}/{step.step_id}")
            else:
                task = self.threads.run(self.share_of(job_id), perform, request, context)
        except BaseException as error:
            # Whatever the perform raised (CancelledError and SystemExit included) is this
            # step's outcome: the rest of its batch still launches.
            self._finish(job_id, step, None, error, driver)
            return
        if task is None:
            self._finish(job_id, step, out, None, driver)
            return
        self.running[key] = (context, task)
        task.add_done_callback(lambda t: self._finish_task(job_id, step, t, driver))

    def _lane(self, step_type: type[JobStep[Any]], options: JobsOptions) -> Lane:
        """The type's lane, made for its first step here: as many performs at once as this
        host's capacity unless the type (or a pool) says its `concurrency`, and a limited type's
        gate (`runtime.limits`). A step whose options do not configure a limit its type names
        fails (`TypeError`)."""
        check_limits(step_type, options.limits)
        lane = self.lanes.get(step_type)
        if lane is None:
            # Only a pool's host is replaced: a shared host runs every other type too.
            replace = self._replace if step_type.resources is not None else None
            lane = Lane(step_type, self.threads, self.share_of, self._finish, self.spawn, replace,
                        self.capacity, self._block_limit)  # fmt: skip
            self.lanes[step_type] = lane
            if is_limited(step_type):
                lane.gate = gate_for(step_type, self.namespace, self.incarnation, self.spawn,
                                     self._named_limits(step_type), self._metrics_on)  # fmt: skip
                lane.gate.wake = lane.pump
        return lane

    def _named_limits(self, step_type: type[JobStep[Any]]) -> Callable[[], dict[str, Limit]]:
        """The named limits of the type as this host's connections' options configure them."""
        return lambda: {
            name: tenant.options.limits[name]
            for tenant in self.tenants.values()
            for name in step_type.limits
            if name in tenant.options.limits
        }

    def _metrics_on(self) -> bool:
        return any(tenant.options.metrics for tenant in self.tenants.values())

    def _block_limit(self, job_id: str) -> float:
        tenant = self.job_tenant.get(job_id)
        return 0.0 if tenant is None else tenant.options.step_event_loop_block_limit.total_seconds()

    def _replace(self) -> None:
        """A lane kept failing after a new setup: this process ends, Ray starts it again, and
        the jobs watching this incarnation start its steps again elsewhere."""
        self.leave.leaving = True  # no start is taken meanwhile
        self.spawn(self._restart(), "replace")

    def _finish_task(
        self, job_id: str, step: StepStart, task: asyncio.Future[Any], driver: SliceDriver | None
    ) -> None:
        if task.cancelled():
            self._finish(job_id, step, None, asyncio.CancelledError(), driver)
            return
        error = task.exception()
        if isinstance(error, PerformExit):
            error = error.error
        self._finish(job_id, step, None if error is not None else task.result(), error, driver)

    def _finish(
        self,
        job_id: str,
        step: StepStart,
        result: Any,
        error: BaseException | None,
        driver: SliceDriver | None,
    ) -> None:
        key = (job_id, step.step_id)
        tenant = self.job_tenant[job_id]
        # Known now: no renewal may be sent after this, so none races the outcome's write.
        tenant.leased.pop(key, None)
        entry = self.running.get(key)
        stopping = entry is not None and entry[0].is_cancelled
        outcome = outcome_of(step, result, error, stopping, driver, tenant.options)
        if job_id in self.removing_jobs:
            outcome = outcome._replace(status=StepStatus.STOPPED)
        self.outbox.add(job_id, outcome)

    async def cancel_steps(self, job_id: str, removing: bool) -> int:
        """Tells every running step of the job to stop; returns how many were told."""
        if removing and self.holds[job_id]:
            # Kept while the job holds anything here: until its last delivery is done.
            self.removing_jobs.add(job_id)
        told = 0
        for (owner, _), (context, task) in list(self.running.items()):
            if owner == job_id:
                context.cancel()
                if task is not None:
                    self.threads.drop(task)  # a sync step still waiting for a thread ends now
                told += 1
        for lane in self.lanes.values():
            lane.cancel(job_id)  # its steps waiting in a lane end stopped now
        return told

    async def running_steps(self, job_id: str, fence: bool = False, epoch: int = 0) -> list[str]:
        """The job's steps running here (a first attempt whose RUNNING write is not stored
        yet too; a later attempt waiting for that write not yet).

        A job that reactivates and will count what storage holds asks with `fence`, and lifts
        the fence (`lift_fence`) once it has read storage. Until then the job's outcomes are
        not written, so its reads are one still picture: a step listed here has no outcome
        stored, and any outcome stored is of a step not listed. The job's starts still waiting
        for room are refused, and the answer waits for the writes in flight: outcomes, and
        later attempts' RUNNING (stored, the steps run and are listed; failed, they never run).
        Else a write landing between the job's reads could be counted twice or not at all.
        The host learns the activation's `epoch`: older activations' starts are refused."""
        if self.fences.see_epoch(job_id, epoch, refuse=False):
            async with self._room:  # the older activation's starts waiting for room are refused
                self._room.notify_all()
        if fence and job_id in self.holds:
            await self.fences.fence(
                job_id, lambda: all(owner != job_id for owner, _ in self.unwritten)
            )
        return [
            step_id
            for (owner, step_id) in self.running
            if owner == job_id and (owner, step_id) not in self.unwritten
        ]

    def describe(self) -> dict[str, Any]:
        """Steps here: `running` (held here), per lane's type its steps `busy` (in a perform or
        batch) and `queued` (waiting in the lane), whether the host is `leaving`, and `idle`
        (it holds nothing: no step, start or task of a job)."""
        lanes = {
            f"{t.__module__}.{t.__qualname__}": {
                "busy": lane.performing,
                "queued": lane.waiting,
                "set_up": lane.ready,
            }
            for t, lane in self.lanes.items()
        }
        return {
            "running": len(self.running),
            "lanes": lanes,
            "leaving": self.leave.leaving,
            "idle": not self.holds,
        }

    def waiting_by_key(self) -> dict[str, float]:
        """Steps waiting here for capacity, per fairness key: for room, for a thread, in a
        lane (for a turn or a permit)."""
        counts = Counter(self.admission.waiting())
        counts.update(self.threads.waiting.waiting())
        for lane in self.lanes.values():
            counts.update(lane.queue.waiting_by_key())
        return dict(counts)

    def leave_if_idle(self) -> bool:
        """Leaves for good when the host holds nothing (`Leaving.if_idle`)."""
        return self.leave.if_idle()

    def share_of(self, job_id: str) -> Share:
        return self.job_share.get(job_id, NO_SHARE)

    def _labels(self, job_id: str) -> Labels:
        return self.job_labels.get(job_id, UNKNOWN)

    def _hold(self, job_id: str, n: int = 1) -> None:
        self.holds[job_id] += n
        self.leave.used = True

    def _release(self, job_id: str, n: int = 1) -> None:
        self.holds[job_id] -= n
        if self.holds[job_id] <= 0:
            del self.holds[job_id]
            tenant = self.job_tenant.pop(job_id, None)
            self.job_labels.pop(job_id, None)
            self.job_share.pop(job_id, None)
            self.fences.forget(job_id)
            if tenant is not None:
                tenant.decisions.forget(job_id)
            self.removing_jobs.discard(job_id)

    def _pop_running(self, key: tuple[str, str]) -> None:
        if self.running.pop(key, None) is not None:
            self._release(key[0])


@functools.lru_cache(maxsize=1024)
def _step_type(
    path: str, allowed_prefixes: tuple[str, ...] | None
) -> tuple[type[JobStep[Any]], type[BaseModel], bool, bool]:
    """A step type, its request model, whether its `perform` is a coroutine function, and
    whether it runs through a lane (`core.placement.uses_lane`)."""
    step_type: type[JobStep[Any]] = import_type(path, allowed_prefixes)
    placement_of(step_type)  # a JobStep, its attributes checked
    is_async = inspect.iscoroutinefunction(step_type.perform)
    return step_type, step_type.request_type(), is_async, uses_lane(step_type)


@ray.remote
class StepHost:
    """`step-host/{node_id}/{n}`, a pool's `pool/{shape}/{node_id}/{n}` (it leaves after
    `idle_timeout` s without a step), or a dedicated `step/{job_id}/{step_id}` actor."""

    def __init__(
        self,
        namespace: str,
        capacity: int,
        idle_timeout: float | None = None,
        shape: str | None = None,
    ) -> None:
        configure_actor()
        tune_gc()
        self.core = StepHostCore(namespace, capacity)
        self.core.spawn(record_waiting(self.core), "waiting-gauges")
        if idle_timeout is not None:
            self.core.spawn(self.core.leave.when_idle(idle_timeout), "leave-when-idle")
        if shape is not None:
            self.core.spawn(record_pool_gauges(shape, self.core), "pool-gauges")

    async def describe(self) -> dict[str, Any]:
        """What the host runs now (`StepHostCore.describe`)."""
        return self.core.describe()

    async def leave_if_idle(self) -> bool:
        """For the pool's owner: when the host holds nothing (no running step, start in flight
        or task of a job), it refuses starts from now on and ends for good (not restarted)
        once this answers True. Else False, and nothing changes."""
        return self.core.leave_if_idle()

    async def start_steps(
        self,
        job_id: str,
        context: tuple[str, str],
        steps: bytes | list[StartWire],
        labels: tuple[str, str, str] | None = None,
        epoch: int = 0,
        share: tuple[int, str, float] | None = None,
        reply_to: Any = None,
    ) -> tuple[int, str]:
        """How many steps started, and this host's incarnation (what the job watches).
        `labels` (scope, namespace, job type) tag what the host records of the job, and
        `share` (priority, fairness key, weight) orders its steps where they wait here, and
        `reply_to` is the job actor's own handle; a job actor of an earlier release sends none
        of them."""
        job_labels = UNKNOWN if labels is None else Labels(*labels)
        job_share = None if share is None else Share(*share)
        starts = starts_from_wire(steps)
        started = await self.core.start_steps(
            job_id, context, starts, job_labels, epoch, job_share, reply_to
        )
        return started, self.core.incarnation

    async def cancel_steps(self, job_id: str, removing: bool = False) -> int:
        return await self.core.cancel_steps(job_id, removing)

    async def ping(self) -> None:
        """Answers: a job actor ahead of its job reaches the host once (`RayHosts.warm`)."""

    async def running_steps(
        self, job_id: str, fence: bool = False, epoch: int = 0
    ) -> tuple[list[str], str]:
        """The job's steps running here (`StepHostCore.running_steps`), and this host's
        incarnation: the job watches the incarnation that listed them."""
        return await self.core.running_steps(job_id, fence, epoch), self.core.incarnation

    async def lift_fence(self, job_id: str) -> None:
        await self.core.fences.lift(job_id)

    async def fenced_writes(self, job_id: str) -> int:
        """How many of the job's outcome writes wait for its fence to lift (tests)."""
        return self.core.fences.held[job_id]

    async def held_jobs(self) -> list[str]:
        """The jobs this host keeps entries of (for tests and diagnosis)."""
        core = self.core
        return sorted(set(core.job_tenant) | core.removing_jobs | set(core.holds))

    async def watch(self, incarnation: str | None = None) -> None:
        """Returns at once when `incarnation` is not this one (the host restarted since);
        else never: a caller awaiting it learns from Ray's error that this host died."""
        if incarnation is None or incarnation == self.core.incarnation:
            await asyncio.Event().wait()

    def drop_deliveries(self, job_ids: list[str]) -> None:
        """Fault injection for tests: deliveries to these jobs are dropped."""
        self.core.drop_deliveries.update(job_ids)
        for tenant in self.core.tenants.values():
            tenant.delivery.drop = lambda job, _outcomes: job in self.core.drop_deliveries
