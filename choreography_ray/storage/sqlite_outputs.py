"""The SQLite provider's step outputs: the statements of the `job_outputs` table (laid out in
`storage/sqlite_schema.py`), which `storage/sqlite.py` runs on its worker thread.

A write is one `executemany` in the provider's one write transaction. An output is upserted by
its key, (job_id, part, step_id) (the part is a function of the step id), and only by an attempt
as late as the stored one: an earlier attempt's output written again after a lost acknowledgement
leaves the later one. A delete is likewise conditional on the attempt. A part's page is read
along the primary key (its rows stored together: a Dataset's read task reads them in sequence),
any other page along the (job_id, step_id) index; both are in step-id order, so a page costs its
rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from choreography_ray.storage import StepUpdate, StoredOutput, ended_without_output, output_part

PUT = """INSERT INTO job_outputs (job_id, step_id, stage, attempt, part, output)
    VALUES (?, ?, ?, ?, ?, ?)
    ON CONFLICT (job_id, part, step_id) DO UPDATE SET stage = excluded.stage,
        attempt = excluded.attempt, output = excluded.output
    WHERE excluded.attempt >= job_outputs.attempt"""
DELETE = """DELETE FROM job_outputs
    WHERE job_id = ? AND part = ? AND step_id = ? AND attempt <= ?"""
#: `update_steps`' delete of the outputs of steps it ended failed or stopped, while their
#: record exists (`storage.ended_without_output`).
DELETE_ENDED = f"""{DELETE} AND EXISTS
    (SELECT 1 FROM job_steps s WHERE s.job_id = job_outputs.job_id
        AND s.step_id = job_outputs.step_id)"""
REMOVE_JOB = "DELETE FROM job_outputs WHERE job_id = ?"
_SELECT = "SELECT job_id, step_id, stage, attempt, output FROM job_outputs"


def put_rows(outputs: Sequence[StoredOutput]) -> list[tuple[Any, ...]]:
    return [
        (o.job_id, o.step_id, o.stage, o.attempt, output_part(o.step_id), o.output) for o in outputs
    ]


def delete_rows(job_id: str, steps: Sequence[tuple[str, int]]) -> list[tuple[Any, ...]]:
    return [(job_id, output_part(step_id), step_id, attempt) for step_id, attempt in steps]


def ended_rows(updates: Sequence[StepUpdate]) -> list[tuple[Any, ...]]:
    return [
        row for job_id, ended in ended_without_output(updates).items()
        for row in delete_rows(job_id, ended)
    ]  # fmt: skip


def page(
    job_id: str, stage: int | None, part: int | None, after: str | None, limit: int
) -> tuple[str, list[object]]:
    """The query of a `list_outputs` page and its arguments."""
    where, args = "job_id = ?", list[object]([job_id])
    for condition, value in (("part = ?", part), ("stage = ?", stage), ("step_id > ?", after)):
        if value is not None:
            where, args = f"{where} AND {condition}", [*args, value]
    return f"{_SELECT} WHERE {where} ORDER BY step_id LIMIT ?", [*args, limit]


def count(job_id: str, stage: int | None) -> tuple[str, list[object]]:
    """The query of `count_outputs` and its arguments."""
    if stage is None:
        return "SELECT COUNT(*) FROM job_outputs WHERE job_id = ?", [job_id]
    return "SELECT COUNT(*) FROM job_outputs WHERE job_id = ? AND stage = ?", [job_id, stage]


def stored(row: Sequence[Any]) -> StoredOutput:
    job_id, step_id, stage, attempt, output = row
    return StoredOutput(job_id, step_id, stage, attempt, output)
