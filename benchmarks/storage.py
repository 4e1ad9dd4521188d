"""Storage hot-path throughput per provider: rows per second, measured in one run.

    python benchmarks/storage.py                       # memory:// and a temporary SQLite file
    python benchmarks/storage.py --mongodb-url mongodb://127.0.0.1:27017/bench
    python benchmarks/storage.py sqlite:///bench.db --rows 1000000

For each provider: insert a plan of `--rows` steps (`--plan-batch` per call), move every step to
RUNNING with a lease and a status change (`--batch` per call, as a step host's group commit
does), delete them (as succeeded steps are), and add as many counted-step records, with how much
slower the last batches are than the first (about 1 when the cost stays flat as the job grows; a
dict slows up to 5x as it outgrows the CPU caches). For SQLite it also prints the growth of the
file's used pages per counted record, after a WAL checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

from rich.console import Console
from rich.table import Table

from choreography_ray.model import Lease, StatusChange, StepState, utcnow
from choreography_ray.status import StepStatus
from choreography_ray.storage import CountedKind, StepUpdate, Storage, open_storage, redact_url

T = TypeVar("T")


async def _timed(
    write: Callable[[Sequence[T]], Awaitable[None]], items: Sequence[T], size: int
) -> float:
    """Seconds to write `items` in calls of `size`."""
    began = time.perf_counter()
    for start in range(0, len(items), size):
        await write(items[start : start + size])
    return time.perf_counter() - began


def _sqlite_used_bytes(url: str) -> int:
    """The bytes of the file's pages in use, after a checkpoint (free pages left out)."""
    with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pragmas = ("page_count", "freelist_count", "page_size")
        pages, free, size = (connection.execute(f"PRAGMA {p}").fetchone()[0] for p in pragmas)
    return int((pages - free) * size)


async def bench(url: str, rows: int, batch: int, plan_batch: int) -> dict[str, float]:
    """Seconds per operation, and SQLite bytes per counted record."""
    storage: Storage = open_storage(url)
    job_id = f"bench-{time.time_ns()}"
    ids = [f"step-{i:07d}" for i in range(rows)]
    steps = [StepState(job_id=job_id, step_id=step_id, type="bench.Step") for step_id in ids]
    lease = Lease(silo="node-1", activation="host-1#1", heartbeat=utcnow())
    updates = [
        StepUpdate(job_id, step_id, StepStatus.RUNNING, 1, lease, StatusChange(status="Running"))
        for step_id in ids
    ]
    kind = CountedKind.COMPLETED
    results: dict[str, float] = {}
    try:
        await storage.count_counted(job_id, kind)  # connects and makes the schema, untimed
        results["insert"] = await _timed(storage.insert_steps, steps, plan_batch)
        results["update"] = await _timed(storage.update_steps, updates, batch)

        async def delete(part: Sequence[str]) -> None:
            await storage.delete_steps(job_id, part)

        async def add_counted(part: Sequence[str]) -> None:
            await storage.add_counted(job_id, kind, part)

        results["delete"] = await _timed(delete, ids, batch)
        size_before = _sqlite_used_bytes(url) if url.startswith("sqlite:") else 0
        seconds = [
            await _timed(add_counted, ids[i : i + batch], batch) for i in range(0, rows, batch)
        ]
        results["add counted"] = sum(seconds)
        # The min of a few batches filters out pauses (GC, checkpoints, other load): a design
        # whose writes grow with the job (the spec's list in the job document) shows here.
        results["add counted growth"] = min(seconds[-5:]) / min(seconds[:5])
        if url.startswith("sqlite:"):
            results["bytes per counted record"] = (_sqlite_used_bytes(url) - size_before) / rows
        assert await storage.count_counted(job_id, kind) == rows
        await storage.remove_job_counted(job_id)
    finally:
        await storage.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("urls", nargs="*", help="storage URLs (default: memory and SQLite)")
    parser.add_argument("--mongodb-url", help="also measure this MongoDB (e.g. an nx-27017)")
    parser.add_argument("--rows", type=int, default=100_000, help="steps and counted records")
    parser.add_argument("--batch", type=int, default=512, help="updates/deletes/adds per call")
    parser.add_argument("--plan-batch", type=int, default=100_000, help="steps per insert call")
    args = parser.parse_args()

    console = Console()
    with tempfile.TemporaryDirectory() as scratch:
        urls = args.urls or ["memory://", f"sqlite:///{Path(scratch) / 'bench.db'}"]
        if args.mongodb_url:
            urls.append(args.mongodb_url)
        table = Table(title=f"storage throughput in rows per second, {args.rows:,} rows")
        operations = ["insert", "update", "delete", "add counted"]
        table.add_column("provider")
        for operation in operations:
            table.add_column(operation, justify="right")
        table.add_column("add counted: last / first batches", justify="right")
        table.add_column("bytes per counted record", justify="right")
        for url in urls:
            try:
                results = asyncio.run(bench(url, args.rows, args.batch, args.plan_batch))
            except Exception as exc:  # an unreachable server is reported, not fatal
                console.print(f"[yellow]{redact_url(url)} skipped: {exc}")
                continue
            size = results.get("bytes per counted record")
            table.add_row(
                url.split(":", 1)[0],
                *(f"{args.rows / results[operation]:,.0f}" for operation in operations),
                f"{results['add counted growth']:.2f}",
                "" if size is None else f"{size:.1f}",
            )
        console.print(table)
        console.print(
            f"insert: {args.plan_batch:,} steps per call; update (RUNNING, lease, status change),"
            f" delete and add counted: {args.batch:,} per call.\nURLs: "
            + ", ".join(redact_url(url) for url in urls)
        )


if __name__ == "__main__":
    main()
