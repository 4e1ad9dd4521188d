"""The systems the harness measures, each as one function: the durable job, bare Ray tasks,
one detached actor per step, the storage ceiling, a resume after the job actor is killed, and
the latency of a 1-step job. `harness.py` runs them in rounds.

A durable job's time ends when its record says it ended: the time of its terminal status
change, which the job stores (one machine, one clock: the bench runs a local Ray). The driver
polls the record through the jobs-manager actor every `POLL_SECONDS`, then each poll 1.5 times
later, up to `POLL_MAX_SECONDS`: a poll every 10 ms is a storage read in the jobs manager
each time, about a tenth of a CPU taken from the job it times. A 1-step job's latency is
what a poll every `POLL_SECONDS` sees (`JobsManager.wait` backs off to 0.5 s, too coarse).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import statistics
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ray
from pydantic import BaseModel

import choreography_ray as cr
from choreography_ray.bench.results import ActorSample, CeilingRun, LatencyResult, ResumeRun
from choreography_ray.bench.workloads import BenchItem, BenchJob, BenchRequest, BenchStep, Timing
from choreography_ray.core.planning import PLAN_WRITE
from choreography_ray.core.stopping import settled
from choreography_ray.model import Lease, StatusChange, utcnow
from choreography_ray.runtime.names import job_name, manager_name
from choreography_ray.runtime.process import gc_tuned
from choreography_ray.runtime.shared_storage import open_shared_storage
from choreography_ray.status import StepStatus
from choreography_ray.storage import (
    CountedKind,
    PlannedStep,
    StepUpdate,
    open_storage,
    redact_url,
)
from choreography_ray.types import type_path

#: Seconds between two polls of a job's record: the first (and, timing a latency, every) one.
POLL_SECONDS = 0.01
#: Seconds between two polls of a job's record at most, once backed off.
POLL_MAX_SECONDS = 0.1
#: Seconds between two timed 1-step jobs: jobs started one by one, each once the jobs manager
#: has its spare job actor ready (`spare_job_actors`), as a warm system starts them. Not a
#: multiple of the job actor's `EXIT_GRACE` (1 s): at a gap of exactly 1 s every timed start
#: met the previous job's actor exiting (its process torn down on a 2-core machine), which a
#: start at a random moment meets a few times in a hundred at a job a second
#: (docs/benchmarks.md).
LATENCY_GAP_SECONDS = 1.5
#: Seconds without a change of status or progress after which a job counts as stalled: five
#: watchdog intervals (60 s by default).
STALL_SECONDS = 300.0
#: Updates and deletes per bulk write: a step host's start batch and group commit.
WRITE_BATCH = cr.JobsOptions().step_batch_size


@dataclass
class Connection:
    """One storage's connection and the jobs manager the benchmark uses on it."""

    jobs: cr.Jobs
    manager: cr.JobsManager
    #: The manager's actor handle, for `status` polls that do not back off.
    handle: Any
    #: Seconds without a change after which a job counts as stalled.
    stall: float = STALL_SECONDS

    @classmethod
    def open(
        cls,
        storage: str,
        options: cr.JobsOptions,
        namespace: str,
        key: str,
        stall: float = STALL_SECONDS,
    ) -> Connection:
        jobs = cr.Jobs.connect(storage=storage, options=options, namespace=namespace)
        manager = jobs.manager("bench", key)
        handle = ray.get_actor(manager_name("bench", key), namespace=namespace)
        return cls(jobs, manager, handle, stall)

    @property
    def storage(self) -> str:
        return self.jobs.storage

    def status(self, job_id: str) -> cr.JobState:
        state: cr.JobState = ray.get(self.handle.status.remote(job_id))
        return state

    def await_spares(self, timeout: float) -> None:
        """Returns once the manager's spare job actors are ready (`spare_job_actors`), as a warm
        system has them: its next job does not share the machine with a new process starting.
        `TimeoutError` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while len(ray.get(self.handle.spares.remote())) < self.jobs.options.spare_job_actors:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no spare job actor ready after {timeout:g} s")
            time.sleep(POLL_MAX_SECONDS)

    def poll(
        self,
        job_id: str,
        until: Callable[[cr.JobState], bool],
        timeout: float,
        most: float = POLL_SECONDS,
    ) -> cr.JobState:
        """The job's record once `until` holds, polled every `POLL_SECONDS`, then each poll
        1.5 times later up to `most` seconds. `JobStalled` when neither its status nor its progress
        changed for `self.stall` seconds, `TimeoutError` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        delay = POLL_SECONDS
        seen: tuple[str, int] | None = None
        changed = time.monotonic()
        while True:
            state = self.status(job_id)
            if until(state):
                return state
            now = time.monotonic()
            if (state.status, _counted(state)) != seen:
                seen, changed = (state.status, _counted(state)), now
            elif now - changed > self.stall:
                raise JobStalled(state, now - changed)
            if now > deadline:
                raise TimeoutError(f"job {job_id} is still {state.status} after {timeout:g} s")
            time.sleep(delay)
            delay = min(delay * 1.5, most)

    def run_job(
        self,
        request: BaseModel,
        timeout: float,
        seen: bool = False,
        job_type: type[cr.Job[Any]] = BenchJob,
    ) -> tuple[float, str, cr.JobState]:
        """Seconds from `start` to the terminal status the job stored (`seen`: to the poll
        that saw it, every `POLL_SECONDS`; a stalled job: to its last change), the status as
        reported (`status_of`), and the final record."""
        began, began_at = time.perf_counter(), utcnow()
        started = self.manager.start(job_type, request)
        try:
            most = POLL_SECONDS if seen else POLL_MAX_SECONDS
            state = self.poll(started.job_id, _settled, timeout, most)
        except JobStalled as stalled:
            seconds = time.perf_counter() - began - stalled.seconds
            return seconds, status_of(stalled.state, stalled=True), stalled.state
        if seen:
            return time.perf_counter() - began, status_of(state), state
        return (state.status_since - began_at).total_seconds(), status_of(state), state


