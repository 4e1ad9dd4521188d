"""A job's outputs as a Ray Dataset (`jobs.outputs_dataset`): a datasource whose read tasks
each stream some of the job's `OUTPUT_PARTS` parts straight from storage, a block per page, so
no process holds every output (docs/outputs.md). Imported only when a Dataset is asked for:
it loads Ray Data.

A block is built column by column: the outputs' JSON texts are parsed by Arrow's own JSON
reader into one struct column, never into Python objects. There is a read task per
`ROWS_PER_TASK` outputs (counted when the Dataset is planned), at most one per part and at most
the parallelism Ray Data asks for.
"""

from __future__ import annotations

import asyncio
import functools
import io
import math
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pyarrow
import pyarrow.json
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from choreography_ray.storage import OUTPUT_PARTS, Storage, StoredOutput, open_storage, output_pages

#: Outputs per block (one query each).
PAGE = 10_000
#: Outputs a read task reads at least (fewer tasks for a smaller job: each costs a process
#: turn and a storage connection).
ROWS_PER_TASK = 50_000

_T = TypeVar("_T")


def outputs_dataset(
    storage_url: str, namespace: str, job_id: str, stage: int | None = None
) -> ray.data.Dataset:
    """The job's outputs (of one stage) as a Dataset of rows `job_id, step_id, stage, attempt,
    output` (`output`: the step's JSON, parsed), read lazily by parallel read tasks."""
    ds: ray.data.Dataset = ray.data.read_datasource(
        _OutputsSource(storage_url, namespace, job_id, stage)
    )
    return ds


class _OutputsSource(Datasource):
    """A Ray Data datasource over a job's outputs: a read task per group of parts."""

    def __init__(self, storage_url: str, namespace: str, job_id: str, stage: int | None) -> None:
        self._where = (storage_url, namespace, job_id, stage)

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_name(self) -> str:
        return "ChoreographyOutputs"

    def get_read_tasks(self, parallelism: int, *args: Any, **kwargs: Any) -> list[Any]:
        storage_url, namespace, job_id, stage = self._where
        count = _run(_count(_reading(storage_url, namespace), job_id, stage))
        tasks = max(1, min(parallelism, OUTPUT_PARTS, math.ceil(count / ROWS_PER_TASK)))
        return [
            ReadTask(
                functools.partial(
                    _read_parts, *self._where, list(range(first, OUTPUT_PARTS, tasks))
                ),
                BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None, input_files=None),
            )
            for first in range(tasks)
        ]


async def _count(storage: Storage, job_id: str, stage: int | None) -> int:
    try:
        return await storage.count_outputs(job_id, stage)
    finally:
        await storage.close()


def _run(work: Coroutine[Any, Any, _T]) -> _T:
    """`work` run to its end on a loop of its own: Ray Data may plan on a thread that runs one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()


def _read_parts(
    storage_url: str, namespace: str, job_id: str, stage: int | None, parts: list[int]
) -> Iterator[pyarrow.Table]:
    """A read task: the parts' outputs, a block per page, straight from storage."""
    loop = asyncio.new_event_loop()
    storage = _reading(storage_url, namespace)
    try:
        for part in parts:
            pages = output_pages(storage, job_id, stage=stage, part=part, page=PAGE)
            while True:
                try:
                    found = loop.run_until_complete(anext(pages))
                except StopAsyncIteration:
                    break
                yield _block(found)
    finally:
        loop.run_until_complete(storage.close())
        loop.close()


def _block(found: list[StoredOutput]) -> pyarrow.Table:
    texts = "\n".join(stored.output for stored in found).encode()
    outputs = pyarrow.json.read_json(io.BytesIO(texts))
    return pyarrow.table(
        {
            "job_id": [stored.job_id for stored in found],
            "step_id": [stored.step_id for stored in found],
            "stage": [stored.stage for stored in found],
            "attempt": [stored.attempt for stored in found],
            # An output of no fields is an empty struct (Arrow reads no columns from `{}`).
            "output": outputs.to_struct_array()
            if outputs.num_columns
            else pyarrow.array([{}] * len(found)),
        }
    )


def _reading(storage_url: str, namespace: str) -> Storage:
    """Storage for a read task: read-only, or the cluster's memory actor for `memory://`."""
    if storage_url.lower().startswith("memory:"):
        from choreography_ray.runtime.shared_storage import open_shared_storage

        return open_shared_storage(storage_url, namespace)
    return open_storage(storage_url, read_only=True)
