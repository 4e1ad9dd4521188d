"""Sharing one cluster (`choreography-ray bench --sharing`, docs/sharing.md), in one local Ray:

- **small beside a backlog**: a 10-step job of one tenant alone, then beside another tenant's
  backlog (100,000 sync steps of the same length, 50 ms and 1 s by default); the goal is at
  most twice its time alone plus one second;
- **priority**: the same, the small job of the backlog's own tenant at priority 1, the backlog
  at 5;
- **weights**: two tenants backlogged, weights 3:1, their completed steps counted over windows
  of 10 s (goal: 3 ± 10 %);
- **a limit never reached**: 2,000 async steps of 20 ms of a type with `max_concurrent = 1000`
  against the same type without it, each warm, the median of 3 (goal: at least 0.8 of its
  speed).

Bare Ray tasks of the same length, run in the same Ray, are the anchor: a small job alone takes
about what its tasks take plus the job's own start.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

import choreography_ray as cr

#: Steps of the small job.
SMALL_STEPS = 10
#: Steps of a backlog, and of the jobs of the limit comparison.
BACKLOG_STEPS = 100_000
LIMIT_STEPS = 2_000
#: Rounds of the limit comparison, after a warm one; their median is reported.
LIMIT_ROUNDS = 3
#: The tenants' weights in the weights scenario.
HEAVY, LIGHT = "heavy", "light"
WEIGHTS = {HEAVY: 3.0}


class Nap(BaseModel):
    seconds: float


class Sleep(cr.JobStep[Nap]):
    def perform(self, request: Nap, context: cr.StepContext) -> cr.StepResult:
        time.sleep(request.seconds)
        return cr.StepResult.succeeded()


class AsyncSleep(cr.JobStep[Nap]):
    async def perform(self, request: Nap, context: cr.StepContext) -> cr.StepResult:
        await asyncio.sleep(request.seconds)
        return cr.StepResult.succeeded()


class LimitedAsyncSleep(AsyncSleep):
    max_concurrent = 1000


class NapsRequest(BaseModel):
    steps: int
    seconds: float
    tenant: str = ""
    step_type: str = "sync"


STEP_TYPES: dict[str, type[cr.JobStep[Any]]] = {
    "sync": Sleep,
    "async": AsyncSleep,
    "limited": LimitedAsyncSleep,
}


class Naps(cr.Job[NapsRequest]):
    def prepare_steps(self, request: NapsRequest) -> Iterator[cr.StepSpec]:
        step_type, nap = STEP_TYPES[request.step_type], Nap(seconds=request.seconds)
        for _ in range(request.steps):
            yield self.create_step(step_type, nap)

    def fairness_key(self, request: NapsRequest) -> str | None:
        return request.tenant or None


@ray.remote(num_cpus=0)
def _bare(seconds: float) -> None:
    time.sleep(seconds)


@dataclass
class SharingConfig:
    #: Seconds per step of the backlogs of the small-job scenario.
    step_seconds: tuple[float, ...] = (0.05, 1.0)
    #: Windows of the weights scenario, and their length.
    windows: int = 3
    window_seconds: float = 10.0
    timeout: float = 600.0


@dataclass
class SharingReport:
    config: dict[str, Any]
    #: Per step length: seconds of 10 bare tasks, the small job alone, beside the backlog, and
    #: at priority 1 beside a priority-5 backlog of its own tenant.
    small: list[dict[str, float]] = field(default_factory=list)
    #: Per window: the steps each tenant completed, and their ratio.
    windows: list[dict[str, float]] = field(default_factory=list)
    #: Seconds of the limit comparison: without the limit, with it.
    limit: dict[str, float] = field(default_factory=dict)


class _Bench:
    def __init__(self, jobs: cr.Jobs, timeout: float) -> None:
        self.jobs = jobs
        self.timeout = timeout

    def seconds(self, manager: cr.JobsManager, request: NapsRequest, **start: int) -> float:
        began = time.perf_counter()
        job_id = manager.start(Naps, request, **start).job_id
        state = manager.wait(job_id, timeout=self.timeout)
        if state.status is not cr.JobStatus.COMPLETED_SUCCESSFULLY:
            raise RuntimeError(f"the bench's job {job_id} ended {state.status}")
        return time.perf_counter() - began

    def backlog(self, manager: cr.JobsManager, request: NapsRequest, **start: int) -> str:
        """Starts a backlog; returns once its steps run."""
        job_id = manager.start(Naps, request, **start).job_id
        deadline = time.monotonic() + self.timeout
        while done(manager, job_id) < 100:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the backlog {job_id} did not get going")
            time.sleep(0.2)
        return job_id

    def remove(self, manager: cr.JobsManager, *job_ids: str) -> None:
        """Removes the jobs and returns once they are gone, so the next scenario has the
        hosts to itself."""
        for job_id in job_ids:
            manager.remove(job_id)
        deadline = time.monotonic() + self.timeout
        for job_id in job_ids:
            while True:
                try:
                    manager.get(job_id)
                except cr.JobOperationError:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the bench's job {job_id} was not removed")
                time.sleep(0.2)


def done(manager: cr.JobsManager, job_id: str) -> int:
    return manager.get(job_id).progress.successful_steps


def run(config: SharingConfig, log: Callable[[str], None] = print) -> SharingReport:
    from choreography_ray.bench import harness

    report = SharingReport(config=asdict(config))
    scratch = Path(tempfile.mkdtemp(prefix="choreography-bench-sharing-"))
    options = cr.JobsOptions(fairness_weights=WEIGHTS, spare_job_actors=1)
    try:
        with harness.local_ray():
            jobs = cr.Jobs.connect(
                storage=f"sqlite:///{scratch / 'bench.db'}",
                options=options,
                namespace=harness.RAY_NAMESPACE,
            )
            bench = _Bench(jobs, config.timeout)
            a, b = jobs.manager("bench", "tenant-a"), jobs.manager("bench", "tenant-b")
            log("warming up: Ray's workers, the step hosts, the managers' spare job actors")
            ray.get([_bare.remote(0) for _ in range(SMALL_STEPS)])
            for manager in (a, b):
                bench.seconds(manager, NapsRequest(steps=SMALL_STEPS, seconds=0))
            for seconds in config.step_seconds:
                small = NapsRequest(steps=SMALL_STEPS, seconds=seconds)
                backlog = NapsRequest(steps=BACKLOG_STEPS, seconds=seconds)
                log(f"{SMALL_STEPS} steps of {seconds:g} s: bare tasks, the job alone")
                began = time.perf_counter()
                ray.get([_bare.remote(seconds) for _ in range(SMALL_STEPS)])
                row = {"step_seconds": seconds, "bare": time.perf_counter() - began}
                row["alone"] = bench.seconds(b, small)
                log(f"... beside another tenant's backlog of {BACKLOG_STEPS:,}")
                big = bench.backlog(a, backlog)
                row["beside"] = bench.seconds(b, small)
                bench.remove(a, big)
                log("... at priority 1 beside a priority-5 backlog of its own tenant")
                big = bench.backlog(a, backlog, priority=5)
                row["priority"] = bench.seconds(a, small, priority=1)
                bench.remove(a, big)
                report.small.append(row)
            log(f"two tenants backlogged, weights 3:1, {config.windows} windows")
            report.windows = weighted_windows(bench, jobs.manager("bench", "weights"), config)
            log(f"{LIMIT_STEPS:,} async steps of 20 ms, without and with max_concurrent=1000")
            for name, step_type in (("without", "async"), ("with", "limited")):
                request = NapsRequest(steps=LIMIT_STEPS, seconds=0.02, step_type=step_type)
                bench.seconds(a, request)  # warm: the lane, the limiter, the gates
                rounds = [bench.seconds(a, request) for _ in range(LIMIT_ROUNDS)]
                report.limit[name] = statistics.median(rounds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


def weighted_windows(
    bench: _Bench, manager: cr.JobsManager, config: SharingConfig
) -> list[dict[str, float]]:
    """Both backlogs start at once (a start answers once its first wave of steps is on the
    hosts, and the second backlog's waits for its share of room); each window counts what
    each completed."""
    starts = [
        threading.Thread(
            target=manager.start,
            args=(Naps, NapsRequest(steps=BACKLOG_STEPS, seconds=0.05, tenant=tenant)),
            name=f"start {tenant}",
        )
        for tenant in (HEAVY, LIGHT)
    ]
    for thread in starts:
        thread.start()

    def counts() -> dict[str, int]:
        return {job.fairness_key: job.progress.successful_steps for job in manager.list()}

    windows: list[dict[str, float]] = []
    try:
        deadline = time.monotonic() + bench.timeout
        while len(now := counts()) < 2 or min(now.values()) < 100:
            if time.monotonic() > deadline:
                raise TimeoutError("the two backlogs did not get going")
            time.sleep(0.2)
        time.sleep(config.window_seconds / 2)  # both hold steps on every host
        before = counts()
        for _ in range(config.windows):
            time.sleep(config.window_seconds)
            after = counts()
            heavy, light = after[HEAVY] - before[HEAVY], after[LIGHT] - before[LIGHT]
            windows.append({HEAVY: heavy, LIGHT: light, "ratio": heavy / max(1, light)})
            before = after
    finally:
        for thread in starts:
            thread.join()
        bench.remove(
            manager, *(job.id for job in manager.list() if job.fairness_key in (HEAVY, LIGHT))
        )
    return windows


def print_report(report: SharingReport, console: Console) -> None:
    title = f"A {SMALL_STEPS}-step job beside a backlog of {BACKLOG_STEPS:,} sync steps"
    table = Table(title=title)
    for column in ("step", "bare tasks s", "alone s", "beside s", "goal s", "priority 1 s"):
        table.add_column(column, justify="right")
    for row in report.small:
        goal = 2 * row["alone"] + 1
        table.add_row(
            f"{row['step_seconds']:g} s",
            f"{row['bare']:.2f}",
            f"{row['alone']:.2f}",
            f"{row['beside']:.2f} ({row['beside'] / row['alone']:.1f}x)",
            f"{goal:.2f} {'met' if row['beside'] <= goal else 'MISSED'}",
            f"{row['priority']:.2f} {'met' if row['priority'] <= goal else 'MISSED'}",
        )
    console.print(table)
    if report.windows:
        weights = Table(title="Two tenants backlogged, weights 3:1 (steps per window)")
        for column in ("window", HEAVY, LIGHT, "ratio (goal 2.7-3.3)"):
            weights.add_column(column, justify="right")
        for n, window in enumerate(report.windows, 1):
            ratio = window["ratio"]
            met = "met" if 2.7 <= ratio <= 3.3 else "MISSED"
            weights.add_row(
                str(n), f"{window[HEAVY]:,.0f}", f"{window[LIGHT]:,.0f}", f"{ratio:.2f} {met}"
            )
        console.print(weights)
    if report.limit:
        speed = report.limit["without"] / report.limit["with"]
        console.print(
            f"{LIMIT_STEPS:,} async steps of 20 ms: {report.limit['without']:.2f} s without a "
            f"limit, {report.limit['with']:.2f} s under max_concurrent=1000: "
            f"{speed:.2f} of the speed (goal: at least 0.8, {'met' if speed >= 0.8 else 'MISSED'})"
        )
