"""How fast a job's failures group by signature, per provider, on `--failed` failed steps.

    python benchmarks/failures.py                           # a temporary SQLite file
    python benchmarks/failures.py memory://
    python benchmarks/failures.py mongodb://127.0.0.1:27017/bench --failed 100000

The job has `--failed` failed records of `--kinds` signatures (each message different, as a
step's own ids and numbers make it) among `--rows` records. Timed, `--repeat` times each (the
median and the slowest): `failure_clusters`, and the first page of the largest cluster's steps
(`list_failed`, 1,000 records). The job's records are removed afterwards. Nothing here is a
test: the figures are printed (docs/jobs.md, "Failures at scale", quotes them).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from choreography_ray.failures import failure_signature
from choreography_ray.model import StatusChange
from choreography_ray.status import StepStatus
from choreography_ray.storage import PlannedStep, StepUpdate, open_storage, redact_url

#: Records per write while the job is laid out.
BATCH = 10_000
MESSAGES = (
    "KeyError: 'doc-{n}'",
    "TimeoutError: GET https://api.example.com/items/{n} after {n}.5 s",
    "OSError: [Errno 28] No space left on device: '/data/shard-{n}/part.parquet'",
    "ValueError: row {n} has {n} columns, expected 12",
    "RuntimeError: worker 3f2a{n:08x} lost",
)


async def _timed(name: str, repeat: int, work: Callable[[], Awaitable[Any]]) -> None:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        await work()
        times.append((time.perf_counter() - began) * 1000)
    median, slowest = statistics.median(times), max(times)
    print(f"  {name:<44} median {median:>9.1f} ms   slowest {slowest:>9.1f} ms", flush=True)


def _failure(job_id: str, n: int, kinds: int) -> StepUpdate:
    message = MESSAGES[n % kinds].format(n=n)
    change = StatusChange(status=StepStatus.FAILED, exception_messages=(message,))
    signature = failure_signature(message)
    return StepUpdate(job_id, f"{n:09d}", StepStatus.FAILED, 1, None, change, signature)


async def measure(url: str, rows: int, failed: int, kinds: int, repeat: int) -> None:
    storage = open_storage(url)
    job_id = f"failures-{uuid.uuid4().hex[:8]}"
    try:
        for start in range(0, rows, BATCH):
            ids = range(start, min(rows, start + BATCH))
            await storage.insert_plan(
                job_id, [PlannedStep(f"{n:09d}", "b.S", 0, "{}") for n in ids]
            )
            await storage.update_steps([_failure(job_id, n, kinds) for n in ids if n < failed])
        print(f"{redact_url(url)}: {rows:,} records, {failed:,} failed, {kinds} signatures")
        clusters = await storage.failure_clusters(job_id)
        assert sum(c.count for c in clusters) == failed and len(clusters) == kinds
        await _timed("failure_clusters", repeat, lambda: storage.failure_clusters(job_id))
        largest = clusters[0].signature
        await _timed(
            "list_failed (the largest cluster, 1,000)",
            repeat,
            lambda: storage.list_failed(job_id, largest, limit=1000),
        )
    finally:
        await storage.remove_job_steps(job_id)
        await storage.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("url", nargs="?", help="storage URL (default: a temporary SQLite file)")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--failed", type=int, default=100_000)
    parser.add_argument("--kinds", type=int, default=3, choices=range(1, len(MESSAGES) + 1))
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        url = args.url or f"sqlite:///{Path(directory) / 'failures.db'}"
        asyncio.run(measure(url, args.rows, min(args.failed, args.rows), args.kinds, args.repeat))


if __name__ == "__main__":
    main()
