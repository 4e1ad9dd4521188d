"""How fast the dashboard answers: its pages over HTTP on a seeded storage, in one run.

    python benchmarks/dashboard.py                          # a temporary SQLite file
    python benchmarks/dashboard.py --storage mongodb://127.0.0.1:27017/bench
    python benchmarks/dashboard.py --keep /tmp/dash.db      # keep the file (and reuse it)

Seeds `--jobs` jobs (10,000: two scopes, three namespaces, two types, every outcome status,
created a minute apart) and one running job of `--steps` steps (100,000, in two stages) with
`--failed` failed steps (1,000, each with a message), all through the storage API. Then serves
the dashboard with uvicorn on a free loopback port and times each page `--repeat` times with
one HTTP client: the median and the slowest answer, and the page's size. Nothing here is a
test: the figures are printed (docs/dashboard.md quotes them).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import statistics
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import httpx
import uvicorn
from rich.console import Console
from rich.table import Table

from choreography_ray.dashboard import create_app
from choreography_ray.model import (
    JobProgress,
    JobsManagerKey,
    JobState,
    StageProgress,
    StatusChange,
    utcnow,
)
from choreography_ray.status import JobStatus, StepStatus
from choreography_ray.storage import (
    JobFilter,
    PlannedStep,
    StepUpdate,
    Storage,
    open_storage,
    redact_url,
)

BIG_JOB = "bench-big-job"
SCOPES = ("studio", "lab")
NAMESPACES = ("tenant-a", "tenant-b", "tenant-c")
TYPES = ("bench.jobs:RebuildIndex", "bench.jobs:EmbedDocuments")
#: Outcome statuses and their weights among the seeded jobs.
STATUSES = {
    JobStatus.COMPLETED_SUCCESSFULLY: 70,
    JobStatus.COMPLETED_WITH_FAILURES: 10,
    JobStatus.RUNNING: 8,
    JobStatus.STOPPED: 6,
    JobStatus.FAILED: 6,
}


async def seed_jobs(storage: Storage, count: int) -> None:
    random.seed(14)
    start = utcnow() - timedelta(minutes=count + 10)
    for scope in SCOPES:
        for namespace in NAMESPACES:
            await storage.add_manager_key(JobsManagerKey(scope=scope, namespace=namespace))
    statuses, weights = list(STATUSES), list(STATUSES.values())
    for n in range(count):
        status = random.choices(statuses, weights)[0]
        total = random.choice((10, 100, 1_000, 10_000))
        failed = 0 if status is JobStatus.COMPLETED_SUCCESSFULLY else max(total // 50, 1)
        done = total if status.is_terminal else total // 2
        stages = (StageProgress(stage=0, is_started=True, total_steps=total,
                                successful_steps=done - failed, failed_steps=failed),)  # fmt: skip
        progress = JobProgress(total_steps=total, successful_steps=done - failed,
                               failed_steps=failed, stages=stages)  # fmt: skip
        job = JobState(
            id=f"bench-{n:06d}", scope=SCOPES[n % 2], namespace=NAMESPACES[n % 3],
            type=TYPES[n % 2], created=start + timedelta(minutes=n), progress=progress,
            request={"index": f"index-{n}", "shards": [f"shard-{i}" for i in range(20)]},
        )  # fmt: skip
        for step in (JobStatus.PREPARING_JOB, JobStatus.PREPARING_STEPS, JobStatus.RUNNING):
            job = job.with_status(step)
        if status is not JobStatus.RUNNING:
            job = job.with_status(status)
        await storage.create_job(job)


async def seed_big_job(storage: Storage, steps: int, failed: int) -> None:
    """A running job of `steps` steps in two stages, `failed` of them failed with a message."""
    half = steps // 2
    stages = (
        StageProgress(stage=0, is_started=True, total_steps=half,
                      successful_steps=half - failed, failed_steps=failed),
        StageProgress(stage=10, is_started=True, total_steps=steps - half,
                      successful_steps=(steps - half) // 3),
    )  # fmt: skip
    progress = JobProgress(
        total_steps=steps, successful_steps=sum(s.successful_steps for s in stages),
        failed_steps=failed, stages=stages,
    )  # fmt: skip
    job = JobState(id=BIG_JOB, scope=SCOPES[0], namespace=NAMESPACES[0], type=TYPES[0],
                   created=utcnow() - timedelta(minutes=5), progress=progress, stage=10,
                   has_plan=True, request={"index": "big", "steps": steps})  # fmt: skip
    for status in (JobStatus.PREPARING_JOB, JobStatus.PREPARING_STEPS, JobStatus.RUNNING):
        job = job.with_status(status)
    await storage.create_job(job)
    plan = [PlannedStep(f"step-{i:07d}", "bench.jobs:Shard", 0 if i < half else 10, "{}")
            for i in range(steps)]  # fmt: skip
    for begin in range(0, steps, 10_000):
        await storage.insert_plan(BIG_JOB, plan[begin : begin + 10_000])
    every = max(half // failed, 1)
    updates = [
        StepUpdate(BIG_JOB, f"step-{i:07d}", StepStatus.FAILED, 3, change=StatusChange(
            status=StepStatus.FAILED, exception_messages=(f"shard {i} timed out after 3 "
                                                          "attempts: ConnectionResetError",)))
        for i in range(0, every * failed, every)
    ]  # fmt: skip
    await storage.update_steps(updates)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _time(client: httpx.Client, path: str, repeat: int) -> tuple[float, float, int]:
    """Median and slowest answer in milliseconds, and the page's bytes."""
    client.get(path).raise_for_status()  # warm: the first answer opens the connection
    took = []
    size = 0
    for _ in range(repeat):
        began = time.perf_counter()
        answer = client.get(path)
        took.append(1000 * (time.perf_counter() - began))
        answer.raise_for_status()
        size = len(answer.content)
    return statistics.median(took), max(took), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--storage", help="storage URL (default: a temporary SQLite file)")
    parser.add_argument("--keep", type=Path, help="an SQLite file to keep (reused if seeded)")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--failed", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        url = args.storage or f"sqlite:///{args.keep or Path(scratch) / 'dashboard.db'}"
        run(url, args)


