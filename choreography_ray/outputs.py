"""Step outputs read back (docs/outputs.md), and Ray Datasets in and out.

A succeeded step's output is stored by its host with its outcome (`storage.StoredOutput`).
They are read a page at a time by step id: by `manager.outputs`, by a later stage's step
(`context.outputs`, through the host's `OutputReader`), and by `jobs.outputs_dataset`
(`datasets.py`). `steps_from_dataset` turns a Dataset into a plan, streamed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from choreography_ray.job import StepSpec, _step_path
from choreography_ray.model import StepOutput
from choreography_ray.storage import Storage, StoredOutput, output_pages

if TYPE_CHECKING:
    import ray.data


class OutputReader:
    """A step host's reader of its jobs' outputs, for `StepContext.outputs`: the storage calls
    run on the host's event loop (also for a sync perform's `outputs_sync`)."""

    def __init__(self, storage: Storage, loop: asyncio.AbstractEventLoop) -> None:
        self._storage = storage
        self._loop = loop

    async def read(self, job_id: str, stage: int | None, page: int) -> AsyncIterator[StepOutput]:
        async for found in output_pages(self._storage, job_id, stage=stage, page=page):
            for stored in found:
                yield stored.parsed()

    def read_sync(self, job_id: str, stage: int | None, page: int) -> Iterator[StepOutput]:
        if _on_loop(self._loop):
            raise RuntimeError("outputs_sync is for a sync perform: await context.outputs()")
        pages = output_pages(self._storage, job_id, stage=stage, page=page)

        async def next_page() -> list[StoredOutput] | None:
            return await anext(pages, None)

        while (
            found := asyncio.run_coroutine_threadsafe(next_page(), self._loop).result()
        ) is not None:
            yield from (stored.parsed() for stored in found)


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def steps_from_dataset(
    ds: ray.data.Dataset,
    step_type: type,
    to_request: Callable[[dict[str, Any]], BaseModel],
    stage: int = 0,
    batch_size: int = 4_096,
) -> Iterator[StepSpec]:
    """A plan read from a Dataset as `prepare_steps` returns it: a step of `step_type` per row,
    its request `to_request(row)`, read a batch of `batch_size` rows at a time
    (`iter_batches`), so a plan of millions of rows is held in bounded memory; the job inserts
    it a chunk at a time (`plan_chunk_size`)."""
    path = _step_path(step_type)
    for batch in ds.iter_batches(batch_size=batch_size, batch_format="pyarrow"):
        for row in batch.to_pylist():  # type: ignore[union-attr]
            yield StepSpec(step_type=path, request=to_request(row), stage=stage)
