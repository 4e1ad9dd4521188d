"""The SQLite provider's reads of step records by page: the statements `storage/sqlite.py` runs
on its worker thread for `list_steps`, `list_starts`, `has_steps` and `get_steps`.

A page is read along an index already in step-id order, so it costs its rows, not the job: the
primary key's range for every step, or for the SCHEDULED bulk of a plan (`plan_page`); one range
of the (job_id, stage, status) index per stage and status otherwise (`PageRead`).
"""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Collection
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter
from typing import Any

from choreography_ray.status import StepStatus

STEP_COLUMNS = (
    "job_id", "step_id", "type", "stage", "status", "attempt", "lease", "is_prepared", "request",
    "status_changes", "updated", "schema_version", "failure_signature",
)  # fmt: skip
STEP_SELECT = f"SELECT {', '.join(STEP_COLUMNS)} FROM job_steps"
START_SELECT = "SELECT step_id, type, stage, status, attempt, request, job_id FROM job_steps"
#: A job's stages in order, one seek of the (job_id, stage, status) index each.
STAGES = """WITH RECURSIVE s(stage) AS (
        SELECT MIN(stage) FROM job_steps WHERE job_id = ?1
        UNION ALL
        SELECT (SELECT MIN(stage) FROM job_steps WHERE job_id = ?1 AND stage > s.stage) FROM s
        WHERE s.stage IS NOT NULL)
    SELECT stage FROM s WHERE stage IS NOT NULL"""
#: Index ranges merged by one statement, at most (SQLite allows 500 terms of a compound).
RANGES_PER_READ = 250


@dataclass(frozen=True)
class PageRead:
    """A `list_steps` page (`starts`: a `list_starts` page), read on the connection's thread.

    Without statuses: the primary key's range. With statuses: one range of the (job_id, stage,
    status) index per stage and status, each in step-id order already (the index ends in the
    key), merged: a page costs O(stages * statuses * limit) however many steps the job has.
    Across stages, the job's stages are read first (a seek each). There is no (job_id, status)
    index: every plan insert and outcome would write it, for the rare read across stages."""

    job_id: str
    statuses: Collection[StepStatus] | None
    stage: int | None
    after: str | None
    limit: int
    #: The index is named (`INDEXED BY`): without `after`, SQLite's planner (no statistics)
    #: prefers the primary key for its step-id order, and scans every step of the job for a
    #: status that few or none have.
    named: bool = True
    starts: bool = False

    def rows(self, c: sqlite3.Connection) -> list[Any]:
        if self.statuses is None and self.stage is None:
            sql, args = self.where()
            return c.execute(f"{sql} ORDER BY step_id LIMIT ?", [*args, self.limit]).fetchall()
        stages = [self.stage] if self.stage is not None else [
            stage for (stage,) in c.execute(STAGES, (self.job_id,))
        ]  # fmt: skip
        wanted = sorted(set(StepStatus if self.statuses is None else self.statuses))
        ranges = [(stage, status) for stage in stages for status in wanted]
        pages = [
            c.execute(*self.merged(ranges[first : first + RANGES_PER_READ])).fetchall()
            for first in range(0, len(ranges), RANGES_PER_READ)
        ]
        if len(pages) <= 1:
            return pages[0] if pages else []
        at = 0 if self.starts else 1  # the step id's column
        return list(islice(heapq.merge(*pages, key=itemgetter(at)), self.limit))

    def where(self, stage: int | None = None) -> tuple[str, list[Any]]:
        select = START_SELECT if self.starts else STEP_SELECT
        where = "job_id = ?"
        args: list[Any] = [self.job_id]
        if stage is not None:
            where, args = f"{where} AND stage = ?", [*args, stage]
        if self.after is not None:
            where, args = f"{where} AND step_id > ?", [*args, self.after]
        hint = " INDEXED BY job_steps_job_stage_status" if stage is not None and self.named else ""
        return f"{select}{hint} WHERE {where}", args

    def merged(self, ranges: list[tuple[int, StepStatus]]) -> tuple[str, list[object]]:
        """One statement of `ranges` (stage, status), merged in step-id order."""
        branches, args = [], list[object]()
        for stage, status in ranges:
            sql, where_args = self.where(stage)
            branches.append(f"SELECT * FROM ({sql} AND status = ? ORDER BY step_id LIMIT ?)")
            args += [*where_args, status, self.limit]
        return " UNION ALL ".join(branches) + " ORDER BY step_id LIMIT ?", [*args, self.limit]


def any_step(
    job_id: str, stage: int, statuses: Collection[StepStatus], named: bool = True
) -> tuple[str, str, int, *tuple[str, ...]] | None:
    """The query of `has_steps` and its arguments, None when it can match nothing: one seek of
    the (job_id, stage, status) index per status, named as in `PageRead`."""
    wanted = sorted({StepStatus(status).value for status in statuses})
    if not wanted:
        return None
    hint = " INDEXED BY job_steps_job_stage_status" if named else ""
    where = f"job_id = ? AND stage = ? AND status IN ({', '.join('?' * len(wanted))})"
    return f"SELECT 1 FROM job_steps{hint} WHERE {where} LIMIT 1", job_id, stage, *wanted


def steps_by_id(count: int) -> str:
    """The query of `get_steps` for `count` ids: that many seeks of the primary key."""
    return f"{STEP_SELECT} WHERE job_id = ? AND step_id IN ({', '.join('?' * count)})"


def plan_page(
    job_id: str,
    statuses: Collection[StepStatus],
    stage: int | None,
    after: str | None,
    limit: int,
) -> tuple[str, list[object]]:
    """The query of a `list_starts` page that reads SCHEDULED steps, the bulk of a plan not yet
    run: the primary key's range in step-id order, the other conditions checked on each row. A
    page then costs its rows (and the rows it passes over once), where one range per status of
    the status index would look each row up in the table too."""
    marks = ", ".join("?" * len(statuses))
    where = f"job_id = ? AND status IN ({marks})"
    args: list[object] = [job_id, *sorted(statuses)]
    if stage is not None:
        where, args = f"{where} AND stage = ?", [*args, stage]
    if after is not None:
        where, args = f"{where} AND step_id > ?", [*args, after]
    return f"{START_SELECT} WHERE {where} ORDER BY step_id LIMIT ?", [*args, limit]