def run(url: str, args: argparse.Namespace) -> None:
    console = Console()
    storage = open_storage(url)

    async def seed() -> None:
        if await storage.get_job(BIG_JOB) is None:
            began = time.perf_counter()
            await seed_jobs(storage, args.jobs)
            await seed_big_job(storage, args.steps, args.failed)
            took = time.perf_counter() - began
            console.print(f"seeded {args.jobs:,} jobs and a {args.steps:,}-step job with "
                          f"{args.failed:,} failed steps in {took:.0f} s")  # fmt: skip
        counts = await storage.count_jobs_by_type_and_status(JobFilter())
        console.print(f"{sum(counts.values()):,} jobs in {redact_url(url)}")

    asyncio.run(seed())
    port = _free_port()
    app = create_app(open_storage(url), token="bench", allowed_hosts=["127.0.0.1"])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="dashboard", daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    pages = {
        "jobs list, newest 50": "/",
        "jobs list, status FAILED": "/?status=FAILED",
        "jobs list, one scope and namespace, one type": f"/?scope={SCOPES[1]}&namespace="
        f"{NAMESPACES[2]}&type={TYPES[1]}",
        "jobs list, created in the last 24 h": "/?since=24h",
        "jobs list, 200 per page, page 2": None,
        f"job page, {args.steps:,} steps, {args.failed:,} failed": f"/jobs/{BIG_JOB}",
        "job page, failed steps page 2": f"/jobs/{BIG_JOB}?steps_after=step-0001200",
        "job page, live fragment": f"/jobs/{BIG_JOB}/live",
    }
    table = Table(title=f"Dashboard pages over HTTP ({args.repeat} answers each)",
                  title_justify="left")  # fmt: skip
    for column in ("page", "median ms", "slowest ms", "KiB"):
        table.add_column(column, justify="left" if column == "page" else "right")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for name, path in pages.items():
                if path is None:
                    path = _second_page(client)
                median, slowest, size = _time(client, path, args.repeat)
                table.add_row(name, f"{median:.1f}", f"{slowest:.1f}", f"{size / 1024:.0f}")
    finally:
        server.should_exit = True
        thread.join(10)
    console.print(table)


def _second_page(client: httpx.Client) -> str:
    """The 'older' link of the first page of 200."""
    page = client.get("/?limit=200").text
    start = page.index('rel="next"')
    link = page.rfind('href="', 0, start)
    return page[link + 6 : page.index('"', link + 6)].replace("&amp;", "&")


if __name__ == "__main__":
    main()
