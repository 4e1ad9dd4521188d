"""Fake step hosts for the core's unit tests: `Hosts` in-process, against the same storage.

A real step host (`runtime/step_host.py`) stores RUNNING for a start batch, runs each `perform`,
persists the outcome (a success deletes the step record) and only then reports it to the job.
`FakeHosts` does the first part in `start` and leaves the rest to the test, which decides when
each step ends and how its report travels:

    await hosts.finish(step_id)                      persisted, then reported (the normal way)
    await hosts.finish(step_id, FAILED, "why")       a failure, persisted as a real host would
    await hosts.finish(step_id, deliver=0)           persisted, the report lost
    await hosts.finish(step_id, deliver=2)           persisted, reported twice (a duplicate)
    await hosts.finish(step_id, persist=False)       reported, never persisted

Fault switches, all deliberate: `fail_starts` (the next start operations raise),
`lose_start_answers` (the next start operations start their steps, then raise), `start_gate`
(start operations wait for it, so a test sees them in flight), `kill(host)` (the host dies: its
watch returns, its steps are gone from `running()`, storage keeps them RUNNING), `restart(host)`
(the same, and the host comes back as a new incarnation), `restart_after_answer` (a host
restarts right after it answered a start), `watch_errors` (watch calls raise while the host
lives). As a real
host, `running(job, fence=True)` refuses the job's start operations waiting at the gate, and
holds the job's outcome writes (a step stays running meanwhile) until `lift_fence(job)`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

from choreography_ray.core.job import JobCore
from choreography_ray.core.messages import Outcome, StepStart, failed
from choreography_ray.core.metrics import Counter, Histogram, Labels
from choreography_ray.core.placement import Placement
from choreography_ray.core.pool_rules import PoolDemand
from choreography_ray.core.sharing import NO_SHARE, Share
from choreography_ray.errors import (
    StaleActivationError,
    StepHostUnknownError,
    StorageError,
    StorageUnavailableError,
)
from choreography_ray.model import JobState, Lease, StatusChange, StepState, utcnow
from choreography_ray.status import FAILED_STEP, JobStatus, StepStatus
from choreography_ray.storage import CountedKind, StatusCounts, StepUpdate, StoredOutput
from choreography_ray.storage.memory import MemoryStorage

#: The Ray node every fake host runs on (the silo of the leases it writes).
NODE = "node-0"
SUCCESS = StepStatus.COMPLETED_SUCCESSFULLY
FAILED = StepStatus.FAILED
STOPPED = StepStatus.STOPPED


@dataclass
class Run:
    """A step a host runs now."""

    job_id: str
    start: StepStart
    host: str
    #: The job told this step to stop.
    cancelled: bool = False
    #: The job is being removed: the step reports STOPPED and then deletes its record.
    removing: bool = False


class FakeHosts:
    """`core.hosts.Hosts` in-process. `core` is the activation reports go to (the harness sets
    it, and sets it again when it builds a new activation for the same job)."""

    def __init__(self, storage: MemoryStorage, shared_hosts: int = 2) -> None:
        self.storage = storage
        self.core: JobCore | None = None
        self.shared = [f"host-{i}" for i in range(shared_hosts)]
        self._turn = 0
        #: Every start operation, as (host, batch), in the order they were made.
        self.calls: list[tuple[str, list[StepStart]]] = []
        #: The metric labels each start operation carried, in the same order.
        self.labels: list[Labels] = []
        self.shares: list[Share] = []
        #: Every step a host stored RUNNING and ran, in order (a restart appears again).
        self.started: list[StepStart] = []
        #: What runs now, by (host, step id).
        self.runs: dict[tuple[str, str], Run] = {}
        #: Every cancel: (hosts, removing).
        self.cancels: list[tuple[frozenset[str], bool]] = []
        self.released: list[str] = []
        #: How many times an activation ahead of its job warmed the hosts.
        self.warmed = 0
        #: Every report delivered to the job, with the error the job answered (None: accepted).
        self.reports: list[tuple[list[Outcome], BaseException | None]] = []
        #: Fault: the next this many start operations raise ConnectionError.
        self.fail_starts = 0
        #: Fault: the next this many start operations start their steps, then raise (Ray: "the
        #: task may or may not have been executed on the actor").
        self.lose_start_answers = 0
        #: Fault: the next this many start operations store RUNNING, then their host's process
        #: dies (it comes back as a new incarnation, without the steps) and they raise.
        self.die_after_running = 0
        #: Fault: the next this many start operations run their steps without storing RUNNING
        #: (a real host's RUNNING write that failed, written again later).
        self.unwritten_starts = 0
        #: When set, start operations wait for it before they store anything.
        self.start_gate: asyncio.Event | None = None
        #: Steps in start operations not answered yet, and the most ever at once.
        self.in_flight = 0
        self.peak_in_flight = 0
        self.dead: set[str] = set()
        #: Set when that incarnation of the host is gone, by (host, incarnation).
        self._gone: dict[tuple[str, str], asyncio.Event] = {}
        #: How often each host restarted: its incarnation is "{host}#{restarts}".
        self.restarts: dict[str, int] = {}
        #: Fault: the next this many watch calls raise without the host being gone.
        self.watch_errors = 0
        #: Fault: the next this many `running` calls fence the job's hosts, then raise (one
        #: host did not answer).
        self.running_errors = 0
        #: Per host, the incarnation that last answered a start or `running`.
        self.answered: dict[str, str] = {}
        #: Every watch call made, as (host, incarnation).
        self.watches: list[tuple[str, str | None]] = []
        #: Fault: the next this many start operations' hosts restart right after answering
        #: (the answer carries the incarnation that is gone).
        self.restart_after_answer = 0
        #: Per job, how many fenced `running` calls were made (see `StepHostCore.fences`).
        self.fences: dict[str, int] = {}
        #: Per job, the newest activation epoch that asked (see `StepHostCore.epochs`).
        self.epochs: dict[str, int] = {}
        #: Every start operation a host refused for its older epoch, as (epoch, batch).
        self.stale: list[tuple[int, list[StepStart]]] = []
        #: The jobs whose fence is up, each with the event its lifting sets.
        self.fenced: dict[str, asyncio.Event] = {}
        #: When set, a host stores a lease with each RUNNING write: silo `NODE`, activation the
        #: host's name, never renewed (so it expires one lease timeout after the start).
        self.leases = False
        #: Per shape, the placed hosts of its pool (a shape not named: the shared hosts).
        self.pools: dict[str, list[str]] = {}
        #: Every `sync_pools`, as (job id, demands).
        self.synced: list[tuple[str, list[PoolDemand]]] = []

    # -- the Hosts protocol -------------------------------------------------------------------

    def place(
        self, job_id: str, starts: list[StepStart], placement: Placement
    ) -> list[tuple[str, list[StepStart]]]:
        if placement.dedicated:
            return [(f"step/{job_id}/{start.step_id}", [start]) for start in starts]
        alive = [h for h in self.shared if h not in self.dead]
        if not alive:
            raise RuntimeError("no alive host")
        host = alive[self._turn % len(alive)]
        self._turn += 1
        return [(host, list(starts))]

    def pool_hosts(self, shape: str) -> list[str] | None:
        """A pool's placed hosts: those `pools` names for it, else the alive shared hosts."""
        hosts = self.pools.get(shape, self.shared)
        return [h for h in hosts if h not in self.dead]

    def pool_growing(self, shape: str) -> bool:
        return False

    async def sync_pools(self, job_id: str, demands: list[PoolDemand]) -> None:
        self.synced.append((job_id, list(demands)))

    async def start(
        self,
        host: str,
        job_id: str,
        batch: Sequence[StepStart],
        labels: Labels,
        epoch: int = 0,
        share: Share = NO_SHARE,
    ) -> str:
        """A start operation, once sent, runs on its host even when the activation that sent
        it is gone (its caller cancelled)."""
        self.calls.append((host, list(batch)))
        self.labels.append(labels)
        self.shares.append(share)
        on_host = asyncio.ensure_future(self._start(host, job_id, batch, epoch))
        on_host.add_done_callback(lambda done: done.cancelled() or done.exception())
        await asyncio.shield(on_host)
        incarnation = self.answered[host] = self.incarnation(host)
        if self.restart_after_answer > 0:
            self.restart_after_answer -= 1
            self.restart(host)
        return incarnation

    async def _start(self, host: str, job_id: str, batch: Sequence[StepStart], epoch: int) -> None:
        self.in_flight += len(batch)
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        fence = self.fences.get(job_id, 0)
        try:
            self._see_epoch(job_id, epoch, batch)
            if self.start_gate is not None:
                await self.start_gate.wait()
            self._see_epoch(job_id, epoch, batch)
            if self.fences.get(job_id, 0) != fence:
                raise RuntimeError(f"job {job_id} reactivated while this start waited")
            if host in self.dead:
                raise ConnectionError(f"{host} is dead")
            if self.fail_starts > 0:
                self.fail_starts -= 1
                raise ConnectionError(f"starting on {host} failed (fault injected on purpose)")
            # As a real host: a step still running here at an earlier attempt is refused (the
            # job starts it again later); one running here at this attempt is not started twice.
            earlier = [
                s.step_id
                for s in batch
                if (host, s.step_id) in self.runs
                and self.runs[(host, s.step_id)].start.attempt != s.attempt
            ]
            if earlier:
                raise RuntimeError(f"steps {earlier} still run an earlier attempt on {host}")
            steps = [s for s in batch if (host, s.step_id) not in self.runs]
            change = StatusChange(status=StepStatus.RUNNING)
            lease = Lease(silo=NODE, activation=host, heartbeat=utcnow()) if self.leases else None
            if self.unwritten_starts > 0:
                self.unwritten_starts -= 1
            else:
                await self.storage.update_steps(
                    [
                        StepUpdate(job_id, s.step_id, StepStatus.RUNNING, s.attempt, lease, change)
                        for s in steps
                    ]
                )
            for step in steps:
                self.runs[(host, step.step_id)] = Run(job_id, step, host)
            self.started.extend(steps)
            if self.die_after_running > 0:
                self.die_after_running -= 1
                self.restart(host)
                raise ConnectionError(f"{host} died as it started the steps (on purpose)")
            if self.lose_start_answers > 0:
                self.lose_start_answers -= 1
                raise ConnectionError(f"{host} restarted: the start may or may not have run")
        finally:
            self.in_flight -= len(batch)

    async def cancel(self, hosts: Collection[str], job_id: str, removing: bool) -> None:
        self.cancels.append((frozenset(hosts), removing))
        for run in self.runs.values():
            if run.host in hosts and run.job_id == job_id:
                run.cancelled = True
                run.removing = run.removing or removing

    def _see_epoch(self, job_id: str, epoch: int, batch: Sequence[StepStart] = ()) -> None:
        """As a real host: learns the newest epoch; refuses a start of an older one."""
        known = self.epochs.get(job_id, 0)
        if epoch and epoch < known and batch:
            self.stale.append((epoch, list(batch)))
            raise StaleActivationError(f"epoch {epoch} is older than {known}")
        self.epochs[job_id] = max(known, epoch)

    async def running(self, job_id: str, fence: bool = False, epoch: int = 0) -> dict[str, str]:
        self._see_epoch(job_id, epoch)
        if fence:
            self.fences[job_id] = self.fences.get(job_id, 0) + 1
            self.fenced.setdefault(job_id, asyncio.Event())
        if self.running_errors > 0:
            self.running_errors -= 1
            raise StepHostUnknownError("a host did not answer (fault injected on purpose)")
        running = {
            step_id: host
            for (host, step_id), run in self.runs.items()
            if run.job_id == job_id and host not in self.dead
        }
        self.answered.update((host, self.incarnation(host)) for host in running.values())
        return running

    def known_incarnation(self, host: str) -> str | None:
        return self.answered.get(host)

    async def watch(self, host: str, incarnation: str | None) -> None:
        self.watches.append((host, incarnation))
        if self.watch_errors > 0:
            self.watch_errors -= 1
            raise ConnectionError(f"watching {host} failed (fault injected on purpose)")
        current = self.incarnation(host)
        if host in self.dead or incarnation not in (None, current):
            return
        await self._gone.setdefault((host, current), asyncio.Event()).wait()

    def release(self, host: str) -> None:
        self.released.append(host)

    async def refresh(self) -> None:
        await asyncio.sleep(0)  # reads the node table, as a real one does: others run meanwhile

    async def warm(self) -> None:
        self.warmed += 1
        await self.refresh()

    async def activation_gone(self, activation: str) -> bool:
        return activation in self.dead

    # -- what the test decides ----------------------------------------------------------------

    def running_steps(self) -> list[Run]:
        return [run for run in self.runs.values() if run.host not in self.dead]

    def running_ids(self) -> set[str]:
        return {run.start.step_id for run in self.running_steps()}

    def kill(self, host: str, replace: bool = True) -> None:
        """The host dies: its steps are gone (storage keeps them RUNNING); its watch returns.
        A shared host is replaced by a new one (as a node's host is recreated)."""
        self.dead.add(host)
        if replace and host in self.shared:
            self.shared.append(f"host-{len(self.shared)}")
        self._lose(host)

    def incarnation(self, host: str) -> str:
        return f"{host}#{self.restarts.get(host, 0)}"

    def restart(self, host: str) -> None:
        """The host's process dies and comes back as a new incarnation: its steps are gone
        (storage keeps them RUNNING); watches of the old incarnation return."""
        self._lose(host)
        self.restarts[host] = self.restarts.get(host, 0) + 1

    def _lose(self, host: str) -> None:
        for key in [key for key in self.runs if key[0] == host]:
            del self.runs[key]
        self._gone.setdefault((host, self.incarnation(host)), asyncio.Event()).set()

    async def lift_fence(self, job_id: str) -> None:
        lifted = self.fenced.pop(job_id, None)
        if lifted is not None:
            lifted.set()

    def _find(self, step_id: str, host: str | None) -> tuple[str, str]:
        keys = [
            key
            for key in self.runs
            if key[1] == step_id and key[0] not in self.dead and host in (None, key[0])
        ]
        assert keys, f"step {step_id} runs nowhere"
        assert len(keys) == 1, f"step {step_id} runs on {len(keys)} hosts at once: {keys}"
        return keys[0]

    async def finish(
        self,
        step_id: str,
        status: StepStatus = SUCCESS,
        message: str | None = None,
        *,
        persist: bool = True,
        deliver: int = 1,
        host: str | None = None,
        code: str | None = None,
    ) -> Outcome:
        """The running step (on `host`, when it runs on several) ends with `status` (a
        failure with its signature, from `code` or `message`, as a real host makes it): persisted
        as a real host does (unless `persist=False`), then reported `deliver` times (0: the
        report is lost). It runs until its outcome is stored, as on a real host."""
        key = self._find(step_id, host)
        run = self.runs[key]
        if run.removing:
            status = STOPPED  # a step of a job being removed always reports its stop
        attempt = run.start.attempt
        outcome = (
            failed(step_id, attempt, status, message, code)
            if status in FAILED_STEP
            else Outcome(step_id, attempt, status, message)
        )
        if persist:
            await self.persist(run.job_id, outcome)
        del self.runs[key]
        for _ in range(deliver):
            delivered = await self.report(outcome)
            if delivered and run.removing and persist:
                # The job stored its stop: a removed step deletes its own record.
                await self._retrying(lambda: self.storage.delete_steps(run.job_id, [step_id]))
        return outcome

    async def persist(self, job_id: str, outcome: Outcome) -> None:
        """Writes the outcome as a real host does (once the job's fence is lifted), trying
        again while storage fails."""
        while (fence := self.fenced.get(job_id)) is not None:
            await fence.wait()
        await self._retrying(lambda: self._persist(job_id, outcome))

    async def _retrying(self, write: Callable[[], Awaitable[None]]) -> None:
        for _ in range(100):
            try:
                await write()
                return
            except StorageError:
                await asyncio.sleep(0)
        raise AssertionError("storage never took a host's write")

    async def _persist(self, job_id: str, outcome: Outcome) -> None:
        if outcome.status is SUCCESS:
            await self.storage.delete_steps(job_id, [outcome.step_id])
            return
        messages = () if outcome.message is None else (outcome.message,)
        change = StatusChange(status=outcome.status, exception_messages=messages)
        await self.storage.update_steps(
            [
                StepUpdate(
                    job_id,
                    outcome.step_id,
                    outcome.status,
                    outcome.attempt,
                    None,
                    change,
                    outcome.signature,
                )
            ]
        )

    async def report(self, *outcomes: Outcome) -> bool:
        """Delivers outcomes to the job; False (and the error recorded) when it refused them,
        as a real host would learn from its delivery."""
        assert self.core is not None, "no activation to report to"
        try:
            await self.core.report_outcomes(list(outcomes))
        except Exception as error:
            self.reports.append((list(outcomes), error))
            return False
        self.reports.append((list(outcomes), None))
        return True

    async def stop_cancelled(self) -> list[Outcome]:
        """Every step told to stop honours it: STOPPED, persisted and reported."""
        told = [run.start.step_id for run in self.running_steps() if run.cancelled]
        return [await self.finish(step_id, STOPPED) for step_id in told]

    async def finish_all(self, status: StepStatus = SUCCESS) -> list[Outcome]:
        return [await self.finish(step_id, status) for step_id in sorted(self.running_ids())]


