"""The test-only storage wrapper: write and read faults inside the actors' own SQLite provider.

`open_storage` picks a provider by URL scheme and is not ours to change, so the wrapper is put
in place from outside: the harness starts Ray with `worker_process_setup_hook` naming
`install`, which every Ray worker of the run's cluster calls at start-up. It wraps
`SqliteStorage._write` and `_query`, the one path each write and each read of that provider
takes, and consults the run's control file (`storage_fault.json` in `CHAOS_RUN_DIR`) on each:

    {"mode": "refuse" | "slow" | "lost_ack" | "refuse_reads", "until": <epoch s>,
     "delay": <s>, "p": <0..1>, "job": <job id> | null}

- refuse: the write raises `StorageUnavailableError` before it is tried;
- slow: the write waits `delay` seconds, then happens;
- lost_ack: the write happens and commits, then raises `StorageUnavailableError` (with
  probability `p`), as a connection that drops after the commit and before its answer would;
- refuse_reads: a read of step records (`job_steps`) raises `StorageUnavailableError`, when
  `job` is set only one whose arguments name that job; writes go on.

Each fault a write or read meets is appended to `storage_faults.jsonl` in the run directory.
Outside a chaos run (no `CHAOS_RUN_DIR`) `install` does nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support import trace

RUN_DIR_ENV = "CHAOS_RUN_DIR"
#: The SQLite provider's busy timeout in the run's workers, in seconds (`Profile`).
BUSY_ENV = "CHAOS_SQLITE_BUSY_SECONDS"
CONTROL = "storage_fault.json"
HITS = "storage_faults.jsonl"


class _Control:
    """The control file, read again only when its modification time changes."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / CONTROL
        self.hits = run_dir / HITS
        self._mtime = -1.0
        self._fault: dict[str, Any] | None = None

    def current(self) -> dict[str, Any] | None:
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            self._fault, self._mtime = None, -1.0
            return None
        if mtime != self._mtime:
            try:
                self._fault = json.loads(self.path.read_text())
            except (OSError, ValueError):  # written as we read: look again at the next write
                return None
            self._mtime = mtime
        fault = self._fault
        if fault is None or time.time() >= float(fault.get("until", 0)):
            return None
        return fault

    def hit(self, mode: str) -> None:
        trace(self.hits, mode=mode, pid=os.getpid(), at=time.time())


def set_fault(
    run_dir: Path,
    mode: str,
    seconds: float,
    delay: float = 0.0,
    p: float = 1.0,
    job: str | None = None,
) -> None:
    """Turns a fault on for `seconds` (the harness's side); it ends by itself."""
    fault = {"mode": mode, "until": time.time() + seconds, "delay": delay, "p": p, "job": job}
    tmp = run_dir / f".{CONTROL}.{os.getpid()}"
    tmp.write_text(json.dumps(fault))
    tmp.replace(run_dir / CONTROL)


def install() -> None:
    """The `worker_process_setup_hook` of a chaos run's Ray workers."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        return
    from choreography_ray.errors import StorageUnavailableError
    from choreography_ray.storage import sqlite
    from choreography_ray.storage.sqlite import SqliteStorage

    if busy := os.environ.get(BUSY_ENV):
        sqlite.BUSY_TIMEOUT_MS = int(float(busy) * 1000)

    if getattr(SqliteStorage, "_chaos_wrapped", False):
        return
    control = _Control(Path(run_dir))
    original: Callable[..., Any] = SqliteStorage._write
    original_query: Callable[..., Any] = SqliteStorage._query
    rng = random.Random()

    async def write(self: SqliteStorage, work: Callable[..., object]) -> None:
        fault = control.current()
        if fault is None or fault["mode"] == "refuse_reads":
            await original(self, work)
            return
        mode = fault["mode"]
        if mode == "refuse":
            control.hit(mode)
            raise StorageUnavailableError("chaos: the storage refuses writes")
        if mode == "slow":
            control.hit(mode)
            await asyncio.sleep(float(fault.get("delay", 0.5)))
        await original(self, work)
        if mode == "lost_ack" and rng.random() < float(fault.get("p", 1.0)):
            control.hit(mode)
            raise StorageUnavailableError("chaos: the write's acknowledgement was lost")

    async def query(self: SqliteStorage, sql: str, *args: object) -> list[Any]:
        fault = control.current()
        if (
            fault is not None
            and fault["mode"] == "refuse_reads"
            and "job_steps" in sql
            and (fault.get("job") is None or fault["job"] in args)
        ):
            control.hit("refuse_reads")
            raise StorageUnavailableError("chaos: the storage refuses reads of the job's steps")
        result: list[Any] = await original_query(self, sql, *args)
        return result

    SqliteStorage._write = write  # type: ignore[method-assign]
    SqliteStorage._query = query  # type: ignore[method-assign]
    SqliteStorage._chaos_wrapped = True  # type: ignore[attr-defined]
