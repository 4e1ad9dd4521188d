"""Group commit: many steps' writes become one bulk write, flushed within a few milliseconds.

A writer awaits the round its writes joined; the round resolves once its bulk write is durable,
so a step reports only what storage already holds. A round that fails fails every writer of it
(they retry); a flush that is cancelled cancels its round, so no writer waits forever.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable, Sequence

from choreography_ray.storage import StepUpdate, Storage


class GroupCommit:
    def __init__(self, storage: Storage, delay_seconds: float) -> None:
        self._storage = storage
        self._delay = delay_seconds
        self._updates: list[StepUpdate] = []
        self._deletes: defaultdict[str, list[str]] = defaultdict(list)
        self._round: asyncio.Future[None] | None = None
        #: Flushes in flight: the loop keeps only weak references to tasks.
        self._flushes: set[asyncio.Task[None]] = set()

    async def write(
        self, updates: Sequence[StepUpdate] = (), deletes: Iterable[tuple[str, str]] = ()
    ) -> None:
        """Joins the current round with these updates and (job_id, step_id) deletes."""
        self._updates.extend(updates)
        for job_id, step_id in deletes:
            self._deletes[job_id].append(step_id)
        if self._round is None:
            loop = asyncio.get_running_loop()
            self._round = loop.create_future()
            loop.call_later(self._delay, self._start_flush)
        await asyncio.shield(self._round)

    def _start_flush(self) -> None:
        task = asyncio.get_running_loop().create_task(self._flush(), name="group-commit flush")
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _flush(self) -> None:
        round_, updates, deletes = self._round, self._updates, self._deletes
        self._round, self._updates, self._deletes = None, [], defaultdict(list)
        assert round_ is not None
        try:
            if updates:
                await self._storage.update_steps(updates)
            for job_id, step_ids in deletes.items():
                await self._storage.delete_steps(job_id, step_ids)
        except Exception as error:
            round_.set_exception(error)
        except BaseException:
            round_.cancel()
            raise
        else:
            round_.set_result(None)