class FaultyStorage(MemoryStorage):
    """Memory storage with faults injected on purpose: `fail("save_job", 2)` makes the next two
    `save_job` calls raise; `ack_lost("save_job")` makes the next one write and then raise (a
    lost acknowledgement); `gate("save_job", event)` makes calls wait for the event first.
    `calls` counts every call by method name."""

    FAULTABLE = (
        "get_job",
        "save_job",
        "update_steps",
        "delete_steps",
        "count_by_status",
        "has_steps",
        "get_steps",
        "list_steps",
        "add_counted",
        "remove_counted",
        "remove_job_steps",
        "remove_job_counted",
        "remove_job",
    )

    def __init__(self) -> None:
        super().__init__()
        self.failures: dict[str, int] = {}
        self.lost_acks: dict[str, int] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.calls: dict[str, int] = {}
        self.error: type[Exception] = StorageUnavailableError

    def fail(self, method: str, times: int = 1) -> None:
        assert method in self.FAULTABLE
        self.failures[method] = times

    def ack_lost(self, method: str, times: int = 1) -> None:
        assert method in self.FAULTABLE
        self.lost_acks[method] = times

    def gate(self, method: str, event: asyncio.Event) -> None:
        self.gates[method] = event

    async def _before(self, method: str) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1
        gate = self.gates.get(method)
        if gate is not None:
            await gate.wait()
        if self.failures.get(method, 0) > 0:
            self.failures[method] -= 1
            raise self.error(f"{method} failed (fault injected on purpose)")

    def _after(self, method: str) -> None:
        if self.lost_acks.get(method, 0) > 0:
            self.lost_acks[method] -= 1
            raise self.error(f"{method} wrote, then its answer was lost (fault injected)")

    async def get_job(self, job_id: str) -> JobState | None:
        await self._before("get_job")
        return await super().get_job(job_id)

    async def save_job(self, job: JobState) -> JobState:
        await self._before("save_job")
        saved = await super().save_job(job)
        self._after("save_job")
        return saved

    async def update_steps(self, updates: Sequence[StepUpdate]) -> None:
        await self._before("update_steps")
        await super().update_steps(updates)
        self._after("update_steps")

    async def delete_steps(
        self, job_id: str, step_ids: Collection[str], outputs: Sequence[StoredOutput] = ()
    ) -> None:
        await self._before("delete_steps")
        await super().delete_steps(job_id, step_ids, outputs)
        self._after("delete_steps")

    async def count_by_status(self, job_id: str) -> StatusCounts:
        await self._before("count_by_status")
        return await super().count_by_status(job_id)

    async def has_steps(self, job_id: str, stage: int, statuses: Collection[StepStatus]) -> bool:
        await self._before("has_steps")
        return await super().has_steps(job_id, stage, statuses)

    async def get_steps(self, job_id: str, step_ids: Collection[str]) -> dict[str, StepState]:
        await self._before("get_steps")
        return await super().get_steps(job_id, step_ids)

    async def list_steps(
        self,
        job_id: str,
        *,
        statuses: Collection[StepStatus] | None = None,
        stage: int | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> list[StepState]:
        await self._before("list_steps")
        return await super().list_steps(
            job_id, statuses=statuses, stage=stage, after=after, limit=limit
        )

    async def add_counted(self, job_id: str, kind: CountedKind, step_ids: Collection[str]) -> None:
        await self._before("add_counted")
        await super().add_counted(job_id, kind, step_ids)
        self._after("add_counted")

    async def remove_counted(self, job_id: str, kind: CountedKind, step_id: str) -> None:
        await self._before("remove_counted")
        await super().remove_counted(job_id, kind, step_id)
        self._after("remove_counted")

    async def remove_job_steps(self, job_id: str) -> None:
        await self._before("remove_job_steps")
        await super().remove_job_steps(job_id)
        self._after("remove_job_steps")

    async def remove_job_counted(self, job_id: str) -> None:
        await self._before("remove_job_counted")
        await super().remove_job_counted(job_id)
        self._after("remove_job_counted")

    async def remove_job(self, job_id: str) -> None:
        await self._before("remove_job")
        await super().remove_job(job_id)
        self._after("remove_job")


class RecordingMetrics:
    """`core.metrics.Metrics` that keeps every call, in order, for the test to read."""

    enabled = True

    def __init__(self) -> None:
        self.counts: list[tuple[Counter, int, Labels]] = []
        self.observations: list[tuple[Histogram, float, Labels, str]] = []
        self.gauges: list[tuple[int, Labels, JobStatus]] = []
        #: Counts of tagged counters by (counter, tag), beside `counts`.
        self.tagged: dict[tuple[Counter, str], int] = {}

    def count(self, counter: Counter, value: int, labels: Labels, tag: str = "") -> None:
        self.counts.append((counter, value, labels))
        if tag:
            self.tagged[counter, tag] = self.tagged.get((counter, tag), 0) + value

    def observe(self, histogram: Histogram, value: float, labels: Labels, tag: str) -> None:
        self.observations.append((histogram, value, labels, tag))

    def jobs(self, value: int, labels: Labels, status: JobStatus) -> None:
        self.gauges.append((value, labels, status))

    def total(self, counter: Counter) -> int:
        return sum(value for name, value, _ in self.counts if name is counter)

    def calls(self, counter: Counter) -> list[int]:
        """The values of every call of `counter`, in order."""
        return [value for name, value, _ in self.counts if name is counter]

    def observed(self, histogram: Histogram, tag: str) -> list[float]:
        return [v for name, v, _, t in self.observations if name is histogram and t == tag]
