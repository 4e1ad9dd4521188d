"""Helpers shared by the test tiers: polling, direct storage access, jobs seeded as a dead
cluster left them, free ports, services missing (skip locally, fail in CI) and trace files.

Trace files are how steps and hooks, which run in other processes (Ray workers, CLI
subprocesses), tell a test what they did: one JSON object a line, appended by `trace` and read
back in order by `read_trace`. Ray workers import this module through the job modules, so it
imports nothing of the test tiers.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import random
import socket
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest

import choreography_ray as cr
from choreography_ray.storage import CountedKind, Storage, open_storage

T = TypeVar("T")

#: The Ray namespace the runtime tests' `connect` fixture puts every actor in.
RAY_NAMESPACE = "choreography-tests"

#: Seconds between two looks of `eventually` at its condition, unless told otherwise.
POLL_EVERY = 0.05


# -- polling --------------------------------------------------------------------------------------


def eventually(
    check: Callable[[], T | None],
    timeout: float = 20.0,
    what: str = "a condition",
    every: float = POLL_EVERY,
) -> T:
    """Polls `check` every `every` s until it returns something truthy, and returns that; fails
    the test naming `what` (and the last value) after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what} (last: {value!r})")
        time.sleep(every)


# -- subprocesses ---------------------------------------------------------------------------------

#: Execs its arguments with SIGINT at its default disposition.
_EXEC_WITH_DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


def with_default_sigint(command: Sequence[str]) -> list[str]:
    """`command`, run with SIGINT at its default. A process started where SIGINT is ignored (a
    background job of a script without job control, as CI may run the tests) hands the ignoring
    on through exec, and Python then never raises KeyboardInterrupt: a test that interrupts its
    subprocess would find the interrupt ignored (the Ctrl-C test of `run` failed so)."""
    return [sys.executable, "-c", _EXEC_WITH_DEFAULT_SIGINT, *command]


# -- storage --------------------------------------------------------------------------------------


def in_storage(url: str, use: Callable[[Storage], Awaitable[T]], read_only: bool = False) -> T:
    """What `use` returns when run on a storage of its own, opened on `url` (not through Ray)
    and closed after, on an event loop of its own."""

    async def run() -> T:
        storage = open_storage(url, read_only=read_only)
        try:
            return await use(storage)
        finally:
            await storage.close()

    return asyncio.run(run())


def left_behind(
    *,
    scope: str,
    namespace: str,
    status: cr.JobStatus,
    job_type: str,
    step_type: str,
    steps: Iterable[tuple[int, cr.StepStatus]],
    created: datetime,
    request: Mapping[str, Any] | None = None,
    step_request: Mapping[str, Any] | None = None,
    has_plan: bool = True,
    stop_finalized: bool = False,
    started: frozenset[int] = frozenset({0}),
    succeeded: int = 0,
    job_id: str | None = None,
) -> tuple[cr.JobState, list[cr.StepState]]:
    """A job as a dead cluster left it: its record and its plan's unfinished step records.

    `steps` are (stage, status) of the stored step records; `succeeded` more steps of stage 0
    succeeded already (their records are deleted, as a success deletes its record). A job
    without a plan has no totals yet."""
    job_id = job_id or uuid.uuid4().hex
    steps = list(steps)
    totals = Counter(stage for stage, _ in steps)
    totals[0] += succeeded
    progress = cr.JobProgress()
    if has_plan:
        progress = cr.JobProgress(
            total_steps=sum(totals.values()),
            successful_steps=succeeded,
            stopped_steps=sum(1 for _, status in steps if status is cr.StepStatus.STOPPED),
            stages=tuple(
                cr.StageProgress(
                    stage=stage,
                    is_started=stage in started,
                    total_steps=n,
                    successful_steps=succeeded if stage == 0 else 0,
                    stopped_steps=sum(
                        1 for s, st in steps if s == stage and st is cr.StepStatus.STOPPED
                    ),
                )
                for stage, n in sorted(totals.items())
            ),
        )
    state = cr.JobState(
        id=job_id,
        scope=scope,
        namespace=namespace,
        type=job_type,
        created=created,
        request=dict(request or {}),
        has_plan=has_plan,
        stop_finalized=stop_finalized,
        progress=progress,
    ).with_status(cr.JobStatus.PREPARING_JOB)
    if status is not cr.JobStatus.PREPARING_JOB:
        state = state.with_status(status)
    records = [
        cr.StepState(
            job_id=job_id,
            step_id=f"{succeeded + i:06d}",
            type=step_type,
            stage=stage,
            status=step_status,
            attempt=0 if step_status is cr.StepStatus.SCHEDULED else 1,
            request=dict(step_request or {}),
            updated=created,
        )
        for i, (stage, step_status) in enumerate(steps)
    ]
    return state, records


def seed_job(
    url: str,
    state: cr.JobState,
    steps: Iterable[cr.StepState] = (),
    *,
    stopped_counted: Iterable[str] = (),
) -> str:
    """Writes the job's record and its step records straight into the storage at `url` (with
    the step ids already counted as stopped), and returns the job's id."""
    records = list(steps)
    counted = tuple(stopped_counted)

    async def write(storage: Storage) -> None:
        await storage.create_job(state)
        if records:
            await storage.insert_steps(records)
        if counted:
            await storage.add_counted(state.id, CountedKind.STOPPED, counted)

    in_storage(url, write)
    return state.id


# -- processes ------------------------------------------------------------------------------------


#: Where `free_port` looks: below the kernel's ephemeral range (32768-60999 here), which every
#: outgoing connection takes its local port from, and above Ray's worker ports (10002-19999), so
#: that a port handed out stays free until the process it is for binds it.
FREE_PORTS = range(20000, 32768)
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback TCP port free at the moment of asking, never the same twice in a process."""
    while True:
        port = random.choice(FREE_PORTS)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port


def missing_service(reason: str) -> NoReturn:
    """Skip locally; in CI (`CI=true`) a missing service is a failure, not a silent skip."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true, so this fails instead of skipping)", pytrace=False)
    pytest.skip(reason)


# -- traces ---------------------------------------------------------------------------------------


def append_line(path: str | Path, line: str) -> None:
    """Appends `line` and a newline to `path` in one write under an exclusive lock: many
    processes append to the same file, and their lines must not interleave."""
    data = (line + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, data)
    finally:
        os.close(fd)  # closing releases the lock


def trace(path: str | Path, **fields: Any) -> None:
    """Appends one event to the trace file `path`: `fields` as one JSON line."""
    append_line(path, json.dumps(fields))


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    """The events of the trace file `path`, in the order written (none if it does not exist)."""
    file = Path(path)
    if not file.exists():
        return []
    return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
