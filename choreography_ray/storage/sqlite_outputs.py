"""The SQLite provider's step outputs: the statements of the `job_outputs` table (laid out in
`storage/sqlite_schema.py`), which `storage/sqlite.py` runs on its worker thread.

A job is its number (`job_numbers`, as for the counted steps): 1 to 3 bytes a row and in the
index instead of a 32-character id. A write is one `executemany` in the provider's one write
transaction. An output is upserted by its key, (job_no, step_id), and only by an attempt
as late as the stored one: an earlier attempt's output written again after a lost acknowledgement
leaves the later one. A delete is likewise conditional on the attempt. A page is read along
the key, in step-id order, so it costs its rows.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from itertools import groupby
from typing import Any

from choreography_ray.storage import StepUpdate, StoredOutput, ended_without_output

#: A job's number, by its id.
JOB_NO = "(SELECT job_no FROM job_numbers WHERE job_id = ?)"
PUT = """INSERT INTO job_outputs (job_no, step_id, stage, attempt, output)
    VALUES (?, ?, ?, ?, ?)
    ON CONFLICT (job_no, step_id) DO UPDATE SET stage = excluded.stage,
        attempt = excluded.attempt, output = excluded.output
    WHERE excluded.attempt >= job_outputs.attempt"""
DELETE = f"""DELETE FROM job_outputs
    WHERE job_no = {JOB_NO} AND step_id = ? AND attempt <= ?"""
#: `update_steps`' delete of the outputs of steps it ended failed or stopped, while their
#: record exists (`storage.ended_without_output`).
DELETE_ENDED = f"""{DELETE} AND EXISTS
    (SELECT 1 FROM job_steps s WHERE s.job_id = ? AND s.step_id = job_outputs.step_id)"""
#: A job's outputs, and its number once nothing else uses it (`remove_job_counted` likewise).
REMOVE_JOB = (
    f"DELETE FROM job_outputs WHERE job_no = {JOB_NO}",
    """DELETE FROM job_numbers WHERE job_id = ? AND NOT EXISTS
        (SELECT 1 FROM job_counted_steps c WHERE c.job_no = job_numbers.job_no)""",
)
_SELECT = "SELECT step_id, stage, attempt, output FROM job_outputs"


def job_no(connection: sqlite3.Connection, job_id: str) -> int:
    """The job's number, given it now if it has none."""
    connection.execute("INSERT OR IGNORE INTO job_numbers (job_id) VALUES (?)", (job_id,))
    sql = "SELECT job_no FROM job_numbers WHERE job_id = ?"
    (number,) = connection.execute(sql, (job_id,)).fetchone()
    return int(number)


def put(connection: sqlite3.Connection, outputs: Sequence[StoredOutput]) -> None:
    for job_id, of_job in groupby(sorted(outputs, key=lambda o: o.job_id), lambda o: o.job_id):
        number = job_no(connection, job_id)
        rows = [(number, o.step_id, o.stage, o.attempt, o.output) for o in of_job]
        connection.executemany(PUT, rows)


def delete_rows(job_id: str, steps: Sequence[tuple[str, int]]) -> list[tuple[Any, ...]]:
    return [(job_id, step_id, attempt) for step_id, attempt in steps]


def ended_rows(updates: Sequence[StepUpdate]) -> list[tuple[Any, ...]]:
    return [
        (*row, job_id) for job_id, ended in ended_without_output(updates).items()
        for row in delete_rows(job_id, ended)
    ]  # fmt: skip


def page(
    job_id: str, stage: int | None, after: str | None, until: str | None, limit: int
) -> tuple[str, list[object]]:
    """The query of a `list_outputs` page and its arguments."""
    where, args = f"job_no = {JOB_NO}", list[object]([job_id])
    bounds = (("stage = ?", stage), ("step_id > ?", after), ("step_id <= ?", until))
    for condition, value in bounds:
        if value is not None:
            where, args = f"{where} AND {condition}", [*args, value]
    return f"{_SELECT} WHERE {where} ORDER BY step_id LIMIT ?", [*args, limit]


def count(job_id: str, stage: int | None) -> tuple[str, list[object]]:
    """The query of `count_outputs` and its arguments."""
    sql = f"SELECT COUNT(*) FROM job_outputs WHERE job_no = {JOB_NO}"
    if stage is None:
        return sql, [job_id]
    return f"{sql} AND stage = ?", [job_id, stage]


def span(job_id: str, stage: int | None) -> tuple[str, list[object]]:
    """The query of `output_span`: a look-up at each end of the job's key range."""
    where, args = f"job_no = {JOB_NO}", list[object]([job_id])
    if stage is not None:
        where, args = f"{where} AND stage = ?", [*args, stage]
    end = f"SELECT step_id FROM job_outputs WHERE {where} ORDER BY step_id"
    return f"SELECT ({end} LIMIT 1), ({end} DESC LIMIT 1)", args * 2


def stored(job_id: str, row: Sequence[Any]) -> StoredOutput:
    step_id, stage, attempt, output = row
    return StoredOutput(job_id, step_id, stage, attempt, output)
