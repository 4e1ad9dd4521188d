"""Group commit: many steps' writes become one bulk write, flushed within a few milliseconds.

A writer awaits the round its writes joined; the round resolves once its bulk write is durable,
so a step reports only what storage already holds. A round that fails fails every writer of it
(they retry); a flush that is cancelled cancels its round, so no writer waits forever.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from choreography_ray.core.metrics import (
    NO_METRICS,
    UNKNOWN,
    BatchKind,
    Histogram,
    Labels,
    Metrics,
    WriteOperation,
)
from choreography_ray.storage import StepUpdate, Storage


class GroupCommit:
    def __init__(self, storage: Storage, delay_seconds: float, metrics: Metrics = NO_METRICS):
        self._storage = storage
        self._delay = delay_seconds
        self._metrics = metrics
        self._updates: list[StepUpdate] = []
        self._deletes: defaultdict[str, list[str]] = defaultdict(list)
        #: The round's records by the metric labels of the writers that brought them.
        self._sizes: Counter[Labels] = Counter()
        self._round: asyncio.Future[None] | None = None
        #: Flushes in flight: the loop keeps only weak references to tasks.
        self._flushes: set[asyncio.Task[None]] = set()

    async def write(
        self,
        updates: Sequence[StepUpdate] = (),
        deletes: Iterable[tuple[str, str]] = (),
        labels: Labels = UNKNOWN,
    ) -> None:
        """Joins the current round with these updates and (job_id, step_id) deletes; `labels`
        tag the round's metrics (a round observes once per labels among its writers)."""
        self._updates.extend(updates)
        records = len(updates)
        for job_id, step_id in deletes:
            self._deletes[job_id].append(step_id)
            records += 1
        if self._metrics.enabled:
            self._sizes[labels] += records
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
        round_, updates, deletes, sizes = self._round, self._updates, self._deletes, self._sizes
        self._round, self._updates, self._deletes = None, [], defaultdict(list)
        self._sizes = Counter()
        assert round_ is not None
        try:
            began = time.perf_counter()
            if updates:
                await self._storage.update_steps(updates)
            for job_id, step_ids in deletes.items():
                await self._storage.delete_steps(job_id, step_ids)
            self._observe(sizes, time.perf_counter() - began)
        except Exception as error:
            round_.set_exception(error)
        except BaseException:
            round_.cancel()
            raise
        else:
            round_.set_result(None)

    def _observe(self, sizes: Counter[Labels], seconds: float) -> None:
        for labels, records in sizes.items():
            self._metrics.observe(
                Histogram.STORAGE_WRITE_SECONDS, seconds, labels, WriteOperation.GROUP_COMMIT
            )
            self._metrics.observe(Histogram.BATCH_SIZE, records, labels, BatchKind.GROUP_COMMIT)