class JobStalled(Exception):
    """A job whose status and progress stopped changing before it settled."""

    def __init__(self, state: cr.JobState, seconds: float) -> None:
        super().__init__(
            f"job {state.id} stalled in {state.status} at {_counted(state):,} of "
            f"{state.progress.total_steps:,} steps counted: no change for {seconds:.0f} s"
        )
        self.state = state
        self.seconds = seconds


def status_of(state: cr.JobState, stalled: bool = False) -> str:
    """The stored status name, or "stalled in <status>"."""
    return f"stalled in {state.status}" if stalled else str(state.status)


def _settled(state: cr.JobState) -> bool:
    return settled(state)


def _counted(state: cr.JobState) -> int:
    return state.progress.successful_steps + state.progress.failed_steps


# -- bare Ray ---------------------------------------------------------------------------------


@ray.remote
def _task(ms: float) -> None:
    if ms:
        time.sleep(ms / 1000)


def bare_tasks(steps: int, step_ms: float = 0.0) -> float:
    """Seconds to submit `steps` tasks, each sleeping `step_ms` (as a step does with
    `--step-ms`; a task holds its CPU while it sleeps), and gather their results."""
    began = time.perf_counter()
    ray.get([_task.remote(step_ms) for _ in range(steps)])
    return time.perf_counter() - began


@ray.remote
class _StepActor:
    def run(self) -> None:
        return None


def actor_per_step(sample: int, window: int, namespace: str) -> float:
    """Seconds to create `sample` detached actors, call each once and kill it, with at most
    `window` created and not yet answered at any time."""
    prefix = f"bench-step/{uuid.uuid4().hex[:8]}"
    in_flight: dict[Any, Any] = {}
    created = 0
    began = time.perf_counter()
    while created < sample or in_flight:
        while created < sample and len(in_flight) < window:
            actor = _StepActor.options(  # type: ignore[attr-defined]
                name=f"{prefix}/{created}", namespace=namespace, lifetime="detached"
            ).remote()
            in_flight[actor.run.remote()] = actor
            created += 1
        done, _ = ray.wait(list(in_flight), num_returns=1)
        for ref in done:
            ray.get(ref)
            ray.kill(in_flight.pop(ref))
    return time.perf_counter() - began


def actor_sample(repeat: int, sample: int, window: int, namespace: str) -> ActorSample:
    seconds = actor_per_step(sample, window, namespace)
    return ActorSample(repeat=repeat, sample=sample, window=window, seconds=seconds)


# -- the storage ceiling ----------------------------------------------------------------------


