"""A step host's fences and activation epochs: what keeps a resuming job's reads of storage one
still picture, and an older activation's starts from running.

A job that reactivates and will count what storage holds fences the host (`running_steps` with
`fence`) while it reads, and lifts the fence (`lift_fence`) once it has. Until then the job's
outcomes are not written: a step the host lists has no outcome stored, and any outcome stored is
of a step not listed. A start of the job that waited for room across a fence was sent before it,
and is refused. A fence the job never lifts (it was lost) lifts itself after `FENCE_SECONDS`.

Each job's newest activation epoch that asked the host is kept: a start of an older activation
is refused (`StaleActivationError`), also one that waited for room meanwhile.

No Ray here: the host gives the fences its condition (`room`, notified whenever what a waiter
checks changes) and its way to run a named task.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from collections.abc import Callable

from choreography_ray.errors import StaleActivationError
from choreography_ray.logs import get_logger, ids
from choreography_ray.runtime.lanes import Spawn

log = get_logger(__name__)

#: Seconds a fence holds a job's outcome writes when the job never lifts it (it was lost).
FENCE_SECONDS = 60.0
#: How many jobs' newest activation epochs a host keeps (`Fences.epochs`).
EPOCHS_KEPT = 10_000


class Fences:
    def __init__(self, room: asyncio.Condition, spawn: Spawn) -> None:
        self._room = room
        self._spawn = spawn
        #: Per job, how often a reactivating job fenced its starts here (`fence`): a start
        #: that waited for room across a fence was sent before it, and is refused.
        self.raised: Counter[str] = Counter()
        #: Per job, the newest activation epoch that asked this host (a start, or a read of
        #: its steps): a start of an older activation is refused, also one that arrives after
        #: the newer activation's fence. The last EPOCHS_KEPT jobs asked.
        self.epochs: OrderedDict[str, int] = OrderedDict()
        #: The jobs whose fence is up: their outcome writes wait until `lift` (or
        #: FENCE_SECONDS), so the job reads storage while nothing of it changes there.
        self.up: dict[str, asyncio.TimerHandle] = {}
        #: Per job, outcome writes in flight, and those waiting for its fence to lift.
        self.writing: Counter[str] = Counter()
        self.held: Counter[str] = Counter()

    def see_epoch(self, job_id: str, epoch: int, refuse: bool = True) -> bool:
        """Learns the job's newest activation epoch (0: unknown, ignored): True when it is
        newer than any before. Raises `StaleActivationError` for an older one when `refuse`."""
        known = self.epochs.get(job_id, 0)
        if epoch < known and epoch:
            if refuse:
                raise StaleActivationError(
                    f"job {job_id}: activation epoch {epoch} is older than {known}, which asked "
                    "this host already: its start is refused"
                )
            return False
        if epoch <= known:
            return False
        self.epochs[job_id] = epoch
        self.epochs.move_to_end(job_id)
        if len(self.epochs) > EPOCHS_KEPT:
            self.epochs.popitem(last=False)
        return True

    def superseded(self, job_id: str, epoch: int) -> bool:
        """A newer activation than `epoch` (0: unknown, never superseded) asked this host."""
        return self.epochs.get(job_id, 0) > epoch > 0

    async def fence(self, job_id: str, settled: Callable[[], bool]) -> None:
        """Puts the job's fence up and waits for its outcome writes in flight, and until
        `settled` (the host's other writes of the job, checked under `room`)."""
        self.raised[job_id] += 1
        async with self._room:
            self._put(job_id)
            await self._room.wait_for(lambda: job_id not in self.writing and settled())

    def _put(self, job_id: str) -> None:
        """Holds the job's outcome writes (under `room`) for FENCE_SECONDS at most."""
        if (old := self.up.get(job_id)) is not None:
            old.cancel()
        self.up[job_id] = asyncio.get_running_loop().call_later(
            FENCE_SECONDS,
            lambda: self._spawn(self.lift(job_id, expired=True), f"fence expired {job_id}", None),
        )
        self._room.notify_all()

    async def lift(self, job_id: str, expired: bool = False) -> None:
        """The job's outcome writes go on."""
        async with self._room:
            handle = self.up.pop(job_id, None)
            if handle is None:
                return
            handle.cancel()
            if expired:
                log.warning("job %s: its fence was never lifted; lifted after %g s", job_id,
                            FENCE_SECONDS, extra=ids(job_id))  # fmt: skip
            self._room.notify_all()

    async def begin_write(self, job_id: str) -> None:
        """Waits while the job's fence is up, then counts an outcome write of it in flight;
        `written` ends it."""
        async with self._room:
            self.held[job_id] += 1
            try:
                await self._room.wait_for(lambda: job_id not in self.up)
            finally:
                self.held -= Counter({job_id: 1})  # no entry left at zero
            self.writing[job_id] += 1

    def written(self, job_id: str) -> None:
        """An outcome write of the job ended (under `room`)."""
        self.writing[job_id] -= 1
        if self.writing[job_id] <= 0:
            del self.writing[job_id]
        self._room.notify_all()

    def forget(self, job_id: str) -> None:
        """The job holds nothing here any more: its fence count goes (its epoch stays)."""
        self.raised.pop(job_id, None)
