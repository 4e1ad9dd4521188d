"""What a watchdog tick reads, per provider: each query timed once on a job of `--rows` records.

    python benchmarks/watchdog_queries.py                       # a temporary SQLite file
    python benchmarks/watchdog_queries.py mongodb://127.0.0.1:27017/bench --rows 1000000

The job has one stage of `--rows` SCHEDULED records, `--active` of them RUNNING. Timed: the
recount (`count_by_status`), whether the stage has an unfinished record (`has_steps`, one stage
with some and one without), the active steps' records by id (`get_steps`), a paged read of the
stage's RUNNING records, and, for comparison, what a tick read before `get_steps`: every
record of the stage, paged. The job's records are removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from choreography_ray.status import UNFINISHED_STEP, StepStatus
from choreography_ray.storage import PlannedStep, StepUpdate, open_storage, redact_url, step_pages

#: Records per `insert_plan` call while the job is laid out.
PLAN_BATCH = 10_000


async def _timed(name: str, work: Awaitable[Any]) -> None:
    began = time.perf_counter()
    await work
    print(f"  {name:<48} {(time.perf_counter() - began) * 1000:>10.1f} ms", flush=True)


async def _read_all(pages: Any) -> None:
    async for _ in pages:
        pass


async def measure(url: str, rows: int, active: int) -> None:
    storage = open_storage(url)
    job_id = f"watchdog-{uuid.uuid4().hex[:8]}"
    ids = [f"{i:09d}" for i in range(rows)]
    try:
        for start in range(0, rows, PLAN_BATCH):
            plan = [
                PlannedStep(step_id, "bench.Step", 0, "{}")
                for step_id in ids[start : start + PLAN_BATCH]
            ]
            await storage.insert_plan(job_id, plan)
        running = ids[-active:] if active else []
        await storage.update_steps([StepUpdate(job_id, i, StepStatus.RUNNING, 1) for i in running])
        print(f"{redact_url(url)}: {rows:,} records, {len(running):,} running")
        await _timed("count_by_status", storage.count_by_status(job_id))
        await _timed("has_steps (a stage with some)", storage.has_steps(job_id, 0, UNFINISHED_STEP))
        await _timed("has_steps (a stage with none)", storage.has_steps(job_id, 1, UNFINISHED_STEP))
        await _timed(f"get_steps ({len(running):,} ids)", storage.get_steps(job_id, running))
        running_pages = step_pages(storage, job_id, statuses=(StepStatus.RUNNING,), stage=0)
        await _timed("the stage's RUNNING records, paged", _read_all(running_pages))
        every_page = step_pages(storage, job_id, stage=0)
        await _timed("every record of the stage, paged (before)", _read_all(every_page))
    finally:
        await storage.remove_job_steps(job_id)
        await storage.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", help="storage URL (default: a temporary SQLite file)")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--active", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        url = args.url or f"sqlite:///{Path(directory) / 'watchdog.db'}"
        asyncio.run(measure(url, args.rows, args.active))


if __name__ == "__main__":
    main()