async def _ceiling(url: str, steps: int, leases: bool) -> tuple[float, float, float]:
    """The seconds of the storage calls alone; the records are built a chunk of `PLAN_WRITE`
    at a time, outside the timed calls, so a ceiling of 10,000,000 steps fits in memory."""
    storage = open_storage(url)
    job_id = f"ceiling-{uuid.uuid4().hex}"
    width = max(6, len(str(steps)))
    now = utcnow()
    request = BenchItem().model_dump_json()
    step_type = type_path(BenchStep)
    lease = Lease(silo="bench", activation="bench#1", heartbeat=now) if leases else None
    running = StatusChange(status=StepStatus.RUNNING)

    def chunks() -> Iterator[list[str]]:
        for offset in range(0, steps, PLAN_WRITE):
            yield [f"{i:0{width}d}" for i in range(offset, min(steps, offset + PLAN_WRITE))]

    seconds = [0.0, 0.0, 0.0]

    async def timed(phase: int, call: Awaitable[None]) -> None:
        began = time.perf_counter()
        await call
        seconds[phase] += time.perf_counter() - began

    try:
        await storage.count_counted(job_id, CountedKind.COMPLETED)  # connects; untimed
        for ids in chunks():
            records = [PlannedStep(step_id, step_type, 0, request) for step_id in ids]
            await timed(0, storage.insert_plan(job_id, records))
        for ids in chunks():
            updates = [StepUpdate(job_id, i, StepStatus.RUNNING, 1, lease, running) for i in ids]
            for offset in range(0, len(ids), WRITE_BATCH):
                await timed(1, storage.update_steps(updates[offset : offset + WRITE_BATCH]))
        for ids in chunks():
            for offset in range(0, len(ids), WRITE_BATCH):
                await timed(2, storage.delete_steps(job_id, ids[offset : offset + WRITE_BATCH]))
        await storage.remove_job_steps(job_id)
    finally:
        await storage.close()
    return seconds[0], seconds[1], seconds[2]


def storage_ceiling(repeat: int, url: str, steps: int, leases: bool) -> CeilingRun:
    """The plan's bulk insert (`insert_plan`, `PLAN_WRITE` per call), update to RUNNING with a
    status change and, when leases are on, a lease (`WRITE_BATCH` per call), then delete
    (`WRITE_BATCH` per call), with the garbage collector tuned as in the job's processes."""
    with gc_tuned():  # as in the job's own processes
        insert, update, delete = asyncio.run(_ceiling(url, steps, leases))
    return CeilingRun(
        repeat=repeat,
        steps=steps,
        storage=redact_url(url),
        insert_seconds=insert,
        update_seconds=update,
        delete_seconds=delete,
    )


# -- resume after the job actor is killed -----------------------------------------------------


def _sqlite_path(url: str) -> Path | None:
    prefix = "sqlite:///"
    return Path(url[len(prefix) :]) if url.startswith(prefix) else None


