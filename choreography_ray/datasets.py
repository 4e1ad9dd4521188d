"""A job's outputs as a Ray Dataset (`jobs.outputs_dataset`): a datasource whose read tasks
each stream a range of the job's step ids straight from storage, a block per page, so no process
holds every output (docs/outputs.md). Imported only when a Dataset is asked for: it loads Ray
Data.

When the Dataset is planned, storage is asked for the first and last step ids with an output
(`output_span`: two look-ups, whatever the job's size). There is a read task per
`ROWS_PER_TASK` ids between, at most `MAX_TASKS` and the parallelism Ray Data asks for, each an
equal range: step ids are the plan's positions, zero-padded to one width per job, so the ranges
are even; ids of another form are read by one task. When Ray Data plans one task to learn the
Dataset's size, storage counts the outputs too (`count_outputs`, one query), so `count()`
answers from that count and reads no output, as it does from a Parquet file's footer. A block
is built column by column: the outputs' JSON texts are parsed by Arrow's own JSON reader into
one struct column, never into Python objects.
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

from choreography_ray.storage import Storage, StoredOutput, open_storage, output_pages

#: Outputs per block (one query each).
PAGE = 10_000
#: Step ids a read task covers at least (fewer tasks for a smaller job: each costs a process
#: turn and a storage connection).
ROWS_PER_TASK = 50_000
#: Read tasks at most.
MAX_TASKS = 64

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
    """A Ray Data datasource over a job's outputs: a read task per range of step ids."""

    def __init__(self, storage_url: str, namespace: str, job_id: str, stage: int | None) -> None:
        self._where = (storage_url, namespace, job_id, stage)

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_name(self) -> str:
        return "ChoreographyOutputs"

    def get_read_tasks(self, parallelism: int, *args: Any, **kwargs: Any) -> list[Any]:
        storage_url, namespace, job_id, stage = self._where
        span, count = _run(_plan(_reading(storage_url, namespace), job_id, stage, parallelism))
        numeric = span is not None and all(end.isdigit() for end in span)
        ids = int(span[1]) - int(span[0]) + 1 if span is not None and numeric else 0
        tasks = max(1, min(parallelism, MAX_TASKS, math.ceil(ids / ROWS_PER_TASK)))
        return [
            ReadTask(
                functools.partial(_read_range, *self._where, after, until),
                # One task (as Ray Data plans to learn a Dataset's size): its rows, counted.
                BlockMetadata(num_rows=count, size_bytes=None, exec_stats=None, input_files=None),
            )
            for after, until in ranges(span, tasks)
        ]


def ranges(span: tuple[str, str] | None, tasks: int) -> list[tuple[str | None, str | None]]:
    """(after, until] bounds of step ids splitting `span` (the first and last ids) in `tasks`
    equal shares: ids of digits of one width (a plan's), else one range of everything."""
    if span is None or not all(end.isdigit() and len(end) == len(span[0]) for end in span):
        return [(None, None)]
    first, last = span
    low, high, width = int(first), int(last), len(first)
    cuts = sorted({low + (high - low + 1) * i // tasks for i in range(1, tasks)} - {low})
    ids = [str(cut - 1).zfill(width) for cut in cuts]
    return list(zip([None, *ids], [*ids, None], strict=True))


async def _plan(
    storage: Storage, job_id: str, stage: int | None, parallelism: int
) -> tuple[tuple[str, str] | None, int | None]:
    """The first and last step ids with an output; with a parallelism of 1, how many outputs
    there are too (one counting query: `count()` answers from it, reading no output)."""
    try:
        span = await storage.output_span(job_id, stage)
        count = await storage.count_outputs(job_id, stage) if parallelism == 1 else None
        return span, count
    finally:
        await storage.close()


def _run(work: Coroutine[Any, Any, _T]) -> _T:
    """`work` run to its end on a loop of its own: Ray Data may plan on a thread that runs one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()


def _read_range(
    storage_url: str,
    namespace: str,
    job_id: str,
    stage: int | None,
    after: str | None,
    until: str | None,
) -> Iterator[pyarrow.Table]:
    """A read task: the outputs of a range of step ids, a block per page, from storage."""
    loop = asyncio.new_event_loop()
    storage = _reading(storage_url, namespace)
    pages = output_pages(storage, job_id, stage=stage, after=after, until=until, page=PAGE)
    try:
        while (found := loop.run_until_complete(anext(pages, None))) is not None:
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
