"""Group commit: many steps' writes become one bulk write. A round is written as soon as no
write is in flight (after `delay_seconds`, 0 by default: on the loop's next turn, so the writes
of one turn go together); while one is in flight, the writes that come meanwhile gather into the
next round, which is written when it ends. An idle host so writes at once, and a busy one in
rounds as large as its storage is slow.

A writer awaits the round its writes joined; the round resolves once its bulk write is durable,
so a step reports only what storage already holds. A round that fails fails every writer of it
(they retry); a flush that is cancelled cancels its round, so no writer waits forever.

Rounds are written one at a time, in the order they began: a write that joined a later round
lands after every write of the earlier ones. Within a round, updates are written first, then
deletes, each job's in one write with the outputs of its succeeded steps (stored first:
`Storage.delete_steps`), so a step whose record is gone has its output. An update of a record
the same round deletes is left out (the record ends deleted either way): a step that succeeds
before its `RUNNING` write is flushed writes only its output and its delete. Two updates of one
record in a round are written in the order they joined.
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
from choreography_ray.storage import StepUpdate, Storage, StoredOutput


class GroupCommit:
    def __init__(self, storage: Storage, delay_seconds: float, metrics: Metrics = NO_METRICS):
        self._storage = storage
        self._delay = delay_seconds
        self._metrics = metrics
        self._updates: list[StepUpdate] = []
        self._deletes: defaultdict[str, set[str]] = defaultdict(set)
        #: Per job, the outputs of its succeeded steps: written with their deletes.
        self._outputs: defaultdict[str, list[StoredOutput]] = defaultdict(list)
        #: The round's records by the metric labels of the writers that brought them.
        self._sizes: Counter[Labels] = Counter()
        self._round: asyncio.Future[None] | None = None
        #: The flush in flight (one at a time), and whether the next round is due meanwhile.
        self._flushing: asyncio.Task[None] | None = None
        self._due = False

    async def write(
        self,
        updates: Sequence[StepUpdate] = (),
        deletes: Iterable[tuple[str, str]] = (),
        labels: Labels = UNKNOWN,
        outputs: Sequence[StoredOutput] = (),
    ) -> None:
        """Joins the current round with these updates, (job_id, step_id) deletes and outputs
        and waits until it is durable; `labels` tag the round's metrics (a round observes once
        per labels among its writers)."""
        await self.join(updates, deletes, labels, outputs)

    def join(
        self,
        updates: Sequence[StepUpdate] = (),
        deletes: Iterable[tuple[str, str]] = (),
        labels: Labels = UNKNOWN,
        outputs: Sequence[StoredOutput] = (),
    ) -> asyncio.Future[None]:
        """Joins the current round now; the future (shielded: cancelling a waiter leaves the
        round alone) resolves once the round is durable."""
        self._updates.extend(updates)
        for output in outputs:
            self._outputs[output.job_id].append(output)
        records = len(updates) + len(outputs)
        for job_id, step_id in deletes:
            self._deletes[job_id].add(step_id)
            records += 1
        if self._metrics.enabled:
            self._sizes[labels] += records
        if self._round is None:
            loop = asyncio.get_running_loop()
            self._round = loop.create_future()
            loop.call_later(self._delay, self._start_flush)
        return asyncio.shield(self._round)

    def _start_flush(self) -> None:
        if self._flushing is not None:
            self._due = True  # written once the write in flight ends
            return
        self._flushing = asyncio.get_running_loop().create_task(
            self._flush(), name="group-commit flush"
        )
        self._flushing.add_done_callback(self._flushed)

    def _flushed(self, _task: asyncio.Task[None]) -> None:
        self._flushing = None
        if self._due:
            self._due = False
            self._start_flush()

    async def _flush(self) -> None:
        round_, updates, deletes, sizes = self._round, self._updates, self._deletes, self._sizes
        outputs = self._outputs
        self._round, self._updates, self._deletes = None, [], defaultdict(set)
        self._outputs, self._sizes = defaultdict(list), Counter()
        assert round_ is not None
        try:
            began = time.perf_counter()
            for batch in _in_order(
                u for u in updates if u.step_id not in deletes.get(u.job_id, ())
            ):
                await self._storage.update_steps(batch)
            for job_id, step_ids in deletes.items():
                await self._storage.delete_steps(job_id, step_ids, outputs.pop(job_id, ()))
            for of_job in outputs.values():  # none: an output comes with its step's delete
                await self._storage.put_outputs(of_job)
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


def _in_order(updates: Iterable[StepUpdate]) -> list[list[StepUpdate]]:
    """The updates as bulk writes that each touch a record once (a provider may apply one bulk
    write's updates in any order): a second update of a record starts the next one."""
    batches: list[list[StepUpdate]] = [[]]
    seen: set[tuple[str, str]] = set()
    for u in updates:
        key = (u.job_id, u.step_id)
        if key in seen:
            batches.append([])
            seen.clear()
        seen.add(key)
        batches[-1].append(u)
    return [batch for batch in batches if batch]
