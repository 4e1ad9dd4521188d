"""A job's outputs as a Ray Dataset (`jobs.outputs_dataset`): a datasource whose read tasks
each stream some of the job's `OUTPUT_PARTS` parts straight from storage, a block per page, so
no process holds every output (docs/outputs.md). Imported only when a Dataset is asked for:
it loads Ray Data."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Iterator
from typing import Any

import pyarrow
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from choreography_ray.storage import OUTPUT_PARTS, Storage, StoredOutput, open_storage, output_pages

#: Outputs per block (one query each).
PAGE = 10_000


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
        tasks = max(1, min(parallelism, OUTPUT_PARTS))
        where = self._where
        return [
            ReadTask(
                functools.partial(_read_parts, *where, list(range(first, OUTPUT_PARTS, tasks))),
                BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None, input_files=None),
            )
            for first in range(tasks)
        ]


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
                yield pyarrow.Table.from_pylist([_row(stored) for stored in found])
    finally:
        loop.run_until_complete(storage.close())
        loop.close()


def _row(stored: StoredOutput) -> dict[str, Any]:
    return {
        "job_id": stored.job_id,
        "step_id": stored.step_id,
        "stage": stored.stage,
        "attempt": stored.attempt,
        "output": json.loads(stored.output),
    }


def _reading(storage_url: str, namespace: str) -> Storage:
    """Storage for a read task: read-only, or the cluster's memory actor for `memory://`."""
    if storage_url.lower().startswith("memory:"):
        from choreography_ray.runtime.shared_storage import open_shared_storage

        return open_shared_storage(storage_url, namespace)
    return open_storage(storage_url, read_only=True)
