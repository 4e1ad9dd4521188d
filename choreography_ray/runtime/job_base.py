"""What every part of a job activation shares: its state, its persistence, and the parts it
is made of (declared here, defined in their modules).

A job activation (`JobCore` in `job_actor.py`) is assembled from parts, each in its own module:
`window.py` (starting steps), `stopping.py` (stop and remove), `resuming.py` (resume and
RetryFailedSteps) and `watchdog.py` (the periodic tick).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from choreography_ray.errors import JobOperationError, ResumeJobError, StartJobError
from choreography_ray.job import Job
from choreography_ray.model import JobState
from choreography_ray.options import JobsOptions
from choreography_ray.runtime.hosts import HostPool
from choreography_ray.runtime.messages import Outcome, StepStart
from choreography_ray.runtime.retries import RetrySchedule
from choreography_ray.runtime.shared_storage import open_shared_storage
from choreography_ray.runtime.stages import Stages
from choreography_ray.status import JobStatus
from choreography_ray.storage import CountedKind, StatusCounts

if TYPE_CHECKING:
    from choreography_ray.runtime.watchdog import HookBackoff

log = logging.getLogger("choreography_ray.runtime.job_actor")


class JobBase:
    """The state of one job's activation and how it is saved."""

    #: Set by the watchdog part: the backoff of a failed resume hook.
    hook_backoff: HookBackoff

    def __init__(self, job_id: str, storage_url: str, options: JobsOptions, namespace: str) -> None:
        self.job_id = job_id
        self.options = options
        self.storage = open_shared_storage(storage_url, namespace)
        self.hosts = HostPool(storage_url, options, namespace)
        self.state: JobState | None = None
        self.job: Job[Any] | None = None
        self.stages = Stages([])
        self.plan: dict[int, list[StepStart]] = {}  # the first run's steps, by stage
        self.pending: deque[StepStart] = deque()
        self.active: dict[str, tuple[StepStart, str]] = {}  # step id -> (start, host name)
        self.start_failed: list[StepStart] = []
        self.retries = RetrySchedule()
        self.counted: set[str] = set()
        self.stopped_counted: set[str] = set()
        self._new_counted: list[str] = []
        self._new_stopped: list[str] = []
        self.halted = True  # no steps are started while halted (stopped, removing, terminal)
        self.awaiting_admission: int | None = None
        self.hook_owed = False
        self.ticks = 0
        self._starts_in_flight = 0
        self._dirty = False
        self._wake = asyncio.Event()
        self._watched: dict[str, asyncio.Future[Any]] = {}
        self._dedicated: dict[str, Any] = {}
        self._tasks: set[asyncio.Future[Any]] = set()
        self._finishing_stop = False
        self._in_first_wave = False
        self._save_lock = asyncio.Lock()
        self._loaded = asyncio.get_running_loop().create_future()
        self.exit_requested = False
        self.on_exit: Callable[[], None] = lambda: None

    def _request_exit(self) -> None:
        self.exit_requested = True
        self.on_exit()

    async def ready(self) -> JobState:
        await asyncio.shield(self._loaded)
        if self.state is None:
            raise JobOperationError(ResumeJobError.UNKNOWN, f"job {self.job_id} does not exist")
        return self.state

    def _idle(self) -> bool:
        """No step of the running stage is active, waiting to start, or waiting to retry."""
        assert self.state is not None
        return (
            not self.active and not self.pending and not self.retries.pending
            and not self.start_failed and self.awaiting_admission is None
            and self.state.stage in self.stages.counters
        )  # fmt: skip

    def _every_step_done(self, counts: StatusCounts) -> bool:
        raise NotImplementedError

    # -- defined by the parts -----------------------------------------------------------------

    def accept(self, outcome: Outcome) -> bool:
        raise NotImplementedError

    async def _begin_stage(self, stage: int, first_run: bool = False) -> StartJobError | None:
        raise NotImplementedError

    async def _check_stage(self) -> None:
        raise NotImplementedError

    async def _on_stage_done(self, stage: int) -> None:
        raise NotImplementedError

    async def _stored_unfinished(self, stage: int) -> list[StepStart]:
        raise NotImplementedError

    def _kick(self) -> None:
        raise NotImplementedError

    def _fill(self) -> list[asyncio.Future[bool]]:
        raise NotImplementedError

    def _watch(self, name: str, handle: Any) -> None:
        raise NotImplementedError

    def _requeue(self, starts: Iterable[StepStart]) -> None:
        raise NotImplementedError

    def _retry_failed_starts(self) -> None:
        raise NotImplementedError

    async def _adopt_running(self, starts: list[StepStart]) -> list[StepStart]:
        raise NotImplementedError

    async def _run_resume_hook(self) -> None:
        raise NotImplementedError

    async def _finish_stop_when_reported(self) -> bool:
        raise NotImplementedError

    async def _tell_stop_again(self) -> None:
        raise NotImplementedError

    def _record_counted(self, step_id: str) -> None:
        raise NotImplementedError

    # -- persistence --------------------------------------------------------------------------

    async def _set_status(
        self,
        status: JobStatus,
        *messages: str,
        error: str | None = None,
        stop_finalized: bool | None = None,
    ) -> None:
        update: dict[str, Any] = {}
        if error is not None:
            update["error"] = error
        if stop_finalized is not None:
            update["stop_finalized"] = stop_finalized
        await self._save((status, messages), **update)

    async def _save(
        self, change: tuple[JobStatus, tuple[str, ...]] | None = None, **update: Any
    ) -> None:
        """Saves the record with the current progress, counted records first. One save at a
        time: each carries the version the previous one returned."""
        async with self._save_lock:
            assert self.state is not None
            state = self.state if change is None else self.state.with_status(change[0], *change[1])
            self._dirty = False
            await self._flush_counted()
            self.state = await self.storage.save_job(
                state.model_copy(update={"progress": self.stages.progress(), **update})
            )

    async def _flush_counted(self) -> None:
        new_counted, self._new_counted = self._new_counted, []
        new_stopped, self._new_stopped = self._new_stopped, []
        try:
            if new_counted:
                await self.storage.add_counted(self.job_id, CountedKind.COMPLETED, new_counted)
            if new_stopped:
                await self.storage.add_counted(self.job_id, CountedKind.STOPPED, new_stopped)
        except Exception:
            self._new_counted[:0] = new_counted
            self._new_stopped[:0] = new_stopped
            raise

    async def _flush_progress(self) -> None:
        if self._dirty or self._new_counted or self._new_stopped:
            await self._save()

    async def _save_loop(self) -> None:
        every = self.options.progress_save_interval.total_seconds()
        while True:
            await asyncio.sleep(every)
            if self.state is None or self.state.status.is_terminal:
                continue
            try:
                await self._flush_progress()
            except Exception:
                log.exception("job %s: saving progress failed; retrying", self.job_id)
                with contextlib.suppress(Exception):
                    reloaded = await self.storage.get_job(self.job_id)
                    if reloaded is not None and self.state is not None:
                        self.state = self.state.model_copy(update={"version": reloaded.version})

    def _spawn(self, coro: Any) -> asyncio.Future[Any]:
        task: asyncio.Future[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
