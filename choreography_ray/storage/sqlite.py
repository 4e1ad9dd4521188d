"""The SQLite provider: the embedded default for one machine, `sqlite:///path.db`.

`sqlite:///jobs.db` is relative to the working directory, `sqlite:////var/lib/jobs.db` absolute;
missing parent directories are created. The file is in WAL mode with `synchronous=NORMAL` and a
30 s busy timeout, so several processes of one machine can write it at once: every write is one
`BEGIN IMMEDIATE` transaction, which takes the write lock up front and waits for it rather than
failing halfway. sqlite3 calls block, so each instance runs them on one dedicated worker thread
that owns the connection (opened on first use); the coroutines await that thread.

The tables, what opening a file creates and how a read-only storage reads a file of an older
release: `storage/sqlite_schema.py`; the step outputs' statements: `storage/sqlite_outputs.py`;
the reads of step records by page: `storage/sqlite_pages.py`.

Bulk writes are one transaction and one `executemany` each, all or nothing. A lease renewal is
an `UPDATE ... WHERE status = 'Running' AND attempt = ?`, so it never undoes an outcome stored
meanwhile; it returns the rows the `executemany` changed. A status change is appended in SQL
(`json_insert(status_changes, '$[#]', ...)`), never read, grown and rewritten, unless it is the
last one already (the same update written again after its acknowledgement was lost).
Rows are serialized with plain tuples and `pydantic_core.to_json`, not a model dump per row. A
row that does not parse raises `CorruptRecordError`; a lock still held after the busy timeout
raises `StorageUnavailableError`, any other sqlite3 error `StorageError`.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from itertools import repeat
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from pydantic import BaseModel, ValidationError
from pydantic_core import to_json

from choreography_ray.errors import (
    ConcurrencyError,
    CorruptRecordError,
    DuplicateRecordError,
    StorageError,
    StorageUnavailableError,
)
from choreography_ray.failures import FailureCluster
from choreography_ray.model import (
    SCHEMA_VERSION,
    JobsManagerKey,
    JobState,
    StepState,
    check_schema_version,
    step_key,
    utcnow,
)
from choreography_ray.status import REHYDRATED_JOB, JobStatus, StepStatus
from choreography_ray.storage import (
    CountedKind,
    JobCounts,
    JobCursor,
    JobFilter,
    LeaseRenewal,
    PlannedStep,
    StatusCounts,
    StepUpdate,
    StoredOutput,
    StoredStart,
    chunks,
    utc_text,
)
from choreography_ray.storage import sqlite_outputs as outputs_sql
from choreography_ray.storage import sqlite_pages as pages
from choreography_ray.storage.sqlite_schema import ADDED_COLUMNS, TABLES, lay_out, shadow_missing

_T = TypeVar("_T")
_M = TypeVar("_M", bound=BaseModel)

#: How long a write waits for another connection's lock, in milliseconds.
BUSY_TIMEOUT_MS = 30_000
#: Page cache per connection, in KiB.
CACHE_SIZE_KIB = 32_768
#: The page size of a file this storage creates (SQLite's default is 4 KiB; a file keeps the
#: size it was made with). A step's record is about 200 bytes and a plan, its RUNNING marks and
#: its deletes go in runs of consecutive records: at 16 KiB, 100,000 records insert 18 % and
#: delete 13 % faster (fewer pages and B-tree levels to walk, fewer WAL frames), while a small
#: commit (a job's save) takes about 40 us against 23.
PAGE_SIZE = 16_384
#: WAL bytes after which a commit checkpoints, as pages of the file's size (SQLite's default
#: is 1,000 pages, 4 MiB). A plan's 50,000-record insert fills about 16 MiB: at the default
#: nearly every plan insert and many group commits also copied pages to the database file; at
#: about 40 MiB a page written again before the next checkpoint is copied once (100,000
#: records: insert -15 %, deletes -5 %, measured with the runtime's batches).
WAL_AUTOCHECKPOINT_BYTES = 10_000 * 4_096

_PREFIX = "sqlite:///"
_KIND_NO = {CountedKind.COMPLETED: 0, CountedKind.STOPPED: 1}

_JOB_COLUMNS = (
    "id", "scope", "namespace", "type", "status", "stage", "progress", "request",
    "status_changes", "has_plan", "stop_finalized", "records_counted_steps", "error", "created",
    "version", "schema_version", "resume_after", "held", "priority", "fairness_key",
)  # fmt: skip
#: What a save writes: the columns read back, and `status_since`, derived for the cleanup index.
_JOB_WRITTEN = (*_JOB_COLUMNS, "status_since")
_JSON_COLUMNS = frozenset({"progress", "request", "status_changes", "lease", "resume_after"})
_JOB_FIELDS = ", ".join(_JOB_COLUMNS)
_JOB_SELECT = f"SELECT {_JOB_FIELDS} FROM jobs"
_JOB_NO = outputs_sql.JOB_NO
_JOB_KIND = f"job_no = {_JOB_NO} AND kind = ?"
#: `REHYDRATED_JOB` as SQL literals: one range of the (scope, namespace, status) index each.
_UNSETTLED = ", ".join(f"'{status.value}'" for status in sorted(REHYDRATED_JOB))
_STEP_STATUSES = frozenset(StepStatus)
_JOB_STATUSES = frozenset(JobStatus)
_INSERT_STEP = f"INSERT INTO job_steps VALUES ({', '.join('?' * len(pages.STEP_COLUMNS))})"
#: A chunk of a plan in one statement: ?3 is the chunk as a JSON array of `PlannedStep`s
#: (step_id, type, stage, request as JSON text), ?1 the job, ?2 now; each step SCHEDULED at
#: attempt 0, no lease, prepared, no history yet. SQLite reads the array in C, without the GIL:
#: about a fifth faster than an `executemany` of its rows (100,000 records: 0.38-0.43 s,
#: building the JSON included, against 0.48-0.54 s), and another thread runs meanwhile.
_INSERT_PLAN = f"""INSERT INTO job_steps ({", ".join(pages.STEP_COLUMNS)})
    SELECT ?1, json_extract(value, '$[0]'), json_extract(value, '$[1]'),
           json_extract(value, '$[2]'), '{StepStatus.SCHEDULED.value}', 0, NULL, 1,
           json_extract(value, '$[3]'), '[]', ?2, {SCHEMA_VERSION}, NULL
    FROM json_each(?3)"""
#: One statement for a batch: SQLite reads the ids in C, without taking the GIL back per row
#: (an `executemany` does, and waits for it whenever the event loop's thread is busy).
_DELETE_STEPS = """DELETE FROM job_steps
    WHERE job_id = ?1 AND step_id IN (SELECT value FROM json_each(?2))"""
_UPDATE_STEP = """UPDATE job_steps SET status = ?1, attempt = ?2, lease = ?3, updated = ?4,
    status_changes = CASE WHEN ?5 IS NULL OR json_extract(status_changes, '$[#-1]') = json(?5)
                          THEN status_changes
                          ELSE json_insert(status_changes, '$[#]', json(?5)) END,
    failure_signature = ?8
    WHERE job_id = ?6 AND step_id = ?7 AND attempt <= ?2"""
_SIGNATURE_INDEX = "job_steps_job_signature"
#: A job's failures by signature, through the signature index (partial: failed steps only),
#: most frequent first; the example is the cluster's first step by id, its record read by key.
_CLUSTERS = """SELECT g.*, (SELECT status_changes FROM job_steps AS e
                     WHERE e.job_id = ?1 AND e.step_id = g.example)
    FROM (SELECT failure_signature, COUNT(*) AS n, MIN(updated), MAX(updated),
                 MIN(step_id) AS example
          FROM job_steps{hint} WHERE job_id = ?1 AND failure_signature IS NOT NULL
          GROUP BY failure_signature) AS g
    ORDER BY g.n DESC, g.failure_signature"""
_RENEW_LEASE = """UPDATE job_steps SET lease = ?1, updated = ?2
    WHERE job_id = ?3 AND step_id = ?4 AND status = ?5 AND attempt = ?6"""


class SqliteStorage:
    def __init__(self, url: str, read_only: bool = False) -> None:
        path = url[len(_PREFIX) :] if url.startswith(_PREFIX) else ""
        if not path or path.startswith(":memory:") or "?" in path:
            raise ValueError(f"not a SQLite file URL: {url!r}; use sqlite:///path/to/jobs.db")
        self.url = url
        self.path = Path(path)
        #: Opened for reading only: nothing is created, not even the file (module docstring).
        self.read_only = read_only
        self._connection: sqlite3.Connection | None = None
        self._closed = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="choreography-sqlite")

    def __reduce__(self) -> tuple[type[SqliteStorage], tuple[str, bool]]:
        return SqliteStorage, (self.url, self.read_only)

    # jobs
    async def create_job(self, job: JobState) -> JobState:
        stored = _without_counted(job, version=1)
        await self._write(lambda c: _insert_job(c, stored))
        return stored

    async def get_job(self, job_id: str) -> JobState | None:
        rows = await self._query(f"{_JOB_SELECT} WHERE id = ?", job_id)
        return _job(rows[0]) if rows else None

    async def save_job(self, job: JobState) -> JobState:
        stored = _without_counted(job, version=job.version + 1)
        await self._write(lambda c: _update_job(c, stored, job.version))
        return stored

    async def list_jobs(
        self, scope: str, namespace: str, status: JobStatus | None = None
    ) -> list[JobState]:
        where, args = "scope = ? AND namespace = ?", [scope, namespace]
        if status is not None:
            where, args = f"{where} AND status = ?", [*args, status]
        sql = f"{_JOB_SELECT} WHERE {where} ORDER BY rowid"
        return [_job(row) for row in await self._query(sql, *args)]

    async def get_jobs_excluding_finalized_stops(
        self, scope: str, namespace: str
    ) -> list[JobState]:
        sql = f"""{_JOB_SELECT} WHERE scope = ? AND namespace = ?
            AND NOT (status = ? AND stop_finalized = 1) ORDER BY created, rowid"""
        return [_job(row) for row in await self._query(sql, scope, namespace, JobStatus.STOPPED)]

    async def list_unsettled_jobs(self, scope: str, namespace: str) -> list[JobState]:
        sql = f"""{_JOB_SELECT} WHERE scope = ? AND namespace = ? AND status IN ({_UNSETTLED})
            AND NOT (status = ? AND stop_finalized = 1) ORDER BY created, rowid"""
        return [_job(row) for row in await self._query(sql, scope, namespace, JobStatus.STOPPED)]

    async def find_jobs(
        self,
        where: JobFilter,
        *,
        before: JobCursor | None = None,
        after: JobCursor | None = None,
        limit: int = 50,
    ) -> list[JobState]:
        conditions, args = _job_conditions(where)
        order = "DESC"
        if before is not None:
            conditions.append("(created, id) < (?, ?)")
            args += [_instant(before.created), before.job_id]
        if after is not None:
            conditions.append("(created, id) > (?, ?)")
            args += [_instant(after.created), after.job_id]
            order = "ASC"
        sql = f"""{_JOB_SELECT} WHERE {" AND ".join(conditions)}
            ORDER BY created {order}, id {order} LIMIT ?"""
        jobs = [_job(row) for row in await self._query(sql, *args, limit)]
        return jobs[::-1] if order == "ASC" else jobs

    async def count_jobs_by_type_and_status(self, where: JobFilter) -> JobCounts:
        conditions, args = _job_conditions(where)
        sql = f"""SELECT type, status, COUNT(*) FROM jobs WHERE {" AND ".join(conditions)}
            GROUP BY type, status"""
        counts: JobCounts = {}
        for job_type, status, count in await self._query(sql, *args):
            if status not in _JOB_STATUSES:
                raise CorruptRecordError("jobs", "*", f"unknown status {status!r}")
            counts[job_type, JobStatus(status)] = count
        return counts

    async def list_jobs_for_cleanup(
        self,
        scope: str,
        namespace: str,
        statuses: Collection[JobStatus],
        before: datetime,
        limit: int,
    ) -> list[JobState]:
        wanted = sorted({JobStatus(s).value for s in statuses})
        if not wanted or limit < 1:
            return []
        # One index range per status, each in age order already, merged: a pass costs
        # O(statuses * limit) however many jobs are stored.
        branch = f"""SELECT * FROM (SELECT {_JOB_FIELDS}, status_since AS since FROM jobs
            WHERE scope = ? AND namespace = ? AND status = ? AND status_since < ?
            ORDER BY status_since, id LIMIT ?)"""
        sql = " UNION ALL ".join([branch] * len(wanted)) + " ORDER BY since, id LIMIT ?"
        cutoff = utc_text(before)
        args = [a for status in wanted for a in (scope, namespace, status, cutoff, limit)]
        return [_job(row[:-1]) for row in await self._query(sql, *args, limit)]

    async def remove_job(self, job_id: str) -> None:
        await self._execute("DELETE FROM jobs WHERE id = ?", job_id)

    # steps
    async def insert_steps(self, steps: Sequence[StepState]) -> None:
        if steps:
            await self._write(lambda c: _insert_steps(c, steps))

    async def insert_plan(self, job_id: str, steps: Sequence[PlannedStep]) -> None:
        if not steps:
            return
        if self.read_only:
            raise StorageError(f"SQLite storage {self.url} is opened read-only")
        # Serialized here, and written as one statement in autocommit (atomic on its own): the
        # connection's thread takes the GIL back once, not for each of a transaction's
        # statements, each a wait of up to the switch interval while the caller's thread
        # reads the plan's next piece.
        now: str = json.loads(to_json(utcnow()))
        chunk = json.dumps(steps, ensure_ascii=False, check_circular=False)
        await self._run(lambda c: _insert_plan(c, job_id, now, chunk, steps))

    async def get_step(self, job_id: str, step_id: str) -> StepState | None:
        rows = await self._query(
            f"{pages.STEP_SELECT} WHERE job_id = ? AND step_id = ?", job_id, step_id
        )
        return _step(rows[0]) if rows else None

    async def get_steps(self, job_id: str, step_ids: Collection[str]) -> dict[str, StepState]:
        found: dict[str, StepState] = {}
        for chunk in chunks(step_ids):
            for row in await self._query(pages.steps_by_id(len(chunk)), job_id, *chunk):
                step = _step(row)
                found[step.step_id] = step
        return found

    async def list_steps(
        self,
        job_id: str,
        *,
        statuses: Collection[StepStatus] | None = None,
        stage: int | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> list[StepState]:
        # A read-only file of an older release may lack the index (or read job_steps through a
        # shadow view): the planner then chooses, slower on a large job but right.
        read = pages.PageRead(job_id, statuses, stage, after, limit, not self.read_only)
        return [_step(row) for row in await self._run(read.rows)]

    async def list_starts(
        self,
        job_id: str,
        *,
        statuses: Collection[StepStatus] | None = None,
        stage: int | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> list[StoredStart]:
        if statuses is not None and StepStatus.SCHEDULED in statuses:
            sql, args = pages.plan_page(job_id, statuses, stage, after, limit)
            rows = await self._query(sql, *args)
        else:
            read = pages.PageRead(job_id, statuses, stage, after, limit, not self.read_only, True)
            rows = await self._run(read.rows)
        return [_start(row) for row in rows]

    async def list_failed(
        self, job_id: str, signature: str, *, after: str | None = None, limit: int = 1000
    ) -> list[StepState]:
        where = "job_id = ? AND failure_signature = ?"
        args: list[object] = [job_id, signature]
        if after is not None:
            where, args = f"{where} AND step_id > ?", [*args, after]
        hint = self._hint(_SIGNATURE_INDEX)
        sql = f"{pages.STEP_SELECT}{hint} WHERE {where} ORDER BY step_id LIMIT ?"
        return [_step(row) for row in await self._query(sql, *args, limit)]

    async def failure_clusters(self, job_id: str) -> list[FailureCluster]:
        sql = _CLUSTERS.format(hint=self._hint(_SIGNATURE_INDEX))
        return [_cluster(job_id, row) for row in await self._query(sql, job_id)]

    def _hint(self, index: str) -> str:
        """Names the index, but on a read-only file, which may be of a release without it."""
        return "" if self.read_only else f" INDEXED BY {index}"

    async def update_steps(self, updates: Sequence[StepUpdate]) -> None:
        if not updates:
            return
        rows, ended = _update_rows(updates), outputs_sql.ended_rows(updates)

        def write(c: sqlite3.Connection) -> None:
            c.executemany(_UPDATE_STEP, rows)
            if ended:
                c.executemany(outputs_sql.DELETE_ENDED, ended)

        await self._write(write)

    async def renew_leases(self, renewals: Sequence[LeaseRenewal]) -> int:
        if not renewals:
            return 0
        rows = _renewal_rows(renewals)
        renewed: list[int] = []
        # The count is read in the connection's thread, where the cursor is dropped too.
        await self._write(lambda c: renewed.append(c.executemany(_RENEW_LEASE, rows).rowcount))
        return sum(renewed)

    async def delete_steps(
        self, job_id: str, step_ids: Collection[str], outputs: Sequence[StoredOutput] = ()
    ) -> None:
        ids = json.dumps(list(step_ids), ensure_ascii=False, check_circular=False)

        def write(c: sqlite3.Connection) -> None:
            outputs_sql.put(c, outputs)
            if step_ids:
                c.execute(_DELETE_STEPS, (job_id, ids))

        if step_ids or outputs:
            await self._write(write)

    async def has_steps(self, job_id: str, stage: int, statuses: Collection[StepStatus]) -> bool:
        query = pages.any_step(job_id, stage, statuses, named=not self.read_only)
        return query is not None and bool(await self._query(*query))

    async def count_by_status(self, job_id: str) -> StatusCounts:
        sql = "SELECT stage, status, COUNT(*) FROM job_steps WHERE job_id = ? GROUP BY 1, 2"
        counts: StatusCounts = {}
        for stage, status, count in await self._query(sql, job_id):
            if status not in _STEP_STATUSES:
                reason = f"unknown status {status!r}"
                raise CorruptRecordError("job_steps", f"{job_id}/*", reason)
            counts[stage, StepStatus(status)] = count
        return counts

    async def remove_job_steps(self, job_id: str) -> None:
        await self._execute("DELETE FROM job_steps WHERE job_id = ?", job_id)

    # counted steps
    async def add_counted(self, job_id: str, kind: CountedKind, step_ids: Collection[str]) -> None:
        if step_ids:
            await self._write(lambda c: _add_counted(c, job_id, _KIND_NO[kind], step_ids))

    async def remove_counted(self, job_id: str, kind: CountedKind, step_id: str) -> None:
        sql = f"DELETE FROM job_counted_steps WHERE {_JOB_KIND} AND step_id = ?"
        await self._execute(sql, job_id, _KIND_NO[kind], step_id)

    async def list_counted(self, job_id: str, kind: CountedKind) -> list[str]:
        sql = f"SELECT step_id FROM job_counted_steps WHERE {_JOB_KIND} ORDER BY step_id"
        return [step_id for (step_id,) in await self._query(sql, job_id, _KIND_NO[kind])]

    async def count_counted(self, job_id: str, kind: CountedKind) -> int:
        sql = f"SELECT COUNT(*) FROM job_counted_steps WHERE {_JOB_KIND}"
        return int((await self._query(sql, job_id, _KIND_NO[kind]))[0][0])

    async def remove_job_counted(self, job_id: str) -> None:
        def remove(c: sqlite3.Connection) -> None:
            c.execute(f"DELETE FROM job_counted_steps WHERE job_no = {_JOB_NO}", (job_id,))
            # Its number too, once its outputs are gone (`remove_job_outputs` likewise).
            sql = """DELETE FROM job_numbers WHERE job_id = ? AND NOT EXISTS
                (SELECT 1 FROM job_outputs o WHERE o.job_no = job_numbers.job_no)"""
            c.execute(sql, (job_id,))

        await self._write(remove)

    # step outputs (`storage/sqlite_outputs.py`)
    async def put_outputs(self, outputs: Sequence[StoredOutput]) -> None:
        if outputs:
            await self._write(lambda c: outputs_sql.put(c, outputs))

    async def delete_outputs(self, job_id: str, steps: Sequence[tuple[str, int]]) -> None:
        if steps:
            rows = outputs_sql.delete_rows(job_id, steps)
            await self._write(lambda c: c.executemany(outputs_sql.DELETE, rows))

    async def list_outputs(
        self,
        job_id: str,
        *,
        stage: int | None = None,
        after: str | None = None,
        until: str | None = None,
        limit: int = 1000,
    ) -> list[StoredOutput]:
        sql, args = outputs_sql.page(job_id, stage, after, until, limit)
        return [outputs_sql.stored(job_id, row) for row in await self._query(sql, *args)]

    async def count_outputs(self, job_id: str, stage: int | None = None) -> int:
        sql, args = outputs_sql.count(job_id, stage)
        return int((await self._query(sql, *args))[0][0])

    async def output_span(self, job_id: str, stage: int | None = None) -> tuple[str, str] | None:
        sql, args = outputs_sql.span(job_id, stage)
        first, last = (await self._query(sql, *args))[0]
        return None if first is None else (first, last)

    async def remove_job_outputs(self, job_id: str) -> None:
        def remove(c: sqlite3.Connection) -> None:
            for sql in outputs_sql.REMOVE_JOB:
                c.execute(sql, (job_id,))

        await self._write(remove)

    # recovery key catalog
    async def add_manager_key(self, key: JobsManagerKey) -> None:
        sql = "INSERT OR IGNORE INTO jobs_manager_keys (scope, namespace) VALUES (?, ?)"
        await self._execute(sql, key.scope, key.namespace)

    async def list_manager_keys(self) -> list[JobsManagerKey]:
        rows = await self._query("SELECT scope, namespace FROM jobs_manager_keys ORDER BY 1, 2")
        return [JobsManagerKey(scope=scope, namespace=namespace) for scope, namespace in rows]

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await asyncio.get_running_loop().run_in_executor(self._executor, self._disconnect)
            self._executor.shutdown(wait=False)

    # the worker thread
    async def _run(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        if self._closed:
            raise StorageError(f"SQLite storage {self.url} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, work)

    async def _query(self, sql: str, *args: object) -> list[Any]:
        return await self._run(lambda c: c.execute(sql, args).fetchall())

    async def _write(self, work: Callable[[sqlite3.Connection], object]) -> None:
        if self.read_only:
            raise StorageError(f"SQLite storage {self.url} is opened read-only")
        await self._run(lambda c: _transaction(c, work))

    async def _execute(self, sql: str, *args: object) -> None:
        await self._write(lambda c: c.execute(sql, args))

    def _call(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        if self._connection is None:
            self._connection = self._connect()
        try:
            return work(self._connection)
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise StorageUnavailableError(f"SQLite database {self.url} is busy: {exc}") from exc
            raise StorageError(f"SQLite database {self.url}: {exc}") from exc
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite database {self.url}: {exc}") from exc

    def _connect(self) -> sqlite3.Connection:
        if self.read_only:
            return self._connect_read_only()
        connection: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None
            )
            connection.execute(f"PRAGMA page_size = {PAGE_SIZE}")  # a new file's only
            (mode,) = connection.execute("PRAGMA journal_mode = WAL").fetchone()
            if mode != "wal":
                raise sqlite3.OperationalError(f"journal mode is {mode!r}, not WAL")
            connection.execute("PRAGMA synchronous = NORMAL")
            connection.execute(f"PRAGMA cache_size = -{CACHE_SIZE_KIB}")
            (page,) = connection.execute("PRAGMA page_size").fetchone()
            connection.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_BYTES // page}")
            _transaction(connection, lay_out)
        except (OSError, sqlite3.Error) as exc:
            if connection is not None:
                connection.close()
            raise StorageUnavailableError(
                f"cannot open SQLite database {self.url} (file {self.path.absolute()}): {exc}"
            ) from exc
        return connection

    def _connect_read_only(self) -> sqlite3.Connection:
        if not self.path.is_file():
            raise StorageUnavailableError(
                f"no SQLite database at {self.path.absolute()} ({self.url}); nothing was created"
            )
        connection: sqlite3.Connection | None = None
        try:
            uri = f"file:{quote(str(self.path.absolute()))}?mode=ro"
            connection = sqlite3.connect(
                uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None
            )
            shadow_missing(connection, TABLES, ADDED_COLUMNS)
        except sqlite3.Error as exc:
            if connection is not None:
                connection.close()
            raise StorageUnavailableError(
                f"cannot open SQLite database {self.url} (file {self.path.absolute()}) "
                f"to read it: {exc}"
            ) from exc
        return connection

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _transaction(
    connection: sqlite3.Connection, work: Callable[[sqlite3.Connection], object]
) -> None:
    # The work's result (often a cursor) is dropped here, in the connection's thread: a cursor
    # finalized on another thread resets its statement concurrently, which SQLite calls misuse.
    connection.execute("BEGIN IMMEDIATE")
    try:
        work(connection)
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise


def _without_counted(job: JobState, *, version: int) -> JobState:
    return job.model_copy(
        update={"version": version, "completed_steps_counted": (), "stopped_steps_counted": ()}
    )


def _instant(at: datetime) -> str:
    """A time as the `created` column holds it, so that the text sorts as the instants do."""
    return (at if at.tzinfo is None else at.astimezone(UTC)).isoformat(timespec="microseconds")


def _job_conditions(where: JobFilter) -> tuple[list[str], list[object]]:
    conditions, args = ["1 = 1"], list[object]()
    for column, value in (("scope", where.scope), ("namespace", where.namespace),
                          ("type", where.type)):  # fmt: skip
        if value is not None:
            conditions.append(f"{column} = ?")
            args.append(value)
    if where.statuses is not None:
        conditions.append(f"status IN ({', '.join('?' * len(where.statuses)) or 'NULL'})")
        args += sorted(where.statuses)
    if where.created_since is not None:
        conditions.append("created >= ?")
        args.append(_instant(where.created_since))
    return conditions, args


def _job_row(job: JobState) -> tuple[Any, ...]:
    return (
        job.id, job.scope, job.namespace, job.type, job.status, job.stage,
        job.progress.model_dump_json(exclude_computed_fields=True), to_json(job.request).decode(),
        to_json(job.status_changes).decode(), job.has_plan, job.stop_finalized,
        job.records_counted_steps, job.error, _instant(job.created),
        job.version, SCHEMA_VERSION,
        None if job.resume_after is None else job.resume_after.model_dump_json(), job.held,
        job.priority, job.fairness_key, utc_text(job.status_since),
    )  # fmt: skip


def _insert_job(connection: sqlite3.Connection, job: JobState) -> None:
    marks = ", ".join("?" * len(_JOB_WRITTEN))
    try:
        connection.execute(
            f"INSERT INTO jobs ({', '.join(_JOB_WRITTEN)}) VALUES ({marks})", _job_row(job)
        )
    except sqlite3.IntegrityError:
        raise DuplicateRecordError(f"job {job.id!r} exists already") from None


def _update_job(connection: sqlite3.Connection, job: JobState, expected_version: int) -> None:
    assignments = ", ".join(f"{column} = ?" for column in _JOB_WRITTEN[1:])
    sql = f"UPDATE jobs SET {assignments} WHERE id = ? AND version = ?"
    if connection.execute(sql, (*_job_row(job)[1:], job.id, expected_version)).rowcount == 0:
        row = connection.execute("SELECT version FROM jobs WHERE id = ?", (job.id,)).fetchone()
        found = "no record" if row is None else f"version {row[0]}"
        raise ConcurrencyError(f"job {job.id!r} is at {found}, not {expected_version}")


def _insert_steps(connection: sqlite3.Connection, steps: Sequence[StepState]) -> None:
    # One serializer call for every timestamp: datetime.isoformat per row costs more.
    updated: list[str] = json.loads(to_json([s.updated for s in steps]))
    rows = [
        (
            s.job_id, s.step_id, s.type, s.stage, s.status, s.attempt,
            None if s.lease is None else to_json(s.lease).decode(), s.is_prepared,
            to_json(s.request).decode() if s.request else "{}",
            to_json(s.status_changes).decode() if s.status_changes else "[]",
            when, SCHEMA_VERSION, s.failure_signature,
        )
        for s, when in zip(steps, updated, strict=True)
    ]  # fmt: skip
    _insert_step_rows(
        connection,
        lambda c: c.executemany(_INSERT_STEP, rows),
        lambda: [(row[0], row[1]) for row in rows],
    )


def _insert_plan(
    connection: sqlite3.Connection,
    job_id: str,
    now: str,
    chunk: str,
    steps: Sequence[PlannedStep],
) -> None:
    """One statement, in autocommit: all the rows or none."""
    try:
        connection.execute(_INSERT_PLAN, (job_id, now, chunk))
    except sqlite3.IntegrityError:
        duplicate = _duplicate(connection, [(job_id, s.step_id) for s in steps])
        raise DuplicateRecordError(f"step {duplicate!r} exists already") from None


def _insert_step_rows(
    connection: sqlite3.Connection,
    insert: Callable[[sqlite3.Connection], object],
    keys: Callable[[], list[tuple[str, str]]],
) -> None:
    """All the rows or none: a duplicate id (`keys`: every row's job and step id) names the
    step and writes nothing."""
    connection.execute("SAVEPOINT plan")
    try:
        insert(connection)
    except sqlite3.IntegrityError:
        connection.execute("ROLLBACK TO plan")
        duplicate = _duplicate(connection, keys())
        raise DuplicateRecordError(f"step {duplicate!r} exists already") from None


def _duplicate(connection: sqlite3.Connection, keys: Sequence[tuple[str, str]]) -> str:
    """The first step of a refused batch that is stored already or repeated (the error path)."""
    seen: set[tuple[str, str]] = set()
    sql = "SELECT 1 FROM job_steps WHERE job_id = ? AND step_id = ?"
    for key in keys:
        if key in seen or connection.execute(sql, key).fetchone():
            return step_key(*key)
        seen.add(key)
    return "?"


def _update_rows(updates: Sequence[StepUpdate]) -> list[tuple[Any, ...]]:
    now = utcnow().isoformat()
    # A batch shares its lease and status-change objects: each is serialized once.
    texts: dict[int, str | None] = {id(None): None}

    def text(value: object) -> str | None:
        key = id(value)
        if key not in texts:
            texts[key] = to_json(value).decode()
        return texts[key]

    return [
        (
            u.status.value,
            u.attempt,
            text(u.lease),
            now,
            text(u.change),
            u.job_id,
            u.step_id,
            u.failure_signature,
        )
        for u in updates
    ]


def _renewal_rows(renewals: Sequence[LeaseRenewal]) -> list[tuple[Any, ...]]:
    now = utcnow().isoformat()
    running = StepStatus.RUNNING.value
    # Renewals share their lease object: each is serialized once.
    leases: dict[int, str] = {}
    rows = []
    for r in renewals:
        lease = leases.get(id(r.lease))
        if lease is None:
            lease = leases[id(r.lease)] = to_json(r.lease).decode()
        rows.append((lease, now, r.job_id, r.step_id, running, r.attempt))
    return rows


def _add_counted(
    connection: sqlite3.Connection, job_id: str, kind: int, step_ids: Collection[str]
) -> None:
    job_no = outputs_sql.job_no(connection, job_id)
    sql = "INSERT OR IGNORE INTO job_counted_steps (job_no, kind, step_id) VALUES (?, ?, ?)"
    connection.executemany(sql, zip(repeat(job_no), repeat(kind), step_ids))


def _job(row: Sequence[Any]) -> JobState:
    return _parse(JobState, _JOB_COLUMNS, row, "jobs", row[0])


_STATUS_OF = {status.value: status for status in StepStatus}


def _start(row: Sequence[Any]) -> StoredStart:
    step_id, step_type, stage, status, attempt, request, job_id = row
    known = _STATUS_OF.get(status)
    if known is None:
        raise CorruptRecordError("job_steps", f"{job_id}/{step_id}", f"unknown status {status!r}")
    return StoredStart(step_id, step_type, stage, known, attempt, request)


def _cluster(job_id: str, row: Sequence[Any]) -> FailureCluster:
    signature, count, first, last, step_id, changes = row
    try:
        history = json.loads(changes or "[]")
        messages = history[-1].get("exception_messages") if history else None
        return FailureCluster(
            signature=signature,
            count=count,
            first_seen=first,
            last_seen=last,
            example_step_id=step_id,
            example_message=messages[0] if messages else None,
        )
    except (ValueError, TypeError, AttributeError, ValidationError) as exc:
        raise CorruptRecordError("job_steps", f"{job_id}/{step_id}", str(exc)) from exc


def _step(row: Sequence[Any]) -> StepState:
    return _parse(StepState, pages.STEP_COLUMNS, row, "job_steps", f"{row[0]}/{row[1]}")


def _parse(model: type[_M], columns: Sequence[str], row: Sequence[Any], table: str, key: str) -> _M:
    record: dict[str, Any] = dict(zip(columns, row, strict=True))
    check_schema_version(table, key, record["schema_version"])
    for column in _JSON_COLUMNS.intersection(columns):
        try:
            record[column] = None if record[column] is None else json.loads(record[column])
        except ValueError as exc:
            raise CorruptRecordError(table, key, f"{column}: {exc}") from exc
    try:
        return model.model_validate(record)
    except ValidationError as exc:
        reason = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise CorruptRecordError(table, key, reason) from exc