def _sqlite_sizes(path: Path) -> tuple[int, int]:
    """(bytes of the `job_counted_steps` B-trees, bytes of the file), after a checkpoint."""
    with contextlib.closing(sqlite3.connect(path)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        row = connection.execute(
            "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name IN "
            "(SELECT name FROM sqlite_schema WHERE tbl_name = 'job_counted_steps')"
        ).fetchone()
    return int(row[0]), path.stat().st_size


def _start_in_background(
    connection: Connection, request: BenchRequest
) -> tuple[threading.Thread, dict[str, Any]]:
    """Calls `start` on a thread; the dict gets the `StartedJob` or the error it raised."""
    answer: dict[str, Any] = {}

    def call() -> None:
        try:
            answer["started"] = connection.manager.start(BenchJob, request)
        except Exception as error:  # the job actor died under the call: expected here
            answer["error"] = error

    thread = threading.Thread(target=call, name="bench-start", daemon=True)
    thread.start()
    return thread, answer


def _new_job(
    connection: Connection, known: set[str], answer: dict[str, Any], timeout: float
) -> str:
    """The id of the job being started: from `start`'s answer, or from the manager's list while
    `start` is still running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "started" in answer:
            job_id: str = answer["started"].job_id
            return job_id
        if "error" in answer:
            raise answer["error"]
        new = [job.id for job in connection.manager.list() if job.id not in known]
        if new:
            return new[0]
        time.sleep(POLL_SECONDS)
    raise TimeoutError(f"no job started within {timeout:g} s")


def resume_halfway(
    connection: Connection, repeat: int, request: BenchRequest, timeout: float
) -> ResumeRun:
    """Starts the job, kills its job actor once its saved progress shows half its steps
    counted (Ray restarts it and it resumes from storage), and waits for a terminal status.

    `start` returns once the first wave of steps has started, and with no-op steps the job
    runs most of its steps meanwhile, so the job is watched (and killed) while `start` may
    still be running on a thread. The progress is saved every `progress_save_interval`
    (250 ms): a job of a few seconds is killed later than half way, or not at all (`killed`
    False); time this scenario with 100,000 steps."""
    steps = request.steps
    path = _sqlite_path(connection.storage)
    before = _sqlite_sizes(path) if path else None
    known = {job.id for job in connection.manager.list()}
    began = time.perf_counter()
    starter, answer = _start_in_background(connection, request)
    job_id = _new_job(connection, known, answer, timeout)
    state = connection.poll(
        job_id, lambda s: _settled(s) or _counted(s) >= steps / 2, timeout=timeout
    )
    killed_at: float | None = None
    killed_on: datetime | None = None
    start_returned = "started" in answer
    if not _settled(state):
        with contextlib.suppress(ValueError):  # the actor exited: the job ended meanwhile
            actor = ray.get_actor(job_name(job_id), namespace=connection.jobs.namespace)
            killed_on = datetime.now(UTC)
            ray.kill(actor, no_restart=False)
            killed_at = time.perf_counter()
    progress_at_kill = _counted(state) / steps
    stalled = False
    try:
        state = connection.poll(job_id, _settled, timeout=timeout)
        ended = time.perf_counter()
    except JobStalled as error:
        state, stalled, ended = error.state, True, time.perf_counter() - error.seconds
    starter.join(timeout=connection.stall)
    if killed_on is not None and state.status_changes[-1].occurred <= killed_on:
        killed_at = None  # the job had ended: its saved progress lagged behind
    counted = asyncio.run(_count_counted(connection, job_id))
    run = ResumeRun(
        repeat=repeat,
        steps=steps,
        storage=redact_url(connection.storage),
        seconds=ended - began,
        killed=killed_at is not None,
        start_returned_before_kill=start_returned,
        seconds_after_kill=None if killed_at is None else ended - killed_at,
        progress_at_kill=None if killed_at is None else progress_at_kill,
        status=status_of(state, stalled),
        successful_steps=state.progress.successful_steps,
        failed_steps=state.progress.failed_steps,
        counted_records=counted,
    )
    if path and before:
        after = _sqlite_sizes(path)
        run.db_file_growth_bytes = after[1] - before[1]
        if counted:
            run.bytes_per_counted_record = (after[0] - before[0]) / counted
    return run


async def _count_counted(connection: Connection, job_id: str) -> int:
    storage = open_shared_storage(connection.storage, connection.jobs.namespace)
    try:
        return await storage.count_counted(job_id, CountedKind.COMPLETED)
    finally:
        await storage.close()


# -- latency ----------------------------------------------------------------------------------


#: A 1-step job's marks for `--breakdown`: its stored status changes, its step's perform (the
#: step's output: `workloads.Timing`), and when `start` and `wait` returned.
MARKS = (
    "PreparingJob stored",
    "PreparingSteps stored (activated, prepared, plan inserted)",
    "StartingSteps stored",
    "perform began (start RPC, host)",
    "perform ended",
    "Running stored (first wave answered)",
    "CompletedSuccessfully stored",
    "start returned",
    "wait returned",
)


def latency(
    connection: Connection, runs: int, timeout: float, breakdown: bool = False
) -> LatencyResult:
    """`runs` 1-step jobs timed by polling, alternating with `runs` timed by `manager.wait`,
    after one untimed job; `breakdown`: the waited jobs' marks (`MARKS`) too."""
    request = BenchRequest(steps=1)
    connection.run_job(request, timeout)
    polled: list[float] = []
    waited: list[float] = []
    marks: dict[str, list[float]] = {mark: [] for mark in MARKS}
    for _ in range(runs):
        time.sleep(LATENCY_GAP_SECONDS)
        seconds, status, _ = connection.run_job(request, timeout, seen=True)
        if status.startswith("stalled"):
            raise RuntimeError(f"a 1-step job {status}")
        polled.append(seconds)
        time.sleep(LATENCY_GAP_SECONDS)
        began, wall = time.perf_counter(), time.time()
        started = connection.manager.start(BenchJob, BenchRequest(steps=1, timed=breakdown))
        returned = time.perf_counter()
        state = connection.manager.wait(started.job_id, timeout=timeout)
        waited.append(time.perf_counter() - began)
        if breakdown:
            (output,) = connection.manager.outputs(started.job_id)
            timing = output.output_as(Timing)
            stored = {str(c.status): c.occurred.timestamp() - wall for c in state.status_changes}
            at = [
                stored.get("PreparingJob"),
                stored.get("PreparingSteps"),
                stored.get("StartingSteps"),
                timing.began - wall,
                timing.ended - wall,
                stored.get("Running"),
                stored.get("CompletedSuccessfully"),
                returned - began,
                waited[-1],
            ]
            for mark, seconds_at in zip(MARKS, at, strict=True):
                if seconds_at is not None:
                    marks[mark].append(seconds_at)
    deciles = statistics.quantiles(polled, n=10, method="inclusive") if runs > 1 else polled * 9
    centiles = statistics.quantiles(polled, n=100, method="inclusive") if runs > 1 else polled
    return LatencyResult(
        storage=redact_url(connection.storage),
        runs=runs,
        p50_seconds=statistics.median(polled),
        p90_seconds=deciles[-1],
        p99_seconds=centiles[-1],
        min_seconds=min(polled),
        max_seconds=max(polled),
        wait_p50_seconds=statistics.median(waited),
        samples=polled,
        wait_samples=waited,
        breakdown=dict(
            sorted(
                ((mark, statistics.median(at)) for mark, at in marks.items() if at),
                key=lambda item: item[1],
            )
        ),
    )
