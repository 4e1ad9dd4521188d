"""`SchedulerCore`: one scope's scheduler, with no `ray`: the actor `scheduler/{scope}` is a thin
shell over it, and the unit tests drive it on the memory storage with a fake jobs port.

One turn at a time (`core.turns.Turns`): the manifest manager's cycle, each dispatch and every
operation that changes state run inside a turn of their own, so none sees another half done;
reads run beside turns. Its background tasks are named and watched (`Supervisor`): the lock
("lock", every third of `lock_ttl`), the cycle ("manifest manager", every `manifest_cycle`) and
the dispatcher ("dispatcher", every `dispatch_interval`). The loops do nothing and operations
that change state are refused (`SchedulerError.NOT_LOCK_HOLDER`) while another scheduler holds
the scope's lock (`lock.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection
from datetime import timedelta
from typing import Any, TypeVar

from choreography_ray.core.backoff import Backoff
from choreography_ray.core.turns import Supervisor, Turns
from choreography_ray.errors import SchedulerError, SchedulerOperationError
from choreography_ray.logs import get_logger
from choreography_ray.scheduler import failures
from choreography_ray.scheduler.dispatcher import Dispatcher
from choreography_ray.scheduler.lock import SchedulerLock, guarded, lapsed, lock_name
from choreography_ray.scheduler.manifest_manager import ManifestManager
from choreography_ray.scheduler.operations import Operations
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.port import JobsPort
from choreography_ray.scheduler.records import (
    DeadLetter,
    Manifest,
    ManifestRun,
    RequeueResult,
    TriggerResult,
)
from choreography_ray.scheduler.schedules import Schedule
from choreography_ray.scheduler.status import DeadLetterStatus
from choreography_ray.storage.scheduler import SchedulerStorage, fenced

log = get_logger(__name__)

T = TypeVar("T")

#: A loop body that fails is run again after 1 s, doubling to 30 s.
LOOP_BACKOFF = Backoff.of(timedelta(seconds=1), timedelta(seconds=30))


def every(seconds: Callable[[], float]) -> Callable[[], Awaitable[None]]:
    """A `Supervisor.repeat` wait: at once the first time, then `seconds()` apart."""
    first = True

    async def wait() -> None:
        nonlocal first
        if not first:
            await asyncio.sleep(seconds())
        first = False

    return wait


class SchedulerCore:
    def __init__(
        self,
        scope: str,
        storage: SchedulerStorage,
        jobs: JobsPort,
        options: SchedulerOptions,
        *,
        holder: str,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scope = scope
        self.storage = storage
        self.options = options
        self.turns = Turns()
        self.tasks = Supervisor(lock_name(scope))
        self.lock = SchedulerLock(storage, scope, holder, options.lock_ttl, monotonic)
        # Each write checks the lock here first, and the lease in the same write (a fence: a
        # scheduler whose lease a successor took writes nothing, whatever its clock says).
        writes = guarded(fenced(storage, self.lock.name, holder), self.lock)
        self.dispatcher = Dispatcher(scope, writes, jobs, options)
        self.manager = ManifestManager(scope, writes, jobs, options, self.dispatcher.failed)
        self.ops = Operations(scope, writes, options, self.manager)
        self._started = asyncio.Event()

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self, *, loops: bool = True) -> None:
        """Tries the lock once, then (with `loops`) keeps it and runs the two loops. Warns when
        the backoff of `default_max_retries` retries alone reaches the failure window."""
        try:  # the warning never keeps the scheduler from starting
            warning = failures.backoff_warning(self.options)
        except Exception:
            log.exception("%s: the backoff warning failed", self.tasks.owner)
            warning = None
        if warning:
            log.warning("%s: %s", self.tasks.owner, warning)
        try:
            await self.lock.keep()
        except Exception:
            log.exception("%s: taking the lock failed; trying again", self.tasks.owner)
        self._started.set()
        if not loops:
            return
        seconds = self.options.manifest_cycle.total_seconds
        dispatch = self.options.dispatch_interval.total_seconds
        self.tasks.repeat(
            "lock", every(lambda: self.lock.renew_every), self.lock.keep, LOOP_BACKOFF
        )
        self.tasks.repeat("manifest manager", every(seconds), self.run_cycle, LOOP_BACKOFF)
        self.tasks.repeat("dispatcher", every(dispatch), self.dispatch_due, LOOP_BACKOFF)

    async def close(self) -> None:
        self.tasks.cancel_all()
        async with self.turns.turn("close"):
            try:
                await self.lock.release()
            except Exception:
                log.exception("%s: releasing the lock failed", self.tasks.owner)

    # -- the loops --------------------------------------------------------------------------

    async def run_cycle(self) -> bool:
        """One cycle of the manifest manager, while this scheduler holds the lock."""
        if not self.lock.held:
            return False
        async with self.turns.turn("manifest cycle"):
            try:
                await self.manager.cycle()
            except SchedulerOperationError as error:
                if not lapsed(error):
                    raise
                self.lock.lost(str(error))
        return True

    async def dispatch_due(self) -> int:
        """One dispatch, while this scheduler holds the lock; how many entries it claimed."""
        if not self.lock.held:
            return 0
        async with self.turns.turn("dispatch"):
            try:
                return await self.dispatcher.dispatch_due()
            except SchedulerOperationError as error:
                if not lapsed(error):
                    raise
                self.lock.lost(str(error))
                return 0

    # -- operations -------------------------------------------------------------------------

    async def _change(self, name: str, operation: Callable[[], Awaitable[T]]) -> T:
        """`operation` in a turn of its own, once this scheduler holds the lock."""
        await self._started.wait()
        if not self.lock.held:
            other = f" (held by {self.lock.other})" if self.lock.other else ""
            raise SchedulerOperationError(
                SchedulerError.NOT_LOCK_HOLDER,
                f"another scheduler runs scope {self.scope!r}{other}: {name} is refused here",
            )
        async with self.turns.turn(name):
            try:
                return await operation()
            except SchedulerOperationError as error:
                if lapsed(error):  # fenced: the lease is gone
                    self.lock.lost(str(error))
                raise

    async def schedule(
        self, name: str, job_type: str, request: dict[str, Any], schedule: Schedule,
        **settings: Any,
    ) -> Manifest:  # fmt: skip
        return await self._change(
            "schedule", lambda: self.ops.schedule(name, job_type, request, schedule, **settings)
        )

    async def trigger(self, name: str, ask_afresh: bool = False) -> TriggerResult:
        return await self._change("trigger", lambda: self.ops.trigger(name, ask_afresh))

    async def requeue(self, dead_letter_id: str, ask_afresh: bool = False) -> str:
        return await self._change("requeue", lambda: self.ops.requeue(dead_letter_id, ask_afresh))

    async def acknowledge(self, dead_letter_id: str, note: str) -> None:
        await self._change("acknowledge", lambda: self.ops.acknowledge(dead_letter_id, note))

    async def requeue_all(self, name: str | None = None, ask_afresh: bool = False) -> list[str]:
        return await self._change("requeue all", lambda: self.ops.requeue_all(name, ask_afresh))

    async def acknowledge_all(self, name: str | None = None, *, note: str) -> int:
        return await self._change("acknowledge all",
                                  lambda: self.ops.acknowledge_all(name, note=note))  # fmt: skip

    async def requeue_execution(self, run_id: str, ask_afresh: bool = False) -> RequeueResult:
        return await self._change(
            "requeue execution", lambda: self.ops.requeue_execution(run_id, ask_afresh)
        )

    async def resume_execution(self, run_id: str) -> str:
        return await self._change("resume execution", lambda: self.ops.resume_execution(run_id))

    async def set_replay_decisions_on_retry(self, names: Collection[str], value: bool) -> str:
        return await self._change(
            "set replay decisions on retry",
            lambda: self.ops.set_replay_decisions_on_retry(names, value),
        )

    # -- reads (beside turns) ---------------------------------------------------------------

    async def manifests(self) -> list[Manifest]:
        return await self.storage.list_manifests(self.scope)

    async def manifest(self, name: str) -> Manifest:
        return await self.ops.manifest(name)

    async def runs(self, name: str | None = None, limit: int = 100) -> list[ManifestRun]:
        return await self.storage.list_runs(self.scope, name, limit)

    async def dead_letters(
        self, name: str | None = None, status: DeadLetterStatus | None = None
    ) -> list[DeadLetter]:
        return await self.storage.list_dead_letters(self.scope, name, status)

    def stats(self) -> dict[str, Any]:
        return {
            "holds_lock": self.lock.held,
            "holder": self.lock.holder,
            "cycles": self.manager.cycles,
            "started": self.dispatcher.started,
            "requeued": self.dispatcher.requeued,
            "failures": dict(self.tasks.failures),
        }
