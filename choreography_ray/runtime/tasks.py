"""A step host's background tasks, named and watched: a failed one is logged with its name and
job. A task spawned for a job holds the job's entries on the host until it ends."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from choreography_ray.logs import get_logger, ids

log = get_logger(__name__)


class Tasks:
    """`hold` and `release` a job's entries on the host (`StepHostCore.holds`)."""

    def __init__(self, hold: Callable[[str], None], release: Callable[[str], None]) -> None:
        self._hold = hold
        self._release = release
        self.running: set[asyncio.Task[None]] = set()

    def spawn(
        self, coro: Coroutine[Any, Any, None], name: str, job_id: str | None = None
    ) -> asyncio.Task[None]:
        """Runs `coro` as a task named `name`; a failure is logged with the name and the job.
        A task spawned for a job holds the job's entries until it ends."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.running.add(task)
        if job_id is not None:
            self._hold(job_id)
        task.add_done_callback(functools.partial(self._watch, job_id))
        return task

    def _watch(self, job_id: str | None, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        if job_id is not None:
            self._release(job_id)
        if not task.cancelled() and (error := task.exception()) is not None:
            job = "" if job_id is None else f" of job {job_id}"
            log.error("step host task %r%s failed", task.get_name(), job, exc_info=error,
                      extra=ids(job_id))  # fmt: skip
