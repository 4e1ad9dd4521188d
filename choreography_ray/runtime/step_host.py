"""The step host: a named actor per node and CPU slot that activates many steps at once.

A step's flow here: `start_steps` writes RUNNING (+ lease) for the whole batch in one
group-commit round and answers once that round is flushed; each `perform` runs (coroutines on
this event loop, sync code in the thread pool); outcomes are persisted in one group commit (a
success deletes its record) and only then delivered to the job, in batches. A batch of first
attempts launches first and its RUNNING write joins the round after, for the steps not done at
launch; a step that ends before the flush writes only its outcome (`GroupCommit`), and one done
at launch writes no RUNNING at all. Once launched, a first attempt is this host's until
its outcome is stored: a failed RUNNING write is written again in the background (while the step
has no outcome yet), never reported as a failed start, so the job never starts it elsewhere
while it runs here. A batch with a later attempt (a retry, a resumed stop) runs only once its
RUNNING write is stored. A resuming job fences the host while it reads storage (`running_steps`,
`lift_fence`): its outcome writes wait, and a start it sent before never runs after. A dedicated
step actor is the same class hosting one step.

Whatever a perform raises is its step's outcome, never its batch's or the host's: a
`CancelledError` the host did not ask for (the step was not told to stop) is a failure, and so is
`KeyboardInterrupt` or `SystemExit`. A running step's lease is renewed by a timer, in one
conditional bulk write (`Storage.renew_leases`), until its outcome is known. Background tasks are
named and watched: a failed one is logged with its name and job. A job's entries here are
dropped once it has no running step and no task (start, persist, delivery) in flight.

A type of a pool, or one that sets itself up, performs batches or is limited, runs through a
lane (`runtime/lanes.py`): one instance of it per host, its steps queued there until their turn.
A pool's host (`pool/{shape}/{node}/{n}`) leaves once idle for `pool_idle_timeout`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import os
import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
from pydantic import BaseModel

from choreography_ray.core.messages import (
    Outcome,
    StartWire,
    StepStart,
    describe,
    failed,
    starts_from_wire,
)
from choreography_ray.core.metrics import UNKNOWN, Histogram, Labels, WriteOperation
from choreography_ray.core.placement import placement_of, uses_lane
from choreography_ray.core.retries import Backoff
from choreography_ray.errors import StaleActivationError
from choreography_ray.logs import configure_actor, get_logger, ids
from choreography_ray.model import Lease, StatusChange, utcnow
from choreography_ray.options import JobsOptions
from choreography_ray.runtime.delivery import Delivery
from choreography_ray.runtime.driver import PerformExit, SliceDriver
from choreography_ray.runtime.group_commit import GroupCommit
from choreography_ray.runtime.lanes import Lane
from choreography_ray.runtime.limits import gate_for, limited
from choreography_ray.runtime.metrics import metrics_for
from choreography_ray.runtime.pools import record_pool_gauges
from choreography_ray.runtime.process import tune_gc
from choreography_ray.runtime.shared_storage import open_shared_storage, shared_scheduler_storage
from choreography_ray.scheduler.deciding import JobDecisions
from choreography_ray.status import JobStatus, StepStatus
from choreography_ray.step import JobStep, StepContext, StepResult
from choreography_ray.storage import LeaseRenewal, StepUpdate, redact_url
from choreography_ray.types import import_type

log = get_logger(__name__)

#: The failure message of a step whose perform raised CancelledError when nobody stopped it.
UNASKED_CANCEL = "perform raised CancelledError without being stopped"
#: Seconds between two tries to persist a batch of outcomes: 1 s, doubling up to 30 s.
PERSIST_RETRY = Backoff(1.0, 30.0)
#: Seconds a fence holds a job's outcome writes when the job never lifts it (it was lost).
FENCE_SECONDS = 60.0
#: Seconds a new pool host that has held nothing stays at least, whatever its idle timeout.
UNUSED_SECONDS = 10.0
#: How many jobs' newest activation epochs a host keeps (`StepHostCore.epochs`).
EPOCHS_KEPT = 10_000


class Tenant:
    """What the steps of one (storage, options) see: hosts are shared by every connection."""

    def __init__(self, storage_url: str, options_json: str, namespace: str, host: StepHostCore):
        self.options = JobsOptions.model_validate_json(options_json)
        self.storage = open_shared_storage(storage_url, namespace)
        self.metrics = metrics_for(self.options)
        self.commit = GroupCommit(
            self.storage, self.options.group_commit_delay.total_seconds(), self.metrics
        )
        #: `StepContext.decide` of this tenant's steps: each job's scheduler run, found once.
        self.decisions = JobDecisions(
            lambda: shared_scheduler_storage(self.storage),
            self.options.scheduler.replay_answers_for,
            asyncio.get_running_loop(),
        )
        self.delivery = Delivery(self.options, namespace, self.job_exists, self.metrics)
        #: The steps whose lease the host renews, (job_id, step_id) -> attempt. A step leaves
        #: as soon as its outcome is known, before the outcome is written.
        self.leased: dict[tuple[str, str], int] = {}
        lease = self.options.lease_seconds
        if lease is not None:
            host.spawn(
                host.renew_leases(self, lease / 3), f"renew-leases {redact_url(storage_url)}"
            )

    async def job_exists(self, job_id: str) -> bool:
        job = await self.storage.get_job(job_id)
        return (
            job is not None
            and not job.status.is_terminal
            and not (job.status is JobStatus.STOPPED and job.stop_finalized)
        )


class StepHostCore:
    """Everything of the step host but the Ray actor shell."""

    def __init__(self, namespace: str, capacity: int) -> None:
        self.namespace = namespace
        self.capacity = capacity
        self.tenants: dict[tuple[str, str], Tenant] = {}
        self.job_tenant: dict[str, Tenant] = {}
        #: Each job's metric tags, as its start batches said them; dropped with `job_tenant`.
        self.job_labels: dict[str, Labels] = {}
        self.running: dict[tuple[str, str], tuple[StepContext, asyncio.Future[Any] | None]] = {}
        #: Later attempts waiting for their RUNNING write: not launched, dropped if it fails.
        self.unwritten: set[tuple[str, str]] = set()
        #: Per job, how often a reactivating job fenced its starts here (`running_steps`): a
        #: start that waited for room across a fence was sent before it, and is refused.
        self.fences: Counter[str] = Counter()
        #: Per job, the newest activation epoch that asked this host (a start, or a read of
        #: its steps): a start of an older activation is refused, also one that arrives after
        #: the newer activation's fence. The last EPOCHS_KEPT jobs asked.
        self.epochs: OrderedDict[str, int] = OrderedDict()
        #: The jobs whose fence is up: their outcome writes wait until `lift_fence` (or
        #: FENCE_SECONDS), so the job reads storage while nothing of it changes there.
        self.fenced: dict[str, asyncio.TimerHandle] = {}
        #: Per job, outcome writes in flight, and those waiting for its fence to lift.
        self.writing: Counter[str] = Counter()
        self.held: Counter[str] = Counter()
        self.removing_jobs: set[str] = set()
        #: What keeps a job's entries (`job_tenant`, `removing_jobs`): its running steps, its
        #: `start_steps` calls and its tasks in flight. At zero the entries are dropped.
        self.holds: Counter[str] = Counter()
        self.drop_deliveries: set[str] = set()
        self._outbox: defaultdict[str, list[Outcome]] = defaultdict(list)
        self._outbox_scheduled = False
        self._room = asyncio.Condition()
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="step")
        #: The step types that run through one instance here (`runtime.lanes`).
        self.lanes: dict[type[JobStep[Any]], Lane] = {}
        self._silo = ray.get_runtime_context().get_node_id()
        #: This process of the hosting actor: a restart is a new incarnation.
        self.incarnation = f"{ray.get_runtime_context().get_actor_id()}:{os.getpid()}"
        self.tasks: set[asyncio.Task[None]] = set()
        #: A pool's host that was idle long enough: it takes no more steps, and leaves.
        self.leaving = False

    def tenant(self, job_id: str, context: tuple[str, str]) -> Tenant:
        tenant = self.tenants.get(context)
        if tenant is None:
            tenant = self.tenants[context] = Tenant(*context, self.namespace, self)
            if self.drop_deliveries:
                tenant.delivery.drop = lambda job, _outcomes: job in self.drop_deliveries
        self.job_tenant[job_id] = tenant
        return tenant

    def lease(self, tenant: Tenant) -> Lease | None:
        if tenant.options.lease_seconds is None:
            return None
        return Lease(silo=self._silo, activation=self.incarnation, heartbeat=utcnow())

    async def start_steps(
        self,
        job_id: str,
        context: tuple[str, str],
        steps: Sequence[StepStart],
        labels: Labels = UNKNOWN,
        epoch: int = 0,
    ) -> int:
        """Persists RUNNING for the batch, starts every step, and returns how many started.
        Waits while the host is at capacity, which throttles the caller's start operations.
        A step already running here is not started twice. `labels` are the job's metric tags.
        A start of an activation older than one that asked this host already (`epoch`) is
        refused with `StaleActivationError`, also after waiting for room."""
        if self.leaving:
            raise RuntimeError("this pool host is leaving (it was idle): start the steps elsewhere")
        self._see_epoch(job_id, epoch)
        self._hold(job_id)
        self.job_labels[job_id] = labels
        try:
            return await self._start_steps(job_id, self.tenant(job_id, context), steps, epoch)
        finally:
            self._release(job_id)

    def _see_epoch(self, job_id: str, epoch: int, refuse: bool = True) -> bool:
        """Learns the job's newest activation epoch (0: unknown, ignored): True when it is
        newer than any before. Raises `StaleActivationError` for an older one when `refuse`."""
        known = self.epochs.get(job_id, 0)
        if epoch < known and epoch:
            if refuse:
                raise StaleActivationError(
                    f"job {job_id}: activation epoch {epoch} is older than {known}, which asked "
                    "this host already: its start is refused"
                )
            return False
        if epoch <= known:
            return False
        self.epochs[job_id] = epoch
        self.epochs.move_to_end(job_id)
        if len(self.epochs) > EPOCHS_KEPT:
            self.epochs.popitem(last=False)
        return True

    async def _start_steps(
        self, job_id: str, tenant: Tenant, steps: Sequence[StepStart], epoch: int
    ) -> int:
        fence = self.fences[job_id]
        async with self._room:
            await self._room.wait_for(
                lambda: (
                    self.fences[job_id] != fence
                    or self.epochs.get(job_id, 0) > epoch > 0
                    or not self.running
                    or len(self.running) + len(steps) <= self.capacity
                )
            )
            self._see_epoch(job_id, epoch)  # a newer activation asked while this one waited
            if self.fences[job_id] != fence:
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
                self.running[key] = (
                    StepContext(job_id, step.step_id, step.stage, step.attempt, tenant.decisions),
                    None,
                )
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
            written = tenant.commit.join(
                self._running_updates(tenant, job_id, steps), labels=labels
            )
            try:
                await written
            except Exception as error:
                log.warning("job %s: the RUNNING write of %d steps failed (%s); they run on, "
                            "and it is written again", job_id, len(steps), error,
                            extra=ids(job_id))  # fmt: skip
                self.spawn(
                    self._write_running(tenant, job_id, steps), f"running-write {job_id}", job_id
                )
            return len(steps)
        # A later attempt's record holds its earlier outcome until RUNNING replaces it (a job
        # reactivated meanwhile would count that outcome): it runs only once RUNNING is stored,
        # and a failed write fails the start, which the job makes again.
        written = tenant.commit.join(self._running_updates(tenant, job_id, steps), labels=labels)
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

    def _running_updates(
        self, tenant: Tenant, job_id: str, steps: Sequence[StepStart]
    ) -> list[StepUpdate]:
        """RUNNING (+ lease) of those of `steps` still running here without an outcome."""
        change = StatusChange(status=StepStatus.RUNNING)
        lease = self.lease(tenant)
        return [
            StepUpdate(job_id, s.step_id, StepStatus.RUNNING, s.attempt, lease, change)
            for s in steps
            if tenant.leased.get((job_id, s.step_id)) == s.attempt
        ]

    async def _write_running(self, tenant: Tenant, job_id: str, steps: Sequence[StepStart]) -> None:
        """Writes RUNNING again, with backoff, until it is stored or every step has an outcome
        (a later round then holds the outcome; RUNNING must not follow it)."""
        labels = self.job_labels.get(job_id, UNKNOWN)
        for tries in itertools.count(1):
            await asyncio.sleep(PERSIST_RETRY.delay(tries))
            updates = self._running_updates(tenant, job_id, steps)
            if not updates:
                return
            try:
                await tenant.commit.write(updates, labels=labels)
                return
            except Exception as error:
                log.warning("job %s: writing RUNNING of %d steps again failed: %s", job_id,
                            len(updates), error, extra=ids(job_id))  # fmt: skip

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
                self._lane(step_type).add(job_id, step, request, context)
                return
            perform = step_type().perform
            if is_async:
                driver = SliceDriver(perform(request, context))
                done, out = driver.step()
                if not done:
                    task = asyncio.ensure_future(driver.finish(out))
                    task.set_name(f"step {job_id}/{step.step_id}")
            else:
                task = asyncio.get_running_loop().run_in_executor(
                    self._pool, perform, request, context
                )
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

    def _lane(self, step_type: type[JobStep[Any]]) -> Lane:
        lane = self.lanes.get(step_type)
        if lane is None:
            lane = self.lanes[step_type] = Lane(step_type, self._pool, self._finish, self.spawn)
            if limited(step_type):
                lane.gate = gate_for(step_type, self.namespace, self.incarnation, self.spawn)
                lane.gate.wake = lane.pump
        return lane

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
        outcome = _outcome(step, result, error, stopping, driver, tenant.options)
        if job_id in self.removing_jobs:
            outcome = outcome._replace(status=StepStatus.STOPPED)
        self._outbox[job_id].append(outcome)
        if not self._outbox_scheduled:
            self._outbox_scheduled = True
            asyncio.get_running_loop().call_soon(self._spawn_flush)

    def _spawn_flush(self) -> None:
        self._outbox_scheduled = False
        outbox, self._outbox = self._outbox, defaultdict(list)
        # One task per job; the group commit still makes their writes one bulk write.
        for job_id, outcomes in outbox.items():
            task = self._persist_and_deliver(self.job_tenant[job_id], job_id, outcomes)
            self.spawn(task, f"persist-and-deliver {job_id}", job_id)

    async def _persist_and_deliver(
        self, tenant: Tenant, job_id: str, outcomes: list[Outcome]
    ) -> None:
        updates: list[StepUpdate] = []
        deletes: list[tuple[str, str]] = []
        for o in outcomes:
            if o.status is StepStatus.COMPLETED_SUCCESSFULLY:
                deletes.append((job_id, o.step_id))
            else:
                messages = () if o.message is None else (o.message,)
                change = StatusChange(status=o.status, exception_messages=messages)
                updates.append(
                    StepUpdate(job_id, o.step_id, o.status, o.attempt, None, change, o.signature)
                )
        labels = self.job_labels.get(job_id, UNKNOWN)
        tries = 0
        while True:
            async with self._room:
                self.held[job_id] += 1
                try:
                    await self._room.wait_for(lambda: job_id not in self.fenced)
                finally:
                    self.held -= Counter({job_id: 1})  # no entry left at zero
                self.writing[job_id] += 1
            try:
                await tenant.commit.write(updates, deletes, labels)
            except Exception:
                # Persist, then deliver: an outcome that is not stored is not reported.
                async with self._room:
                    self._written(job_id)
                tries += 1
                log.exception(
                    "job %s: could not persist %d outcomes; retrying",
                    job_id,
                    len(outcomes),
                    extra=ids(job_id),
                )
                await asyncio.sleep(PERSIST_RETRY.delay(tries))
                continue
            async with self._room:
                # Not running here once stored: a fence's answer sees both at once.
                for o in outcomes:
                    self._pop_running((job_id, o.step_id))
                self._written(job_id)
            break
        await self._deliver(tenant, job_id, outcomes, labels)

    def _written(self, job_id: str) -> None:
        """An outcome write of the job ended (under `_room`)."""
        self.writing[job_id] -= 1
        if self.writing[job_id] <= 0:
            del self.writing[job_id]
        self._room.notify_all()

    async def _deliver(
        self, tenant: Tenant, job_id: str, outcomes: list[Outcome], labels: Labels
    ) -> None:
        removing = job_id in self.removing_jobs
        delivered = await tenant.delivery.deliver(
            job_id, outcomes, unlimited=removing, labels=labels
        )
        if removing and delivered:
            # The job has stored its stop: a removed step deletes its own record.
            deletes = [(job_id, o.step_id) for o in outcomes]
            await tenant.commit.write(deletes=deletes, labels=labels)

    async def cancel_steps(self, job_id: str, removing: bool) -> int:
        """Tells every running step of the job to stop; returns how many were told."""
        if removing and self.holds[job_id]:
            # Kept while the job holds anything here: until its last delivery is done.
            self.removing_jobs.add(job_id)
        told = 0
        for (owner, _), (context, _task) in list(self.running.items()):
            if owner == job_id:
                context.cancel()
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
        if self._see_epoch(job_id, epoch, refuse=False):
            async with self._room:  # the older activation's starts waiting for room are refused
                self._room.notify_all()
        if fence and job_id in self.holds:
            self.fences[job_id] += 1
            async with self._room:
                self._put_fence(job_id)
                await self._room.wait_for(
                    lambda: (
                        job_id not in self.writing
                        and all(owner != job_id for owner, _ in self.unwritten)
                    )
                )
        return [
            step_id
            for (owner, step_id) in self.running
            if owner == job_id and (owner, step_id) not in self.unwritten
        ]

    def _put_fence(self, job_id: str) -> None:
        """Holds the job's outcome writes (under `_room`) for FENCE_SECONDS at most."""
        if (old := self.fenced.get(job_id)) is not None:
            old.cancel()
        self.fenced[job_id] = asyncio.get_running_loop().call_later(
            FENCE_SECONDS,
            lambda: self.spawn(self.lift_fence(job_id, expired=True), f"fence expired {job_id}"),
        )
        self._room.notify_all()

    async def lift_fence(self, job_id: str, expired: bool = False) -> None:
        """The job's outcome writes go on."""
        async with self._room:
            handle = self.fenced.pop(job_id, None)
            if handle is None:
                return
            handle.cancel()
            if expired:
                log.warning("job %s: its fence was never lifted; lifted after %g s", job_id,
                            FENCE_SECONDS, extra=ids(job_id))  # fmt: skip
            self._room.notify_all()

    async def renew_leases(self, tenant: Tenant, every: float) -> None:
        """Every `every` s, renews the leases of this tenant's running steps in one conditional
        bulk write: a step whose outcome was stored meanwhile is left as it is. A failed write
        is logged, and the next tick tries again."""
        while True:
            await asyncio.sleep(every)
            lease = self.lease(tenant)
            if lease is None or not tenant.leased:
                continue
            renewals = [
                LeaseRenewal(job_id, step_id, attempt, lease)
                for (job_id, step_id), attempt in tenant.leased.items()
            ]
            began = time.perf_counter()
            try:
                await tenant.storage.renew_leases(renewals)
            except Exception as error:
                log.warning("could not renew %d leases (%s); retrying", len(renewals), error)
                continue
            if tenant.metrics.enabled:
                # Once per job type that had a lease in the round, never once per step.
                seconds = time.perf_counter() - began
                jobs = {renewal.job_id for renewal in renewals}
                for labels in {self.job_labels.get(job_id, UNKNOWN) for job_id in jobs}:
                    tenant.metrics.observe(
                        Histogram.STORAGE_WRITE_SECONDS,
                        seconds,
                        labels,
                        WriteOperation.RENEW_LEASES,
                    )

    async def leave_when_idle(
        self, idle_seconds: float, leave: Callable[[], Awaitable[None]]
    ) -> None:
        """Calls `leave` once the host has held nothing (no step, start or job task) for
        `idle_seconds`, refusing starts from then on; checked every quarter of it. A host that
        has held nothing yet waits at least UNUSED_SECONDS: the jobs learn of a new host from
        the pools' owner about a second after it is placed."""
        idle_since: float | None = time.monotonic() + max(0.0, UNUSED_SECONDS - idle_seconds)
        while True:
            await asyncio.sleep(max(idle_seconds / 4, 0.05))
            if self.holds:
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= idle_seconds:
                self.leaving = True
                log.info("pool host idle for %g s: leaving", idle_seconds)
                try:
                    await leave()
                except Exception as error:  # it stays, and takes steps again
                    log.warning("a pool host could not leave (it stays): %s", error)
                    self.leaving, idle_since = False, None

    def describe(self) -> dict[str, Any]:
        """Steps here: `running` (held here), and per lane's type its steps `busy` (in a
        perform or batch) and `queued` (waiting in the lane)."""
        lanes = {
            f"{t.__module__}.{t.__qualname__}": {
                "busy": lane.performing,
                "queued": lane.waiting,
                "set_up": lane.ready,
            }
            for t, lane in self.lanes.items()
        }
        return {"running": len(self.running), "lanes": lanes, "leaving": self.leaving}

    def spawn(
        self, coro: Coroutine[Any, Any, None], name: str, job_id: str | None = None
    ) -> asyncio.Task[None]:
        """Runs `coro` as a task named `name`; a failure is logged with the name and the job.
        A task spawned for a job holds the job's entries until it ends."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        if job_id is not None:
            self._hold(job_id)
        task.add_done_callback(functools.partial(self._watch, job_id))
        return task

    def _watch(self, job_id: str | None, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if job_id is not None:
            self._release(job_id)
        if not task.cancelled() and (error := task.exception()) is not None:
            job = "" if job_id is None else f" of job {job_id}"
            log.error("step host task %r%s failed", task.get_name(), job, exc_info=error,
                      extra=ids(job_id))  # fmt: skip

    def _hold(self, job_id: str, n: int = 1) -> None:
        self.holds[job_id] += n

    def _release(self, job_id: str, n: int = 1) -> None:
        self.holds[job_id] -= n
        if self.holds[job_id] <= 0:
            del self.holds[job_id]
            tenant = self.job_tenant.pop(job_id, None)
            self.job_labels.pop(job_id, None)
            self.fences.pop(job_id, None)
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


def _outcome(
    step: StepStart,
    result: Any,
    error: BaseException | None,
    stopping: bool,
    driver: SliceDriver | None,
    options: JobsOptions,
) -> Outcome:
    limit = options.step_event_loop_block_limit.total_seconds()
    if driver is not None and limit > 0 and driver.longest_slice > limit:
        return failed(
            step.step_id,
            step.attempt,
            StepStatus.FAILED,
            f"perform blocked the event loop for {driver.longest_slice:.2f} s "
            f"(limit {limit:g} s): await instead of blocking, or make perform sync",
        )
    if error is not None:
        if stopping:
            return Outcome(step.step_id, step.attempt, StepStatus.STOPPED)
        if isinstance(error, asyncio.CancelledError):
            return failed(step.step_id, step.attempt, StepStatus.FAILED, UNASKED_CANCEL)
        return failed(step.step_id, step.attempt, StepStatus.FAILED, describe(error))
    if not isinstance(result, StepResult):
        return failed(
            step.step_id,
            step.attempt,
            StepStatus.FAILED,
            f"perform returned {type(result).__name__}, not a StepResult",
        )
    if result.success:
        return Outcome(step.step_id, step.attempt, StepStatus.COMPLETED_SUCCESSFULLY)
    status = StepStatus.COMPLETED_WITH_FAILURE
    return failed(step.step_id, step.attempt, status, result.message, result.code)


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
        if idle_timeout is not None:
            self.core.spawn(self.core.leave_when_idle(idle_timeout, self._leave), "leave-when-idle")
        if shape is not None:
            self.core.spawn(record_pool_gauges(shape, self.core), "pool-gauges")

    @staticmethod
    async def _leave() -> None:
        """Ends this actor for good: it is not restarted, and its resources go back to Ray."""
        me = ray.get_runtime_context().current_actor
        await asyncio.to_thread(ray.kill, me, no_restart=True)

    async def describe(self) -> dict[str, Any]:
        """What the host runs now (`StepHostCore.describe`)."""
        return self.core.describe()

    async def start_steps(
        self,
        job_id: str,
        context: tuple[str, str],
        steps: bytes | list[StartWire],
        labels: tuple[str, str, str] | None = None,
        epoch: int = 0,
    ) -> tuple[int, str]:
        """How many steps started, and this host's incarnation (what the job watches).
        `labels` (scope, namespace, job type) tag what the host records of the job; a job
        actor of an earlier release sends none."""
        job_labels = UNKNOWN if labels is None else Labels(*labels)
        starts = starts_from_wire(steps)
        started = await self.core.start_steps(job_id, context, starts, job_labels, epoch)
        return started, self.core.incarnation

    async def cancel_steps(self, job_id: str, removing: bool = False) -> int:
        return await self.core.cancel_steps(job_id, removing)

    async def running_steps(self, job_id: str, fence: bool = False, epoch: int = 0) -> list[str]:
        return await self.core.running_steps(job_id, fence, epoch)

    async def lift_fence(self, job_id: str) -> None:
        await self.core.lift_fence(job_id)

    async def fenced_writes(self, job_id: str) -> int:
        """How many of the job's outcome writes wait for its fence to lift (tests)."""
        return self.core.held[job_id]

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
