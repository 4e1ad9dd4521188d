"""The scheduler's soak (issue 36): one seed is one run of three `SchedulerCore`s in turn on a
real SQLite file (or the memory storage), in real time, with a jobs port whose jobs end at
random, whose starts fail or lose their answer at random, and an operator who triggers,
requeues and acknowledges at random. In each run:

- **a restart**: a successor incarnation (`soak/0002`) takes the lease at once while its
  predecessor (`soak/0001`) keeps running its loops for a while, believing by its own clock
  that it still holds the lock (Ray restarts an actor whose old process may still be alive);
- **a takeover**: the successor's clock freezes (a paused process) and its renewals stop, so
  another cluster's scheduler (`other/0001`) takes the lease once it expires on the
  database's clock, while the frozen one keeps running its loops, still believing it holds it.

The fence (`SchedulerStorage.fenced`) is what keeps the two stale holders from writing. Then
every manifest is disabled and the runs drain. Checked: no run started twice (a second job
for a run), every started job is its run's, at most one awaiting dead letter and one queued
manifest-keyed entry per manifest. `python -m tests.chaos.scheduler_soak --seed 5000 --runs
30` prints one line per seed and the totals (docs/chaos.md, "The scheduler's soak")."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from choreography_ray.errors import SchedulerOperationError
from choreography_ray.scheduler.core import SchedulerCore
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.port import DispatchError, JobView
from choreography_ray.scheduler.schedules import After, Every
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus, WorkStatus
from choreography_ray.status import JobStatus
from choreography_ray.storage import open_storage
from choreography_ray.storage.scheduler import SchedulerStorage, scheduler_storage
from tests.mongo_proxy import start_nx
from tests.support import free_port

SCOPE = "soak"
OPTIONS = SchedulerOptions(
    manifest_cycle=0.05, dispatch_interval=0.03, default_retry_delay=0.05,
    max_retry_delay=0.4, dispatch_retry_delay=0.05, max_dispatch_retry_delay=0.2,
    lock_ttl=0.6, dispatch_timeout=0.5, run_cleanup_interval=1, runs_kept=20,
    run_retention=2, dead_letter_retention=1,
)  # fmt: skip
#: Seconds of each phase: the first holder alone, the stale predecessor beside its successor,
#: the successor alone, the frozen successor beside the other cluster's, the last alone.
PHASES = (2.0, 0.8, 2.0, 1.5, 2.0)
DRAIN = 8.0


@dataclass
class Job:
    ends_at: float
    status: JobStatus
    run_id: str | None


@dataclass
class SoakJobs:
    """Jobs in real time: each ends after a drawn time as drawn (its job type's odds)."""

    rng: random.Random
    storage: SchedulerStorage
    jobs: dict[str, Job] = field(default_factory=dict)
    started_by_run: dict[str, list[str]] = field(default_factory=dict)
    attempts: int = 0

    async def start_job(
        self,
        scope: str,
        namespace: str,
        job_type: str,
        request: dict[str, Any],
        job_id: str,
        resume_after: Any = None,
    ) -> str:
        self.attempts += 1
        if job_id in self.jobs:
            raise DispatchError(f"job {job_id} exists already", reached=False)
        if self.rng.random() < 0.05:
            raise DispatchError("the jobs manager did not answer", reached=False)
        run = await self.storage.run_for_job(job_id)
        odds = {"soak:ok": 0.95, "soak:flaky": 0.5, "soak:bad": 0.0, "soak:slow": 0.9}[job_type]
        ends = JobStatus.COMPLETED_SUCCESSFULLY if self.rng.random() < odds else JobStatus.FAILED
        lasts = 1.2 if job_type == "soak:slow" else self.rng.uniform(0.0, 0.3)
        self.jobs[job_id] = Job(time.monotonic() + lasts, ends, run.id if run else None)
        if run is not None:
            self.started_by_run.setdefault(run.id, []).append(job_id)
        if self.rng.random() < 0.05:
            raise TimeoutError("the answer was lost")
        return job_id

    async def job_views(self, job_ids: Any) -> dict[str, JobView]:
        now = time.monotonic()
        views = {}
        for job_id in job_ids:
            if (job := self.jobs.get(job_id)) is not None:
                done = job.status is JobStatus.STOPPED or now >= job.ends_at
                status = job.status if done else JobStatus.RUNNING
                views[job_id] = JobView(status, stop_finalized=status is JobStatus.STOPPED)
        return views

    async def stop_job(self, scope: str, namespace: str, job_id: str) -> None:
        self.jobs[job_id].status = JobStatus.STOPPED

    async def release_job(self, scope: str, namespace: str, job_type: str, job_id: str) -> None:
        return None

    def checkpoint_stages(self, job_type: str) -> bool:
        return False


class Refusals(logging.Handler):
    """Counts the writes the fence refused (a stale holder finding its lease gone)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "no longer holds the lease" in record.getMessage():
            self.count += 1


def core(
    storage: SchedulerStorage, jobs: SoakJobs, holder: str, clock: Any = None
) -> SchedulerCore:
    return SchedulerCore(
        SCOPE, storage, jobs, OPTIONS, holder=holder, monotonic=clock or time.monotonic
    )


async def operator(rng: random.Random, cores: list[SchedulerCore], stop: asyncio.Event) -> int:
    """Random operations on the newest scheduler; how many it made."""
    made = 0
    while not stop.is_set():
        await asyncio.sleep(rng.uniform(0.05, 0.3))
        sched = cores[-1]
        try:
            letters = await sched.dead_letters(status=DeadLetterStatus.AWAITING_INTERVENTION)
            draw = rng.random()
            if letters and draw < 0.4:
                await sched.requeue(rng.choice(letters).id, ask_afresh=rng.random() < 0.3)
            elif letters and draw < 0.6:
                await sched.acknowledge(rng.choice(letters).id, "soak")
            elif draw < 0.85:
                await sched.trigger(rng.choice(["ok", "flaky", "bad", "slow"]))
            elif finished := [r for r in await sched.runs() if r.status.is_finished]:
                await sched.requeue_execution(rng.choice(finished).id)
            made += 1
        except SchedulerOperationError:
            pass  # refused (not the holder, dead-lettered, resolved meanwhile): fine
    return made


async def run_seed(seed: int, storage_kind: str = "sqlite", server: str = "") -> dict[str, Any]:
    """One run on `storage_kind`: a SQLite file, the memory storage, or (with `server`, a
    MongoDB URL without a database) a database of its own on that server."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as home:
        url = {
            "sqlite": f"sqlite:///{Path(home) / 'soak.db'}",
            "memory": "memory://",
            "mongodb": f"{server.rstrip('/')}/soak_{seed}",
        }[storage_kind]
        opened = open_storage(url)
        storage = scheduler_storage(opened)
        jobs = SoakJobs(rng, storage)
        refusals = Refusals()
        logging.getLogger("choreography_ray").addHandler(refusals)
        try:
            return await _soak(seed, rng, storage, jobs, refusals)
        finally:
            logging.getLogger("choreography_ray").removeHandler(refusals)
            await opened.close()


async def _soak(
    seed: int, rng: random.Random, storage: SchedulerStorage, jobs: SoakJobs, refusals: Refusals
) -> dict[str, Any]:
    first = core(storage, jobs, "soak/0001")
    await first.start()
    for name, kind in (("ok", "ok"), ("flaky", "flaky"), ("bad", "bad"), ("slow", "slow")):
        await first.schedule(
            name,
            f"soak:{kind}",
            {},
            Every.seconds(rng.uniform(0.2, 0.6)),
            max_retries=rng.randint(0, 2),
            timeout=timedelta(seconds=0.4) if kind == "slow" else None,
        )
    await first.schedule("after", "soak:flaky", {}, After(parent="ok"), max_retries=1)
    cores, stop = [first], asyncio.Event()
    operating = asyncio.create_task(operator(rng, cores, stop))
    await asyncio.sleep(PHASES[0])

    # The restart: the successor takes the lease at once; the predecessor runs on a while.
    successor_clock = _Freezable()
    successor = core(storage, jobs, "soak/0002", successor_clock)
    await successor.start()
    cores.append(successor)
    await asyncio.sleep(PHASES[1])
    first.tasks.cancel_all()  # the old process dies at last, its lease never released
    await asyncio.sleep(PHASES[2])

    # The takeover: the successor's clock freezes and its renewals stop; its loops run on.
    successor_clock.freeze()
    for task in list(successor.tasks.tasks):
        if task.get_name().endswith(": lock"):
            task.cancel()
    other = core(storage, jobs, "other/0001")
    await other.start()  # waits for the lease to expire on the database's clock
    cores.append(other)
    await asyncio.sleep(PHASES[3])
    successor.tasks.cancel_all()
    await asyncio.sleep(PHASES[4])

    stop.set()
    operations = await operating
    for name in ("ok", "flaky", "bad", "slow", "after"):
        await _retrying(lambda n=name: other.schedule(n, "soak:x", {}, Every.hours(1),
                                                       enabled=False))  # fmt: skip
    drained = await _drain(storage, DRAIN)
    await other.close()
    return await _verdict(seed, storage, jobs, refusals, operations, drained, other)


class _Freezable:
    """A monotonic clock that stands still once frozen (a paused process)."""

    def __init__(self) -> None:
        self._frozen: float | None = None

    def freeze(self) -> None:
        self._frozen = time.monotonic()

    def __call__(self) -> float:
        return self._frozen if self._frozen is not None else time.monotonic()


async def _retrying(operation: Any) -> None:
    for _ in range(20):  # the newest holder may still be taking its lease
        try:
            await operation()
            return
        except SchedulerOperationError:
            await asyncio.sleep(0.2)


async def _drain(storage: SchedulerStorage, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        runs = await storage.list_runs(SCOPE, limit=10_000)
        if all(r.status.is_finished for r in runs):
            return True
        await asyncio.sleep(0.2)
    return False


async def _verdict(
    seed: int,
    storage: SchedulerStorage,
    jobs: SoakJobs,
    refusals: Refusals,
    operations: int,
    drained: bool,
    last: SchedulerCore,
) -> dict[str, Any]:
    runs = await storage.list_runs(SCOPE, limit=10_000)
    violations = [f"run {r} started {len(j)} jobs" for r, j in jobs.started_by_run.items()
                  if len(j) > 1]  # fmt: skip
    for job_id, job in jobs.jobs.items():
        owner = await storage.run_for_job(job_id)
        if job.run_id is None or (owner is not None and owner.id != job.run_id):
            violations.append(f"job {job_id} is no run's")
    letters = await storage.list_dead_letters(SCOPE)
    awaiting = [d.manifest for d in letters if d.status is DeadLetterStatus.AWAITING_INTERVENTION]
    if len(awaiting) != len(set(awaiting)):
        violations.append(f"two awaiting dead letters of one manifest: {awaiting}")
    keyed = [e.manifest for e in await storage.queued_entries(SCOPE) if e.holds_manifest_key
             and e.status is WorkStatus.QUEUED]  # fmt: skip
    if len(keyed) != len(set(keyed)):
        violations.append(f"two queued entries of one manifest: {keyed}")
    statuses = [r.status for r in runs]
    return {
        "seed": seed, "jobs_started": len(jobs.jobs), "start_attempts": jobs.attempts,
        "runs_kept": len(runs), "failed": statuses.count(RunStatus.FAILED),
        "cancelled": statuses.count(RunStatus.CANCELLED), "dead_letters": len(letters),
        "operations": operations, "fenced_writes_refused": refusals.count,
        "cleanup_ran": last.manager.cycles > 0, "drained": drained, "violations": violations,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--storage", choices=["sqlite", "memory", "mongodb"], default="sqlite")
    args = parser.parse_args(argv)
    logging.getLogger().addHandler(logging.NullHandler())  # quiet: the results speak
    logging.getLogger("choreography_ray").setLevel(logging.ERROR)
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(mongodb_server()) if args.storage == "mongodb" else ""
        return _runs(args.seed, args.runs, args.storage, server)


@contextlib.contextmanager
def mongodb_server() -> Iterator[str]:
    """The MongoDB of `CHOREOGRAPHY_MONGODB_URI`, else an nx-27017 server started here (and
    stopped by its pid): its URL without a database."""
    if uri := os.environ.get("CHOREOGRAPHY_MONGODB_URI"):
        yield uri
        return
    with tempfile.TemporaryDirectory() as home:
        server, url = start_nx(Path(home), free_port())
        try:
            yield url
        finally:
            server.terminate()
            server.wait(10)


def _runs(first: int, runs: int, storage: str, server: str) -> int:
    results = []
    for seed in range(first, first + runs):
        started = time.monotonic()
        result = asyncio.run(run_seed(seed, storage, server))
        result["seconds"] = round(time.monotonic() - started, 1)
        results.append(result)
        print(result, flush=True)
    bad = [r for r in results if r["violations"] or not r["drained"]]
    total = {
        k: sum(r[k] for r in results)
        for k in (
            "jobs_started",
            "start_attempts",
            "failed",
            "cancelled",
            "dead_letters",
            "operations",
            "fenced_writes_refused",
        )
    }
    print(f"{len(results)} runs, {len(bad)} with a violation or not drained; totals {total}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
